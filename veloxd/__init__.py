"""veloxd: several MLX models served at once, each with a compressed KV cache, from one YAML file."""

__version__ = "0.1.0"
