"""Property-style: random valid configs survive load -> dump -> load, and the state-file dict round trip."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest

from tests.config_support import model_dir
from veloxd.config import config_from_dict, config_to_dict, load_config
from veloxd.config.dump import dump_yaml
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


def _value(f: dataclasses.Field, rng: random.Random) -> Any:
    meta = f.metadata
    if meta["nullable"] and rng.random() < 0.2:
        return None
    if meta["choices"]:
        return rng.choice(meta["choices"])
    if meta["kind"] is bool:
        return rng.random() < 0.5
    low = meta["minimum"] if meta["minimum"] is not None else 0
    high = meta["maximum"] if meta["maximum"] is not None else low + 10_000
    return rng.randint(int(low), int(min(high, low + 10_000)))


def _kv(method: str, rng: random.Random) -> dict[str, Any]:
    info = registry.get(method)
    kv: dict[str, Any] = {}
    if info.bits_choices and rng.random() < 0.7:
        kv["bits"] = rng.choice(info.bits_choices)
    if "seed" in fields_for(method) and rng.random() < 0.5:
        kv["seed"] = rng.randrange(0, 2**31)
    overrides = {n: _value(field_named(n), rng) for n in override_fields_for(method) if rng.random() < 0.6}
    while True:  # drop settings until the cross-field rules hold (no overrides always does)
        try:
            KVCacheConfig(method=method, **{k: v for k, v in kv.items()}, **overrides)
            break
        except ValueError:
            overrides.pop(rng.choice(list(overrides)))
    kv["overrides"] = overrides
    return kv


def random_config(rng: random.Random) -> dict[str, Any]:
    servers = {}
    ports = rng.sample(range(1024, 65536), 4)
    for i in range(rng.randint(0, 4)):
        method = rng.choice(registry.names())
        entry: dict[str, Any] = {
            "model": rng.choice(["./model", "model", "mlx-community/Qwen2.5-0.5B-Instruct-4bit"]),
            "port": ports[i],
            "method": method,
            **_kv(method, rng),
        }
        host = rng.choice(["127.0.0.1", "localhost", "::1", "0.0.0.0", None])
        if host:
            entry["host"] = host
        if host == "0.0.0.0" or rng.random() < 0.3:
            entry["api_key_env"] = rng.choice(["TOKEN", "VELOXD_KEY_2"])
        if rng.random() < 0.5:
            entry["sampling"] = {"temp": rng.choice([0, 0.2, 1.5]), "max_tokens": rng.randint(1, 4096)}
        if rng.random() < 0.5:
            entry["prompt_cache"] = {
                "size": rng.randint(1, 50),
                "bytes": rng.choice([None, 123456, "512M", "1.5GiB", "2g"]),
            }
        if rng.random() < 0.5:
            entry["env"] = {f"VAR_{k}": rng.choice(TRICKY_TEXT) for k in range(rng.randint(0, 3))}
        if rng.random() < 0.5:
            entry["description"] = rng.choice(TRICKY_TEXT)
        if rng.random() < 0.3:
            entry["restart"] = {"max_failures": rng.randint(1, 9), "backoff_initial_s": rng.choice([0.5, 1, 2])}
        if rng.random() < 0.3:
            entry["ready_timeout_s"] = rng.choice([5, 60.5, 900])
        servers[f"s{i}-{method.replace('_', '-')}"] = entry
    return {"version": 1, "servers": servers}


@pytest.mark.parametrize("seed", range(12))
def test_load_dump_load_keeps_the_servers(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    model_dir(tmp_path)
    for attempt in range(5):
        first_file = tmp_path / f"first{attempt}.yaml"
        first_file.write_text(dump_yaml(random_config(rng)), encoding="utf-8")
        first_file.chmod(0o644)
        first = load_config(first_file)

        document = config_to_dict(first)
        assert (document.pop("source"), document.pop("sha256")) == (first.source, first.sha256)
        elsewhere = tmp_path / f"elsewhere{attempt}"  # paths were resolved: the dump works from anywhere
        elsewhere.mkdir()
        second_file = elsewhere / "veloxd.yaml"
        second_file.write_text(dump_yaml(document), encoding="utf-8")
        second_file.chmod(0o644)
        second = load_config(second_file)
        assert second.servers == first.servers
        assert list(second.servers) == list(first.servers)

        through_json = json.loads(json.dumps(config_to_dict(first)))  # as the daemon's state file stores it
        assert config_from_dict(through_json) == first


def test_config_from_dict_rejects_malformed_data() -> None:
    with pytest.raises(ValueError, match="malformed config data"):
        config_from_dict({"version": 1, "servers": {"a": {"port": 1}}, "source": "x", "sha256": "y"})
    with pytest.raises(ValueError, match="kivi_group_size"):
        config_from_dict(
            {
                "version": 1,
                "source": "x",
                "sha256": "y",
                "servers": {"a": {"model": "m", "port": 1, "method": "h2o", "overrides": {"kivi_group_size": 64}}},
            }
        )
