"""The fixture of the install/uninstall tests: a fresh harness (tmp HOME, config, stub launchctl/systemctl) per test."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.fixtures.launchd_harness import LaunchdHarness


@pytest.fixture
def h(tmp_path: Path) -> LaunchdHarness:
    return LaunchdHarness(tmp_path)
