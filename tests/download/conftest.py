"""A Hugging Face hub stand-in on loopback serving the shipped tiny model, and a private HF cache."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.hub_standin import HubStandIn, Repo

TINY = Path(__file__).resolve().parents[2] / "veloxd" / "assets" / "tiny-llama"
MODEL = "tiny/llama"
GATED = "tiny/gated"
TOKEN = "hf_standin_token"


@pytest.fixture
def hub() -> Iterator[HubStandIn]:
    repos = {MODEL: Repo.from_dir(TINY), GATED: Repo.from_dir(TINY, gated=True, token=TOKEN)}
    with HubStandIn(repos) as standin:
        yield standin


@pytest.fixture
def hub_env(hub: HubStandIn, tmp_path: Path) -> dict[str, str]:
    """The environment of a process that should download from the stand-in into a fresh cache."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    return {**env, **hub.env(tmp_path / "hf")}
