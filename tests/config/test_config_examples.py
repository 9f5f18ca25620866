"""Every file in configs/ validates (demo on the real tiny model) and points editors at the schema."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import jsonschema
import pytest
import yaml

from tests.serve.document_support import hand_flags, worker_options
from tests.support import free_port
from veloxd import protocol
from veloxd.config import load_config
from veloxd.kv import registry

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs").rglob("*.yaml"))
SCHEMA_FILE = REPO / "schemas" / "veloxd.schema.json"
SHIPPED_MODEL = REPO / "veloxd" / "assets" / "tiny-llama"


def test_there_are_a_demo_and_examples() -> None:
    names = {p.relative_to(REPO / "configs").as_posix() for p in CONFIGS}
    assert "veloxd.yaml" in names and len([n for n in names if n.startswith("examples/")]) >= 3


@pytest.fixture(scope="module")
def configs_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """configs/ copied with owner-only write permission, next to the shipped model they point at."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(REPO / "configs", root / "configs")
    for path in (root / "configs").rglob("*.yaml"):
        path.chmod(0o644)
    (root / "veloxd" / "assets").mkdir(parents=True)
    (root / "veloxd" / "assets" / "tiny-llama").symlink_to(SHIPPED_MODEL, target_is_directory=True)
    return root / "configs"


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.relative_to(REPO / "configs").as_posix())
def test_config_file_is_valid(path: Path, configs_copy: Path) -> None:
    config = load_config(configs_copy / path.relative_to(REPO / "configs"))
    assert config.servers
    for entry in config.servers.values():
        argv = entry.serve_argv()
        assert entry.method in registry.names() and argv[0] == protocol.ENTRY_JSON_FLAG
        assert protocol.read_entry_document(argv[1])["model"] == entry.model


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.relative_to(REPO / "configs").as_posix())
def test_each_entry_reaches_its_worker_as_the_same_flags_by_hand_would(
    path: Path, configs_copy: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """entry -> document -> ServeOptions equals entry -> hand-typed flags -> ServeOptions."""
    config = load_config(configs_copy / path.relative_to(REPO / "configs"))
    port = free_port()  # the worker checks its port is free: one no other test holds
    for entry in config.servers.values():
        entry = dataclasses.replace(entry, port=port)
        if entry.api_key_env:
            monkeypatch.setenv(entry.api_key_env, "token")
        document = entry.serve_argv()
        from_document = worker_options(*document)
        assert from_document == worker_options(*hand_flags(protocol.read_entry_document(document[1])))
        assert (from_document.model, from_document.kv, from_document.port) == (entry.model, entry.kv, port)
        assert (from_document.temp, from_document.limits.max_body_bytes) == (
            entry.sampling.temp,
            entry.limits.max_body_bytes,
        )
        assert from_document.served_names == (entry.name,)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.relative_to(REPO / "configs").as_posix())
def test_modeline_points_at_the_schema_and_an_editor_agrees(path: Path) -> None:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema=")
    target = (path.parent / first.split("$schema=", 1)[1]).resolve()
    assert target == SCHEMA_FILE.resolve()
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    assert list(jsonschema.Draft7Validator(schema).iter_errors(yaml.safe_load(path.read_text()))) == []


def test_demo_runs_three_methods_on_the_tiny_model(configs_copy: Path) -> None:
    demo = load_config(configs_copy / "veloxd.yaml")
    assert [(e.port, e.method, e.start) for e in demo.servers.values()] == [
        (8181, "kivi", "always"),
        (8182, "affine", "always"),
        (8183, "snapkv", "on_demand"),
    ]
    assert demo.gateway is not None and demo.gateway.port == 8080
    assert {e.model for e in demo.servers.values()} == {str(configs_copy.parent / "veloxd" / "assets" / "tiny-llama")}
