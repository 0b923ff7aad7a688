"""Checkpoint formats: HF folders (safetensors), llama2.c legacy `.bin`."""
