"""The groups `make test` keeps on one xdist worker (tests/spread.py)."""

from __future__ import annotations

from tests.spread import shares_module_fixture


def test_a_module_fixture_defined_imported_or_from_a_conftest_keeps_the_module_together() -> None:
    assert shares_module_fixture("tests/service/test_launchd_plist.py")  # its own `installed`
    assert shares_module_fixture("tests/web/test_web_browser.py")  # tests/web/browser.py's `browser`
    assert shares_module_fixture("tests/kv/evict/test_model.py")  # tests/conftest.py's `model`, a parameter


def test_other_modules_spread_test_by_test() -> None:
    assert not shares_module_fixture("tests/tools/test_spread.py")
    assert not shares_module_fixture("tests/serve/test_serve_methods.py")
    # says `model=...` in calls, but no test takes tests/conftest.py's `model` fixture
    assert not shares_module_fixture("tests/daemon/test_daemon_lifecycle.py")
    assert not shares_module_fixture("tests/no/such_module.py")
