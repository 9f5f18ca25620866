"""veloxd benchmarks: the tiny trained model, KV-cache quality/memory/speed, serving."""
