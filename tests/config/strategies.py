"""Hypothesis strategies for valid config data: KV settings of every method and whole server entries."""

from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from veloxd.kv import registry
from veloxd.kv.config import KVCacheConfig, field_named, fields_for, override_fields_for

TRICKY_TEXT = [
    "yes",
    "on",
    "0o17",
    "1e3",
    "",
    "a: b",
    "# not a comment",
    "héllo wörld",
    "two\nlines",
    " padded ",
    "null",
    "~",
    "'quoted'",
    '"double"',
    "[1, 2]",
    "8081",
    "true",
]


def setting(f: dataclasses.Field) -> st.SearchStrategy[Any]:
    """Any value the field's metadata admits (its choices, bool, or an integer in its range)."""
    meta = f.metadata
    if meta["choices"]:
        values: st.SearchStrategy[Any] = st.sampled_from(meta["choices"])
    elif meta["kind"] is bool:
        values = st.booleans()
    else:
        low = int(meta["minimum"]) if meta["minimum"] is not None else 0
        high = int(meta["maximum"]) if meta["maximum"] is not None else low + 10_000
        values = st.integers(low, min(high, low + 10_000))
    return st.none() | values if meta["nullable"] else values


@st.composite
def kv_block(draw: st.DrawFn, method: str) -> dict[str, Any]:
    """`bits`, `seed` and `overrides` for `method` that KVCacheConfig accepts."""
    info = registry.get(method)
    kv: dict[str, Any] = {}
    if bool(info.bits_choices) and draw(st.booleans()):  # bool(): mypy infers `and`'s right side from its left
        kv["bits"] = draw(st.sampled_from(info.bits_choices))
    if "seed" in fields_for(method) and draw(st.booleans()):
        kv["seed"] = draw(st.integers(0, 2**31 - 1))
    names = (
        draw(st.lists(st.sampled_from(override_fields_for(method)), unique=True)) if override_fields_for(method) else []
    )
    overrides = {name: draw(setting(field_named(name))) for name in names}
    try:
        KVCacheConfig(method=method, **kv, **overrides)
    except ValueError:
        assume(False)  # a cross-field rule (e.g. window <= budget) refuses this combination
    return {**kv, "overrides": overrides}


TEXT = st.sampled_from(TRICKY_TEXT) | st.text(max_size=20)


@st.composite
def entry(draw: st.DrawFn, port: int, method: str | None = None) -> dict[str, Any]:
    """A server entry as veloxd.yaml holds it, valid; of `method`, or of any registered one."""
    method = method or draw(st.sampled_from(registry.names()))
    out: dict[str, Any] = {
        "model": draw(st.sampled_from(["./model", "model", "mlx-community/Qwen2.5-0.5B-Instruct-4bit"])),
        "port": port,
        "method": method,
        **draw(kv_block(method)),
    }
    host = draw(st.sampled_from(["127.0.0.1", "localhost", "::1", "0.0.0.0", None]))
    if host:
        out["host"] = host
    if host == "0.0.0.0" or draw(st.booleans()):
        out["api_key_env"] = draw(st.sampled_from(["TOKEN", "VELOXD_KEY_2"]))
    if draw(st.booleans()):
        out["sampling"] = {"temp": draw(st.sampled_from([0, 0.2, 1.5])), "max_tokens": draw(st.integers(1, 4096))}
    if draw(st.booleans()):
        out["prompt_cache"] = {
            "size": draw(st.integers(1, 50)),
            "bytes": draw(st.sampled_from([None, 123456, "512M", "1.5GiB", "2g"])),
        }
    if draw(st.booleans()):
        out["env"] = draw(st.dictionaries(st.from_regex(r"VAR_[A-Z0-9]{1,4}", fullmatch=True), TEXT, max_size=3))
    if draw(st.booleans()):
        out["description"] = draw(TEXT)
    if draw(st.booleans()):
        out["restart"] = {
            "max_failures": draw(st.integers(1, 9)),
            "backoff_initial_s": draw(st.sampled_from([0.5, 1, 2])),
        }
    if draw(st.booleans()):
        out["ready_timeout_s"] = draw(st.sampled_from([5, 60.5, 900]))
    return out
