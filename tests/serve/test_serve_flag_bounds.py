"""`veloxd serve` bounds each setting as veloxd.yaml's schema bounds the entry key it comes from.

For every worker setting the daemon fills from an entry key (veloxd.config.codec.WORKER_KEYS), the
bounds and choices are read off that key's field metadata (what the schema is generated from):
a value just past a bound is refused naming the flag, the bound itself is accepted. A worker
default that is also a config default is the config's, and `veloxd serve --help` shows it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from tests.support import run_veloxd
from veloxd import protocol
from veloxd.checks import size_text
from veloxd.config.codec import WORKER_KEYS
from veloxd.config.keys import yaml_fields
from veloxd.config.model import ServerEntry
from veloxd.config.sections import Limits
from veloxd.serve.limits import RequestLimits
from veloxd.serve.options import UsageError, check_settings, flag_name


def key_field(path: str) -> dataclasses.Field:
    """The dataclass field of an entry's flat key ("sampling.temp": Sampling's temp)."""
    cls: Any = ServerEntry
    *sections, name = path.split(".")
    for section in sections:
        cls = next(f for f in yaml_fields(cls) if f.name == section).metadata["section"]
    return next(f for f in yaml_fields(cls) if f.name == name)


def edges(schema: dict[str, Any]) -> list[tuple[Any, bool]]:
    """(value, accepted) at each bound of `schema`: the bound, and one step past it."""
    if "enum" in schema:
        return [*((choice, True) for choice in schema["enum"] if choice is not None), ("not-a-choice", False)]
    step = 1 if "integer" in schema["type"] else 0.5
    out: list[tuple[Any, bool]] = []
    if "minimum" in schema:
        out += [(schema["minimum"], True), (schema["minimum"] - step, False)]
    if "exclusiveMinimum" in schema:
        out += [(schema["exclusiveMinimum"], False), (schema["exclusiveMinimum"] + step, True)]
    if "maximum" in schema:
        out += [(schema["maximum"], True), (schema["maximum"] + step, False)]
    return out


BOUNDED = [
    pytest.param(key, edge, accepted, id=f"{key}={edge}")
    for key, path in WORKER_KEYS.items()
    for edge, accepted in edges(key_field(path).metadata["schema"])
    if not key_field(path).metadata.get("convert")  # sizes: one unit rule, tests/config/test_config_sizes.py
]


def test_every_bounded_setting_is_checked() -> None:
    keys = {p.values[0] for p in BOUNDED}
    assert {"temp", "top_p", "max_tokens", "prompt_cache_size", "request_body_timeout", "distributed"} <= keys


@pytest.mark.parametrize(("key", "value", "accepted"), BOUNDED)
def test_the_worker_refuses_what_the_schema_refuses(tiny_model: Path, key: str, value: Any, accepted: bool) -> None:
    settings = dict.fromkeys(protocol.ENTRY_KEYS) | {"model": str(tiny_model), key: value}
    if accepted:
        check_settings(settings, flag_name)
    else:
        with pytest.raises(UsageError, match=f"^{flag_name(key)} "):
            check_settings(settings, flag_name)


def test_request_limit_defaults_are_the_configs_and_the_help_shows_them() -> None:
    config = Limits()  # the `limits:` block's defaults
    worker = RequestLimits()
    assert (worker.body_timeout_s, worker.max_body_bytes) == (config.request_body_timeout_s, config.max_body_bytes)
    result = run_veloxd("serve", "--help")
    assert result.returncode == 0, result.stderr
    text = " ".join(result.stdout.split())  # argparse wraps the help
    assert f"(default {config.request_body_timeout_s:g})" in text
    assert f"(default {size_text(config.max_body_bytes)})" in text
    parallelisms = key_field("distributed.parallelism").metadata["schema"]["enum"]
    assert f"--distributed {{{','.join(parallelisms)}}}" in text
