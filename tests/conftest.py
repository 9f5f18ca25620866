"""Shared fixtures: one tiny model written once (and loaded once per module), the real pretrained
model; how `make test` spreads tests over the xdist workers.

Ports come from tests.support.free_port (testkit/ports.py: claimed, never bound and released)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight llama (GQA, head_dim 128, real BPE tokenizer), written once per run."""
    from testkit.tinymodel import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="module")
def model(tiny_model: Path) -> Any:
    """The tiny model loaded by mlx_lm, once per module that asks (a module's caches stay its own)."""
    from mlx_lm import load

    return load(str(tiny_model))[0]


@pytest.fixture(scope="session", autouse=True)
def kept_figures_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Workers the tests start keep their KV memory figures here, not in the user's cache dir."""
    from veloxd.protocol import STATE_DIR_ENV

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STATE_DIR_ENV, str(tmp_path_factory.mktemp("state")))
        yield


@pytest.fixture(scope="session")
def smollm2() -> Path:
    """The real pretrained model, converted once (testkit/pretrained.py); `make` installs its wheel,
    so a missing one is a broken setup and fails, never skips."""
    from testkit import pretrained

    try:
        return pretrained.model_dir()
    except pretrained.PretrainedMissing as err:
        pytest.fail(str(err))


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """`--dist loadgroup` (what `make test` uses): test by test, a module that shares a module
    fixture as one group (tests/spread.py)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.spread import ModuleOrTest

    return ModuleOrTest(config, log)
