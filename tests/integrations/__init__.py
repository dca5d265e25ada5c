"""Tests with training frameworks (Lightning, accelerate, transformers, torch.distributed.checkpoint)."""
