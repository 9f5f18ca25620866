"""`veloxd check --effective` (a real process): every KV setting of the entry's method with the value
it runs with, defaults included, and nothing of the other methods; the output loads back as the same config."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.config_support import entry, write_config
from tests.support import run_veloxd
from veloxd.config import load_config
from veloxd.kv import registry
from veloxd.kv.config import KVCacheConfig, override_fields_for


def _effective(path: Path) -> dict:
    done = run_veloxd("check", "--effective", str(path))
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)


def test_written_values_equal_to_their_defaults_are_shown(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        entry("model: ./model\nport: 8081\nmethod: kivi\noverrides: {kivi_group_size: 32, kivi_residual_length: 64}"),
        dedent=False,
    )
    server = _effective(path)["servers"]["coder"]
    assert (server["method"], server["bits"]) == ("kivi", 4)
    assert server["overrides"] == {"kivi_group_size": 32, "kivi_residual_length": 64}


@pytest.mark.parametrize("method", ["h2o", "snapkv_affine", "turboquant_prod", "fp16"])
def test_every_setting_of_the_method_is_filled_in(tmp_path: Path, method: str) -> None:
    path = write_config(tmp_path, entry(f"model: ./model\nport: 8081\nmethod: {method}"), dedent=False)
    server = _effective(path)["servers"]["coder"]
    defaults = KVCacheConfig(method)
    assert server["overrides"] == {name: getattr(defaults, name) for name in override_fields_for(method)}
    assert ("seed" in server) == (method in ("snapkv_affine", "turboquant_prod"))
    assert ("bits" in server) == bool(registry.get(method).bits_choices)
    other = tmp_path / "again"
    other.mkdir()
    again = write_config(other, yaml.safe_dump(_effective(path)), dedent=False)
    assert load_config(again).servers == load_config(path).servers


def test_h2o_defaults_by_name(tmp_path: Path) -> None:
    """The filled-in values by name, not only as KVCacheConfig computes them."""
    path = write_config(tmp_path, entry("model: ./model\nport: 8081\nmethod: h2o"), dedent=False)
    assert _effective(path)["servers"]["coder"]["overrides"] == {"h2o_budget": 1024, "h2o_window": 256}
