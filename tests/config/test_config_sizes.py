"""Size keys: which keys are sizes comes from their declarations (size_key), and each one given as
text is parsed on load, in a server entry's sections and in the `gateway:` block alike."""

from __future__ import annotations

from pathlib import Path

from tests.config_support import issues, write_config
from veloxd.config.gateway import Gateway
from veloxd.config.keys import size_paths
from veloxd.config.model import ServerEntry


def test_size_paths_are_the_declared_size_keys() -> None:
    assert size_paths(ServerEntry) == (("prompt_cache", "bytes"), ("limits", "max_body_bytes"))
    assert size_paths(Gateway) == (("memory_budget",), ("max_body_bytes",))


def test_every_size_key_that_matches_the_pattern_but_is_no_size_is_named(tmp_path: Path) -> None:
    text = """\
    version: 1
    gateway: {port: 9000, memory_budget: "0.1", max_body_bytes: "0.2"}
    servers:
      coder:
        model: ./model
        method: fp16
        prompt_cache: {bytes: "0.3"}
        limits: {max_body_bytes: "0.4"}
    """
    found = {(path, message) for _, _, path, message in issues(write_config(tmp_path, text))}
    assert found == {
        ("$.gateway.memory_budget", "gateway.memory_budget: '0.1' is not a size; it must be at least 1 byte"),
        ("$.gateway.max_body_bytes", "gateway.max_body_bytes: '0.2' is not a size; it must be at least 1 byte"),
        ("$.servers.coder.prompt_cache.bytes", "prompt_cache.bytes: '0.3' is not a size; it must be at least 1 byte"),
        (
            "$.servers.coder.limits.max_body_bytes",
            "limits.max_body_bytes: '0.4' is not a size; it must be at least 1 byte",
        ),
    }
