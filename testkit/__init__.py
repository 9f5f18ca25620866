"""Helpers used only by tests and benchmarks (not installed with veloxd)."""
