"""`veloxd run` follows edits of its config: only changed servers restart (pids prove it).

One real daemon for the module, with stand-in workers on loopback; each test edits the real
file the way an editor does and waits for the daemon's events. Before each test the file is put
back to the module's first config (and every server is ready), so tests run alone and in any order.
"""

from __future__ import annotations

import copy
import hashlib
import json
import signal
import subprocess
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.daemon.conftest import StartedDaemon
from tests.fixtures.daemon_harness import DaemonHarness, entry, pid_alive, to_yaml, wait_for, wait_gone
from tests.support import REPO, free_port, veloxd_cmd
from veloxd.daemon.logs import FIXED_KEYS

NAMES = ("a", "b", "c")


class ReloadDaemon(StartedDaemon):
    """The module's daemon: its entries as last written (`servers`) and its first ones (`baseline`)."""

    def __init__(self, root: Path, servers: Mapping[str, dict[str, Any]]) -> None:
        super().__init__(root, servers)
        self.baseline = copy.deepcopy(self.servers)


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReloadDaemon]:
    h = ReloadDaemon(tmp_path_factory.mktemp("reload"), {name: entry(free_port()) for name in NAMES})
    h.write(h.servers)
    h.start()
    try:
        h.wait_states(dict.fromkeys(NAMES, "ready"))
        yield h
    finally:
        h.cleanup()


@pytest.fixture(autouse=True)
def from_the_first_config(daemon: ReloadDaemon) -> None:
    """Whatever an earlier test edited, start from the module's first config with every server ready."""
    baseline = daemon.baseline
    if daemon.config.read_text() != to_yaml(baseline):
        daemon.servers = copy.deepcopy(baseline)
        daemon.write(daemon.servers)
    # From the state file, not the log: `config_reloaded` is logged before the plan's restarts show
    # in the state, and a READY server may still have a restart queued (pending) behind another.
    sha = hashlib.sha256(to_yaml(baseline).encode()).hexdigest()
    daemon.wait_states(dict.fromkeys(NAMES, "ready"), config_sha256=sha)


def save(h: StartedDaemon, how: str = "replace", **changes: dict[str, Any]) -> None:
    """Apply per-server changes to the harness's servers and save the file."""
    for name, change in changes.items():
        h.servers[name] = {**h.servers[name], **change}
    h.write(h.servers, how=how)


def settled(h: StartedDaemon) -> dict[str, int]:
    """Wait until every server is READY; return their pids."""
    servers = h.wait_states({name: "ready" for name in h.servers})
    return {name: s["pid"] for name, s in servers.items()}


def test_editing_one_entry_restarts_only_that_server(daemon: ReloadDaemon) -> None:
    """Change b's method: b gets a new pid, a and c keep theirs; the plan names b and its keys."""
    before = settled(daemon)
    mark = daemon.mark()
    save(daemon, b={"method": "affine", "bits": 4})
    reloaded = daemon.wait_event("config_reloaded", after=mark)
    assert list(reloaded["plan"]["changed"]) == ["b"] and {"method", "bits"} <= set(reloaded["plan"]["changed"]["b"])
    ready = daemon.wait_event("server_ready", after=mark, server="b")
    assert ready["ready"]["method"] == "affine" and ready["pid"] != before["b"]
    after = settled(daemon)
    assert after["a"] == before["a"] and after["c"] == before["c"]
    assert after["b"] == ready["pid"] and not pid_alive(before["b"])
    assert {r["server"] for r in daemon.events("server_stopping")[-1:]} == {"b"}


def test_live_only_change_applies_without_a_restart(daemon: ReloadDaemon) -> None:
    """A description or a timeout changes nothing that runs: same pid, no stop."""
    before = settled(daemon)
    mark = daemon.mark()
    save(daemon, a={"description": "edited live", "ready_timeout_s": 30})
    reloaded = daemon.wait_event("config_reloaded", after=mark)
    assert set(reloaded["plan"]["updated"]) == {"a"} and not reloaded["plan"]["changed"]
    assert settled(daemon) == before
    assert not [r for r in daemon.records()[mark:] if r["event"] in ("server_stopping", "server_starting")]


def test_invalid_edit_restarts_nothing_and_logs_each_error_location(daemon: ReloadDaemon) -> None:
    """Two errors in the new file: both reported with line and column, every server keeps running."""
    before = settled(daemon)
    good = daemon.config.read_text()
    lines = good.splitlines()
    lines[3] = lines[3].replace('"port": ', '"prot": ')  # line 4: server b, misspelled key
    lines[4] = lines[4].replace('"method": "fp16"', '"method": "fp17"')  # line 5: server c, unknown method
    mark = daemon.mark()
    daemon.write("\n".join(lines) + "\n")
    failed = daemon.wait_event("config_reload_failed", after=mark)
    located = {(e["line"], e["path"]) for e in failed["errors"]}
    assert any(line == 4 and path.startswith("$.servers.b") for line, path in located), failed["errors"]
    assert any(line == 5 and path.startswith("$.servers.c") for line, path in located), failed["errors"]
    assert all(isinstance(e["column"], int) and e["column"] >= 1 for e in failed["errors"])
    assert any(text.startswith(f"{daemon.config}:4:") for text in failed["error_lines"])
    assert settled(daemon) == before
    again = daemon.cli("reload")  # the same refused bytes: the errors again, exit 1
    assert again.returncode == 1 and f"{daemon.config}:4:" in again.stderr and "keeps running" in again.stderr
    status = daemon.cli("status")
    assert "FAILED, kept the last good config" in status.stdout and f"{daemon.config}:5:" in status.stdout
    mark = daemon.mark()
    daemon.write(good)  # back to the running config: accepted, nothing to do
    reloaded = daemon.wait_event("config_reloaded", after=mark)
    assert not reloaded["plan"]["changed"] and not reloaded["plan"]["added"] and not reloaded["plan"]["removed"]
    assert settled(daemon) == before


def test_file_replaced_by_rename_like_vim_is_noticed(daemon: ReloadDaemon) -> None:
    """vim renames the original away and writes a new file: the directory watch still sees it."""
    before = settled(daemon)
    mark = daemon.mark()
    save(daemon, how="vim", c={"method": "kivi", "bits": 4})
    ready = daemon.wait_event("server_ready", after=mark, server="c")
    assert ready["ready"]["method"] == "kivi"
    after = settled(daemon)
    assert after["c"] != before["c"] and after["a"] == before["a"] and after["b"] == before["b"]


def test_twenty_rapid_saves_cause_at_most_two_restarts(daemon: ReloadDaemon) -> None:
    """A burst of saves is debounced: a restarts once or twice and ends on the last content."""
    before = settled(daemon)
    mark = daemon.mark()
    widths = [(2, 3, 4, 6)[i % 4] for i in range(20)]  # a runs fp16 before the burst
    for i, bits in enumerate(widths):
        save(daemon, a={"method": "affine", "bits": bits}, how="replace" if i % 2 else "inplace")
    final_sha = hashlib.sha256(daemon.config.read_bytes()).hexdigest()
    daemon.wait_states({name: "ready" for name in ("a", "b", "c")}, config_sha256=final_sha)
    after = settled(daemon)
    starts = [r for r in daemon.records()[mark:] if r["event"] == "server_starting" and r["server"] == "a"]
    assert 1 <= len(starts) <= 2
    assert after["a"] != before["a"] and after["b"] == before["b"] and after["c"] == before["c"]
    readies = [r for r in daemon.records()[mark:] if r["event"] == "server_ready" and r["server"] == "a"]
    assert readies[-1]["ready"]["bits"] == widths[-1]  # the server that runs now runs the last content
    assert readies[-1]["pid"] == after["a"]


def test_identical_content_and_sighup_are_noops(daemon: ReloadDaemon) -> None:
    """Rewriting the same bytes, SIGHUP and `veloxd reload` all take the same path: unchanged."""
    before = settled(daemon)
    mark = daemon.mark()
    daemon.write(daemon.config.read_text())
    daemon.signal(signal.SIGHUP)
    daemon.wait_event("config_unchanged", after=mark, source="sighup")
    result = daemon.cli("reload")
    assert result.returncode == 0 and "unchanged" in result.stdout
    assert settled(daemon) == before
    assert not [r for r in daemon.records()[mark:] if r["event"] in ("config_reloaded", "server_stopping")]


def test_cli_restart_status_and_logs(daemon: ReloadDaemon) -> None:
    """`restart NAME` gives that server a new pid; status and logs read the daemon's files."""
    before = settled(daemon)
    history = daemon.cli("logs", "--server", "b", "--log-file", str(daemon.log_file)).stdout.splitlines()
    assert history and all(json.loads(line)["server"] == "b" for line in history)
    follower = subprocess.Popen(
        veloxd_cmd("logs", "--follow", "--server", "b", "--log-file", str(daemon.log_file)),
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
    )
    out = follower.stdout
    assert out is not None  # stdout=PIPE
    followed: list[dict[str, Any]] = []
    threading.Thread(target=lambda: followed.extend(json.loads(line) for line in out), daemon=True).start()
    wait_for(lambda: len(followed) >= len(history), 120, "the follower to print the history")
    result = daemon.cli("restart", "b")
    assert result.returncode == 0, result.stderr
    wait_for(lambda: daemon.server("b").get("pid") not in (None, before["b"]), 120, "b restarted")
    after = settled(daemon)
    assert after["b"] != before["b"] and after["a"] == before["a"]
    missing = daemon.cli("restart", "nope")
    assert missing.returncode == 1 and "no server named 'nope'" in missing.stderr and "a, b, c" in missing.stderr
    status = json.loads(daemon.cli("status", "--json").stdout)
    assert status["daemon_alive"] and status["servers"]["b"]["pid"] == after["b"]
    assert status["config_path"] == str(daemon.config) and status["config"]["servers"].keys() == set(NAMES)
    table = daemon.cli("status").stdout
    assert all(f"{name} " in table for name in NAMES) and "ready" in table
    last_two = daemon.cli("logs", "-n", "2", "--server", "a", "--log-file", str(daemon.log_file)).stdout
    assert [json.loads(line)["server"] for line in last_two.splitlines()] == ["a", "a"]
    try:
        wait_for(
            lambda: any(r["event"] == "server_ready" and r["pid"] == after["b"] for r in followed),
            120,
            "`veloxd logs --follow` to show b's new server_ready",
        )
        assert all(r["server"] == "b" for r in followed)
        assert followed[len(history)]["event"] == "server_restart_requested"
    finally:
        follower.terminate()
        follower.wait(120)
        out.close()


def test_removing_adding_and_swapping_ports_stops_before_starting(daemon: ReloadDaemon) -> None:
    """a and b swap ports and d takes removed c's port: only possible if stops finish first."""
    before = settled(daemon)
    servers = daemon.servers
    port_a, port_b, port_c = servers["a"]["port"], servers["b"]["port"], servers["c"]["port"]
    mark = daemon.mark()
    servers["a"], servers["b"] = {**servers["a"], "port": port_b}, {**servers["b"], "port": port_a}
    servers["d"] = entry(port_c)
    del servers["c"]
    daemon.write(servers)
    reloaded = daemon.wait_event("config_reloaded", after=mark)
    assert reloaded["plan"]["added"] == ["d"] and reloaded["plan"]["removed"] == ["c"]
    after = daemon.wait_states({"a": "ready", "b": "ready", "d": "ready"})
    assert "c" not in daemon.state()["servers"] and not pid_alive(before["c"])
    assert (after["a"]["port"], after["b"]["port"], after["d"]["port"]) == (port_b, port_a, port_c)
    assert not daemon.events("server_fatal")
    stops = [i for i, r in enumerate(daemon.records()) if i >= mark and r["event"] == "server_stopped"]
    starts = [i for i, r in enumerate(daemon.records()) if i >= mark and r["event"] == "server_starting"]
    assert max(stops) < min(starts)


def test_every_log_line_is_json_with_the_fixed_keys(daemon: ReloadDaemon) -> None:
    """timestamp/level/event/logger everywhere; server events also carry server and pid."""
    mark = daemon.mark()
    daemon.write("version: 1\nservers: [\n")  # refused: config_reload_failed
    daemon.wait_event("config_reload_failed", after=mark)
    daemon.write({**daemon.servers, "extra": entry(free_port())})
    daemon.wait_event("server_ready", after=mark, server="extra")
    daemon.write(daemon.servers)
    daemon.wait_event("server_stopped", after=mark, server="extra")
    lines = daemon.log_file.read_text().splitlines()
    for line in lines:
        record = json.loads(line)
        assert set(FIXED_KEYS) <= set(record), line
        assert record["timestamp"].endswith("Z")
        if record["event"].startswith("server_"):
            assert "server" in record and "pid" in record, line
    events = {json.loads(line)["event"] for line in lines}
    assert {
        "daemon_started",
        "config_loaded",
        "config_reloaded",
        "config_reload_failed",
        "server_starting",
        "server_ready",
        "server_output",
        "server_stopping",
        "server_exited",
        "server_stopped",
    } <= events


def test_sigterm_stops_every_worker_and_exits_zero(tmp_path: Path) -> None:
    """SIGTERM: all servers stop in parallel, nothing is left running, exit code 0 (its own daemon:
    the module's stays up for the other tests)."""
    h = DaemonHarness(tmp_path)
    h.write({name: entry(free_port()) for name in NAMES})
    h.start()
    try:
        h.wait_states(dict.fromkeys(NAMES, "ready"))
        spawned = h.spawned_pids()
        assert h.stop() == 0
        wait_gone(spawned, 120)
        state = h.state()
        assert state["daemon"]["running"] is False
        assert {s["state"] for s in state["servers"].values()} == {"stopped"}
        assert h.events("daemon_stopped")
        assert h.cli("status").returncode == 1  # not running any more
        assert not Path(state["daemon"]["control_socket"]).exists()
    finally:
        h.cleanup()


def test_edit_with_a_host_that_cannot_listen_and_a_float_port_keeps_every_server(daemon: ReloadDaemon) -> None:
    """From an audit: both once passed `veloxd check` and then crashed the daemon mid-reload, taking
    every server down. A host that does not resolve is a condition of the world: its entry waits,
    alone, saying so; `port: N.0` is port N (an int to the worker, a clash with N found)."""
    before = settled(daemon)
    moved = free_port()
    mark = daemon.mark()
    save(daemon, a={"port": float(moved)})
    daemon.servers["d"] = entry(free_port(), host="nothing.invalid", allow_unauthenticated=True)
    daemon.write(daemon.servers)
    waiting = daemon.wait_event("server_waiting", after=mark, server="d")
    assert [c["kind"] for c in waiting["conditions"]] == ["host"], waiting
    assert "nothing.invalid does not resolve" in waiting["reason"]
    ready = daemon.wait_event("server_ready", after=mark, server="a")
    assert ready["ready"]["port"] == moved
    after = daemon.wait_states({"a": "ready", "b": "ready", "c": "ready", "d": "waiting"})
    assert after["b"]["pid"] == before["b"] and after["c"]["pid"] == before["c"]
    assert after["a"]["port"] == moved and isinstance(after["a"]["port"], int)
    assert not daemon.events("daemon_step_failed")
    daemon.servers["d"]["port"] = free_port()  # d to restart: plan names what it will wait for
    daemon.config.with_name("next.yaml").write_text(to_yaml(daemon.servers))
    plan = daemon.cli("plan", str(daemon.config.with_name("next.yaml")))
    assert plan.returncode == 0 and "waits while: host nothing.invalid does not resolve" in plan.stdout, plan
    clash = dict(daemon.servers, e=entry(moved))  # N and N.0 are the same port
    daemon.write(clash)
    failed = daemon.wait_event("config_reload_failed", after=mark)
    assert [e["path"] for e in failed["errors"]] == ["$.servers.e.port"], failed["errors"]
