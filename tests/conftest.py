"""Session fixtures: one tiny model written once, and free loopback ports; how `make test` spreads
tests over the xdist workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support import free_port as _free_port


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight llama (GQA, head_dim 128, real BPE tokenizer), written once per run."""
    from testkit.tinymodel import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")


@pytest.fixture(scope="session", autouse=True)
def kept_figures_dir(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Workers the tests start keep their KV memory figures here, not in the user's cache dir."""
    from veloxd.protocol import STATE_DIR_ENV

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(STATE_DIR_ENV, str(tmp_path_factory.mktemp("state")))
        yield


@pytest.fixture
def free_port() -> int:
    return _free_port()


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
