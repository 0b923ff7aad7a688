"""The model: architecture config, transformer, attention, masks, KV cache, meshes and the
tensor-parallel layout, int8 weights."""
