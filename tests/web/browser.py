"""A real headless Chromium for the dashboard tests: Debian's chromium driven by Playwright.

`make browser` (a prerequisite of `make test`) installs chromium when it is missing and we are
root. Where it still is missing, the tests FAIL naming it: a dashboard nobody looked at in a
browser is not tested.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = Path(os.environ.get("VELOXD_CHROMIUM", "/usr/bin/chromium"))
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
VIEWPORT = {"width": 1400, "height": 1000}


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"the dashboard's browser tests need Chromium at {CHROMIUM}: run `make browser` as root "
            "(apt-get install chromium) or set VELOXD_CHROMIUM",
            pytrace=False,
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError as err:
        pytest.fail(f"the dashboard's browser tests need Playwright for Python (the test extra): {err}", pytrace=False)
    with sync_playwright() as playwright:
        # Without LD_PRELOAD: `make test` preloads OpenBLAS for MLX, and chromium's processes die with it.
        env: dict[str, str | float | bool] = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=ARGS, env=env)
        try:
            yield chromium
        finally:
            chromium.close()
