"""Reading checkpoints (HF safetensors, GGUF, lowbit dirs), tokenizers, and writing lowbit model directories."""
