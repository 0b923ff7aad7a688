"""Files: checkpoint formats (HF safetensors folders, GGUF, llama2.c), loading a model, its tokenizer and
chat template, drafter folders (ours and the authors' PARD format)."""
