"""KV-cache research: quality, memory and retrieval of every method against fp16 and mlx_lm's caches."""
