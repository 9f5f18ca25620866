"""veloxd.yaml: the typed config, its generated JSON Schema, and a loader whose errors say FILE:LINE:COL.

Imports no mlx, so `veloxd check` and the daemon stay light.
"""

from __future__ import annotations

from veloxd.config.errors import ConfigError, ConfigIssue
from veloxd.config.loader import inspect_config, load_config
from veloxd.config.model import Config, ServerEntry
from veloxd.config.roundtrip import config_from_dict, config_to_dict
from veloxd.config.sections import PromptCache, RestartPolicy, Sampling

__all__ = [
    "Config",
    "ConfigError",
    "ConfigIssue",
    "PromptCache",
    "RestartPolicy",
    "Sampling",
    "ServerEntry",
    "config_from_dict",
    "config_to_dict",
    "inspect_config",
    "load_config",
]
