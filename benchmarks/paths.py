"""Where the benchmarks read and write: the repository, the results folder, the shipped models."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "benchmarks" / "results"
ASSETS = REPO / "veloxd" / "assets"
