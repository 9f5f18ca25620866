"""Plain data -> YAML that reads back identically under YAML 1.2 and 1.1 (`veloxd check --effective`)."""

from __future__ import annotations

import re
from typing import Any

import yaml

# Strings that read back as themselves in YAML 1.1 and 1.2 may stay unquoted; everything else is
# double-quoted ("0o17", "1e3" and "yes" would otherwise change type in one of the two).
_PLAIN = re.compile(r"^[A-Za-z_/][A-Za-z0-9_./-]*$")
_RESERVED = {"true", "false", "yes", "no", "on", "off", "y", "n", "null", "nan", "inf"}


class _Dumper(yaml.SafeDumper):
    pass


def _represent_str(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    plain = _PLAIN.match(text) and text.lower() not in _RESERVED
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=None if plain else '"')


_Dumper.add_representer(str, _represent_str)


def dump_yaml(data: Any) -> str:
    """Block-style YAML, keys in their given order."""
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, default_flow_style=False, width=1000)
