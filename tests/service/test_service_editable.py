"""`veloxd install --print` recognises an editable install even when the config sits beside a folder
named `veloxd` (a checkout in ~/src next to ~/src/veloxd.yaml): the import probe runs as the agent
does, with `python -P`, so the folder cannot shadow the package and no PYTHONPATH is written."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.launchd_harness import LaunchdHarness


def test_an_installed_veloxd_beside_a_veloxd_folder_gets_no_pythonpath(tmp_path: Path) -> None:
    h = LaunchdHarness(tmp_path)
    installed = subprocess.run(
        [sys.executable, "-P", "-c", "import veloxd.cli"], cwd=h.home, env=h.env, capture_output=True, timeout=60
    )
    if installed.returncode != 0:
        pytest.skip("veloxd is not pip-installed into this interpreter's environment (`pip install -e .`)")
    (h.config.parent / "veloxd").mkdir()  # a checkout directory: a namespace package to a bare `python -c`
    result = h.install("--print")
    assert result.returncode == 0, result.stderr
    assert "PYTHONPATH" not in result.stdout and "not installed" not in result.stderr, result.stderr
