"""`veloxd serve`: one mlx_lm OpenAI-compatible server with a compressed KV cache."""
