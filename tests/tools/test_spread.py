"""The groups `make test` keeps on one xdist worker (tests/spread.py)."""

from __future__ import annotations

from tests.spread import shares_module_fixture


def test_a_module_fixture_here_or_imported_keeps_the_module_together() -> None:
    assert shares_module_fixture("tests/service/test_launchd_plist.py")  # its own `installed`
    assert shares_module_fixture("tests/web/test_web_browser.py")  # tests/web/browser.py's page


def test_other_modules_spread_test_by_test() -> None:
    assert not shares_module_fixture("tests/tools/test_spread.py")
    assert not shares_module_fixture("tests/serve/test_serve_methods.py")
    assert not shares_module_fixture("tests/no/such_module.py")
