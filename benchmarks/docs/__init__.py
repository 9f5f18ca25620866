"""Figures into docs: tables, plots and the results pages, from benchmarks/results/*.json."""
