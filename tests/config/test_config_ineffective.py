"""Server keys that are valid but do nothing where they are written: located warnings (the file stays
valid), kept apart from the conditions of the world that make a server wait."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.config_support import write_config
from veloxd.config import inspect_config

GATEWAY = "version: 1\ngateway:\n  port: 9300\nservers:\n  coder:\n    model: ./model\n    method: fp16\n"
ALONE = "version: 1\nservers:\n  coder:\n    model: ./model\n    port: 8081\n    method: fp16\n"

CASES = [
    (
        "idle-unload-on-always",
        GATEWAY + "    start: always\n    idle_unload_s: 30\n",
        (
            9,
            5,
            "$.servers.coder.idle_unload_s",
            "idle_unload_s does nothing on a server with start: always "
            "(the gateway unloads only start: on_demand servers when idle)",
        ),
    ),
    (
        "idle-unload-on-the-default-start",
        ALONE + "    idle_unload_s: 30\n",
        (
            7,
            5,
            "$.servers.coder.idle_unload_s",
            "idle_unload_s does nothing on a server with start: always "
            "(the gateway unloads only start: on_demand servers when idle)",
        ),
    ),
    (
        "aliases-without-gateway",
        ALONE + "    aliases: [assistant]\n",
        (
            7,
            5,
            "$.servers.coder.aliases",
            "aliases do nothing without a gateway: block (only the gateway routes requests by model name)",
        ),
    ),
    (
        "pyramid-beta-without-pyramid",
        ALONE.replace("fp16", "snapkv") + "    overrides:\n      snapkv_pyramid_beta: 10\n",
        (
            8,
            7,
            "$.servers.coder.overrides.snapkv_pyramid_beta",
            "snapkv_pyramid_beta does nothing unless snapkv_pyramid: true "
            "(set it in overrides too, or remove snapkv_pyramid_beta)",
        ),
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_key_that_does_nothing_is_a_located_warning(tmp_path: Path, text: str, expected: tuple) -> None:
    result = inspect_config(write_config(tmp_path, text, dedent=False))
    assert result.config is not None and result.issues == []
    assert [(w.line, w.column, w.path, w.message) for w in result.ineffective] == [expected]
    assert result.warnings == []  # no server waits for it


@pytest.mark.parametrize(
    "text",
    [
        GATEWAY + "    start: on_demand\n    idle_unload_s: 30\n    aliases: [assistant]\n",
        ALONE + "    idle_unload_s: null\n    aliases: []\n",  # as `check --effective` writes the defaults
        ALONE.replace("fp16", "snapkv") + "    overrides: {snapkv_pyramid: true, snapkv_pyramid_beta: 10}\n",
    ],
    ids=["on-demand-behind-a-gateway", "defaults-written-out", "pyramid-on"],
)
def test_keys_that_take_effect_are_not_flagged(tmp_path: Path, text: str) -> None:
    result = inspect_config(write_config(tmp_path, text, dedent=False))
    assert result.config is not None and result.ineffective == []


def test_an_invalid_file_still_reports_them(tmp_path: Path) -> None:
    """Every mistake at once: an error elsewhere hides no warning."""
    text = ALONE.replace("port: 8081", "port: 0") + "    aliases: [assistant]\n"
    result = inspect_config(write_config(tmp_path, text, dedent=False))
    assert result.config is None and [i.path for i in result.issues] == ["$.servers.coder.port"]
    assert [w.path for w in result.ineffective] == ["$.servers.coder.aliases"]


def test_a_refused_value_is_not_also_called_ineffective(tmp_path: Path) -> None:
    result = inspect_config(write_config(tmp_path, ALONE + "    idle_unload_s: soon\n", dedent=False))
    assert [i.path for i in result.issues] == ["$.servers.coder.idle_unload_s"] and result.ineffective == []
