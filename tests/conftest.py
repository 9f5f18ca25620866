"""Session fixtures: one tiny model written once, and free loopback ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import free_port as _free_port


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight llama (GQA, head_dim 128, real BPE tokenizer), written once per run."""
    from testkit.tinymodel import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture
def free_port() -> int:
    return _free_port()
