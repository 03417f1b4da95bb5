"""The Qwen3.8 model: config, layers, vision tower, weights, tokenizer, chat template."""
