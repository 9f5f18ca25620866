"""The dashboard's JSON API and its guards: Host allow-list, bearer-token actions, CSRF refusals;
and the dashboard process following its `dashboard:` block (start, move, stop)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.fixtures.daemon_harness import DaemonHarness, entry, pid_alive, wait_gone
from tests.support import free_port, wait_until
from tests.web.browser import VIEWPORT, browser  # noqa: F401 - the fixture
from tests.web.support import DASHBOARD, Page, config_text

TOKEN = "s3cret-token"


def test_actions_need_the_token_and_refuse_cross_site_requests(tmp_path: Path, browser: Any) -> None:  # noqa: F811
    """Reads are open on loopback but only for an expected Host; reload and restart need the bearer
    token, and a foreign Origin or a cross-site fetch is refused even with it. In the page, the
    token typed into the actions form restarts a server."""
    h = DaemonHarness(tmp_path)
    page = Page(h, free_port())
    h.write(
        config_text(
            {"alpha": entry(free_port())},
            {"port": page.port, "interval_s": 0.5, "api_key_env": "VELOXD_TEST_DASHBOARD_TOKEN"},
        )
    )
    try:
        h.start(env={"VELOXD_TEST_DASHBOARD_TOKEN": TOKEN})
        h.wait_states({"alpha": "ready"})
        page.wait_ready()
        assert page.state()["actions"] is True
        status, body = page.request("api/state", headers={"Host": f"evil.example:{page.port}"})
        assert status == 421 and isinstance(body, dict) and "Host" in body["error"]

        restart = "api/servers/alpha/restart"
        assert page.request(restart, "POST")[0] == 401
        assert page.request(restart, "POST", {"Authorization": "Bearer wrong"})[0] == 401
        good = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}
        status, body = page.request(restart, "POST", {**good, "Origin": "http://evil.example"})
        assert status == 403 and isinstance(body, dict) and "cross-origin" in body["error"]
        assert page.request(restart, "POST", {**good, "Sec-Fetch-Site": "cross-site"})[0] == 403
        assert page.request("api/servers/nobody/restart", "POST", good)[0] == 409
        assert h.server("alpha")["restarts"] == 0  # nothing refused went through

        status, body = page.request("api/reload", "POST", good)
        assert status == 200 and isinstance(body, dict) and body["ok"] and body["unchanged"]
        lowercase = {**good, "Authorization": f"bearer {TOKEN}"}  # the scheme is case-insensitive, as on /v1
        status, body = page.request("api/reload", "POST", lowercase)
        assert status == 200 and isinstance(body, dict) and body["ok"], body

        tab = browser.new_page(viewport=VIEWPORT)
        tab.goto(page.url)
        tab.wait_for_selector("tr[data-server='alpha'] button.restart", timeout=60_000)
        tab.click("#actions summary")
        tab.fill("#token", TOKEN)
        tab.click("#token-form button[type=submit]")
        tab.click("tr[data-server='alpha'] button.restart")
        tab.wait_for_function(
            "document.querySelector(\"tr[data-server='alpha'] .restarts\").textContent === '1'", timeout=60_000
        )
        assert tab.inner_text("#action-result") == "done"
        tab.close()
        assert h.stop() == 0
    finally:
        h.cleanup()


def test_read_only_dashboard_follows_its_block(tmp_path: Path) -> None:
    """Without api_key_env actions answer 403; the logs API filters; moving the dashboard to another
    port restarts only it; removing the block stops it; servers are never touched."""
    h = DaemonHarness(tmp_path)
    page = Page(h, free_port())
    servers = {"alpha": entry(free_port()), "beta": entry(free_port())}
    h.write(config_text(servers, {"port": page.port}))
    try:
        h.start()
        pids = {n: s["pid"] for n, s in h.wait_states({"alpha": "ready", "beta": "ready"}).items()}
        page.wait_ready()
        shown = h.cli("status").stdout
        assert f"dashboard: ready at http://127.0.0.1:{page.port}/ (pid {h.state()['dashboard']['pid']})" in shown
        status, body = page.request("api/reload", "POST", {"Authorization": "Bearer x"})
        assert status == 403 and isinstance(body, dict) and "api_key_env" in body["error"]

        def loading_events() -> list[dict[str, Any]]:
            logs = page.request("api/logs?server=beta&q=loading")[1]
            assert isinstance(logs, dict), logs
            return logs["events"]

        wait_until(loading_events, 30, what="beta's log")
        events = loading_events()
        assert all(e["server"] == "beta" and "loading" in e["text"] for e in events)

        first = h.state()["dashboard"]
        moved = Page(h, free_port())
        draft = tmp_path / "draft.yaml"
        draft.write_text(config_text(servers, {"port": moved.port}))
        planned = h.cli("plan", str(draft)).stdout
        assert f"~ (dashboard)          restart  (127.0.0.1:{moved.port})" in planned, planned
        assert "no changes (2 unchanged); the dashboard to restart" in planned  # the servers are not touched
        mark = h.mark()
        h.write(config_text(servers, {"port": moved.port}))
        moved.wait_ready(after=mark)
        assert moved.state()["reachable"] and not pid_alive(first["pid"])
        assert h.state()["dashboard"]["port"] == moved.port

        mark = h.mark()
        second = h.state()["dashboard"]["pid"]
        h.write(config_text(servers, None))
        h.wait_event("server_stopped", after=mark, server=DASHBOARD)
        wait_gone([second], 10)
        # the state file is written after the event is logged: wait for it, as for any state
        wait_until(lambda: h.state()["dashboard"] is None, 30, what="the state file to drop the dashboard")
        assert {n: s["pid"] for n, s in h.state()["servers"].items()} == pids
        assert h.stop() == 0
    finally:
        h.cleanup()


def test_dashboard_dies_with_the_daemon_and_comes_back_with_the_next(tmp_path: Path) -> None:
    """SIGKILL of the daemon: the dashboard process exits through the lifeline; the next daemon
    starts it again on the same port."""
    import signal

    h = DaemonHarness(tmp_path)
    page = Page(h, free_port())
    h.write(config_text({"alpha": entry(free_port())}, {"port": page.port}))
    try:
        h.start()
        page.wait_ready()
        first = h.state()["dashboard"]["pid"]
        h.signal(signal.SIGKILL)
        assert h.proc is not None
        h.proc.wait(10)
        wait_gone([first], 10)
        mark = h.mark()
        h.start()
        page.wait_ready(after=mark)
        assert page.state()["reachable"] and h.state()["dashboard"]["pid"] != first
        assert h.stop() == 0
    finally:
        h.cleanup()
