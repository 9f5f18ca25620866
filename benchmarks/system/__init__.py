"""System benchmarks: the daemon, the gateway, the worker's limits, distributed serving."""
