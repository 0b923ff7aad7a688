"""Decoding methods. Each is one jit-compiled `lax.while_loop` over a fixed-shape state."""
