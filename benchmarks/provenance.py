"""What every figure states: machine, MLX build, device, dtype, BLAS, model and date."""

from __future__ import annotations

import datetime
import hashlib
import os
import platform
from importlib import metadata
from pathlib import Path
from typing import Any


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def mlx_version() -> str:
    """The installed MLX version, read from its distribution as veloxd does (mlx.core has no typed
    `__version__`); "?" when the distribution's metadata is missing."""
    try:
        return metadata.version("mlx")
    except metadata.PackageNotFoundError:
        return "?"


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()[:16]


def provenance(model_path: Path | None = None) -> dict[str, Any]:
    import mlx.core as mx
    import mlx_lm

    info = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": f"{cpu_name()}, {os.cpu_count()} cores ({platform.system()} {platform.machine()})",
        "shared_cores": True,
        "mlx": mlx_version(),
        "mlx_lm": mlx_lm.__version__,
        "device": str(mx.default_device()),
        "blas_preload": os.environ.get("LD_PRELOAD", ""),
        "dtype": "float32 (weights and activations; CPU float16 matmuls are far slower)",
        "python": platform.python_version(),
    }
    if model_path is not None:
        info["model"] = str(model_path)
        weights = Path(model_path) / "model.safetensors"
        if weights.exists():
            info["model_sha256_16"] = file_digest(weights)
    return info


def caption(info: dict[str, Any], runs: str) -> str:
    """One line for under a table or plot."""
    return (
        f"{info['machine']}; MLX {info['mlx']} ({info['device']}), mlx_lm {info['mlx_lm']}; "
        f"{info['dtype'].split(' (')[0]}; {runs}; {info['date']}"
    )
