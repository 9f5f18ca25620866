"""Properties (hypothesis): valid configs survive load -> dump -> load, and the state-file dict round trip."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.config.strategies import entry
from tests.config_support import model_dir
from veloxd.config import config_from_dict, config_to_dict, load_config
from veloxd.config.dump import dump_yaml


@st.composite
def config_document(draw: st.DrawFn) -> dict[str, Any]:
    ports = draw(st.lists(st.integers(1024, 65535), unique=True, max_size=4))
    servers = {}
    for i, port in enumerate(ports):
        server = draw(entry(port))
        servers[f"s{i}-{server['method'].replace('_', '-')}"] = server
    return {"version": 1, "servers": servers}


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(document=config_document())
def test_load_dump_load_keeps_the_servers(document: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:  # one directory per example (tmp_path is per test)
        root = Path(tmp)
        model_dir(root)
        first_file = root / "first.yaml"
        first_file.write_text(dump_yaml(document), encoding="utf-8")
        first_file.chmod(0o644)
        first = load_config(first_file)

        dumped = config_to_dict(first)
        assert (dumped.pop("source"), dumped.pop("sha256")) == (first.source, first.sha256)
        elsewhere = root / "elsewhere"  # paths were resolved: the dump works from anywhere
        elsewhere.mkdir()
        second_file = elsewhere / "veloxd.yaml"
        second_file.write_text(dump_yaml(dumped), encoding="utf-8")
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
