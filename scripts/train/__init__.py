"""Helpers of scripts/train_model.py: tokenizer, model, data, safetensors and PNG writers."""
