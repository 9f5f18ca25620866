"""The two roads to a worker's ServeOptions, as `veloxd serve` parses them: the daemon's one
document (--entry-json) and the flags a person types (derived here from a document's keys, which
are the flags' dests, so neither road has a list of its own to fall out of step)."""

from __future__ import annotations

import json
from typing import Any

from veloxd import protocol
from veloxd.cli import build_parser
from veloxd.serve.options import ServeOptions, build_options, flag_name


def worker_options(*argv: str) -> ServeOptions:
    """ServeOptions from `veloxd serve` flags, parsed and validated as the worker does."""
    return build_options(build_parser().parse_args(["serve", *argv]))


def hand_flags(settings: dict[str, Any]) -> list[str]:
    """The hand-typed flags that say what `settings` (a document's keys) say."""
    argv: list[str] = []
    for key, value in settings.items():
        if value is None:
            continue
        if key == "kv":
            argv += [protocol.KV_JSON_FLAG, json.dumps(value)]
        elif key == "served_name":
            argv += [item for name in value for item in (flag_name(key), name)]
        else:
            argv += [flag_name(key), str(value)]
    return argv
