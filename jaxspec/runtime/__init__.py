"""What runs around the decoding loop: the program cache, the memory guard, `auto` and its store."""
