"""mlx_lm's model side: the cache base class, the architecture lookup, the tested version range."""

from __future__ import annotations

from typing import Any, cast

import mlx_lm
from mlx_lm.models.cache import _BaseCache

TESTED_RANGE = ((0, 32, 2), (0, 33, 0))

# mlx_lm's cache base class: its defaults (is_trimmable, state, meta_state) are the cache protocol.
BaseCache = _BaseCache


def model_classes(config: dict[str, Any]) -> tuple[type, type]:
    """(Model, ModelArgs) for a config.json, with model_type remapping exactly as mlx_lm's load()."""
    from mlx_lm.utils import _get_classes

    return cast(tuple[type, type], _get_classes(config))


def check_version() -> None:
    version = tuple(int(p) for p in mlx_lm.__version__.split(".")[:3])
    low, high = TESTED_RANGE
    if not low <= version < high:
        raise RuntimeError(
            f"mlx-lm {mlx_lm.__version__} is outside veloxd's tested range "
            f">={'.'.join(map(str, low))},<{'.'.join(map(str, high))}; install a version in range"
        )
