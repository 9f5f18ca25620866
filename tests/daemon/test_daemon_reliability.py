"""Faults of the world and of the daemon, each reproduced against the real daemon and real `veloxd serve` workers on the
shipped model: a missing model waits alone, logs survive rotation, state-write errors are survived,
model directories are followed by path, alias bombs by size, and the smaller ones.

Each test starts its own daemon with only the servers it needs (tests run alone, in any order and
in parallel); every wait is on a condition, with deadlines sized for model loads on a busy box.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import urllib.request
from pathlib import Path
from typing import Any, TypedDict

import pytest

from tests.daemon.conftest import StartDaemon, StartedDaemon
from tests.fixtures.daemon_harness import entry, wait_for
from tests.support import REPO, free_port, http_json, veloxd_cmd

pytestmark = pytest.mark.slow

SHIPPED = REPO / "veloxd" / "assets" / "tiny-llama"
LOAD_S = 300  # several model loads at once on two busy cores
API_KEY = "sk-veloxd-test-key-4242"
HUB_TOKEN = "hf_secret_token_0123456789"


class DaemonFlags(TypedDict):
    """start_daemon's keyword arguments."""

    real_worker: bool
    env: dict[str, str]


REAL_WORKERS: DaemonFlags = {"real_worker": True, "env": {"VELOXD_REL_KEY": API_KEY}}
RESTART = {"max_failures": 2, "window_s": 600, "backoff_initial_s": 0.2, "backoff_max_s": 0.4}


def real(port: int, model: Path, **extra: Any) -> dict[str, Any]:
    return entry(
        port, model=str(model), method="fp16", ready_timeout_s=LOAD_S, stop_timeout_s=20, restart=dict(RESTART), **extra
    )


def copy_model(target: Path, model_type: str | None = None, broken_weights: bool = False) -> Path:
    """A copy of the shipped model (optionally an unknown architecture, or weights that cannot load)."""
    shutil.copytree(SHIPPED, target)
    if model_type is not None:
        config = json.loads((target / "config.json").read_text())
        (target / "config.json").write_text(json.dumps({**config, "model_type": model_type}))
    if broken_weights:
        (target / "model.safetensors").write_bytes(b"not a safetensors file")
    return target


def put_in_place(source: Path, target: Path) -> None:
    """Copy elsewhere, then rename into place, as a download tool does."""
    staging = target.parent / f".{target.name}.partial"
    shutil.copytree(source, staging)
    os.rename(staging, target)


@pytest.fixture
def models(tmp_path: Path) -> Path:
    path = tmp_path / "models"
    path.mkdir()
    return path


def save(daemon: StartedDaemon) -> None:
    daemon.write(daemon.servers)


def test_missing_model_waits_alone_and_starts_when_its_directory_appears(
    start_daemon: StartDaemon, models: Path
) -> None:
    """One entry's missing model directory no longer invalidates the file. That entry WAITS
    (visible in status, exit code 3); the others run; edits to others apply; reload does not repeat
    a cached rejection; once the directory is moved into place the entry comes up by itself."""
    late = models / "late"
    daemon = start_daemon(dict(alpha=real(free_port(), SHIPPED), late=real(free_port(), late)), **REAL_WORKERS)
    waiting = daemon.wait_event("server_waiting", server="late", timeout=60)
    assert waiting["reason"] == f"model path {late} does not exist (yet)"
    assert waiting["conditions"] == [{"kind": "model_path", "key": "model", "message": waiting["reason"]}]
    daemon.wait_states({"alpha": "ready", "late": "waiting"}, timeout=LOAD_S)
    assert daemon.events("config_loaded") and not daemon.events("config_reload_failed")
    status = daemon.cli("status")
    assert f"late: waiting: model path {late} does not exist (yet)" in status.stdout
    assert status.returncode == 3

    mark = daemon.mark()
    daemon.servers["alpha"]["description"] = "edited while late waits"
    save(daemon)
    reloaded = daemon.wait_event("config_reloaded", after=mark)
    assert reloaded["plan"]["updated"] == {"alpha": ["description"]}
    reload = daemon.cli("reload")
    assert reload.returncode == 0 and "unchanged" in reload.stdout, reload.stderr

    mark = daemon.mark()
    put_in_place(SHIPPED, late)
    changed = daemon.wait_event("model_changed", after=mark, timeout=60)
    assert changed["directory"] == str(late) and changed["present"] is True
    ready = daemon.wait_event("server_ready", after=mark, server="late", timeout=LOAD_S)
    assert ready["ready"]["model"] == str(late)
    assert not daemon.events("config_reload_failed")
    assert daemon.wait_states({"alpha": "ready", "late": "ready"}) and daemon.cli("status").returncode == 0


def test_fatal_entry_is_revived_when_its_model_directory_is_replaced(start_daemon: StartDaemon, models: Path) -> None:
    """The model watch follows the path (its parent is watched). A FATAL entry whose
    directory is replaced by a rename (a new revision moved into place) is started again, and
    writing into the moved-away old directory restarts nothing (it used to)."""
    broken = copy_model(models / "broken", broken_weights=True)  # loads fail: exit 3, twice: FATAL
    spare = models / "spare"  # waits for its model; its directory is the yardstick below
    daemon = start_daemon(dict(broken=real(free_port(), broken), spare=real(free_port(), spare)), **REAL_WORKERS)
    daemon.wait_states({"broken": "fatal", "spare": "waiting"}, timeout=LOAD_S)
    assert "2 failures" in daemon.events("server_fatal", server="broken")[-1]["reason"]
    mark = daemon.mark()
    os.rename(broken, models / "broken.old")
    put_in_place(SHIPPED, broken)
    ready = daemon.wait_event("server_ready", after=mark, server="broken", timeout=LOAD_S)
    assert ready["ready"]["model"] == str(broken)
    restarted = [r for r in daemon.records()[mark:] if r["event"] == "model_changed" and r["restarted"]]
    assert restarted and "broken" in restarted[0]["restarted"]

    # The yardstick: a directory appearing at `spare`'s path is reported after anything the earlier
    # write into the old directory could have caused (same debounce, later events).
    mark = daemon.mark()
    (models / "broken.old" / "model.safetensors").write_bytes(b"changed after it was moved away")
    (models / "spare").mkdir()
    daemon.wait_event("model_changed", after=mark, directory=str(models / "spare"), timeout=60)
    assert not [r for r in daemon.records()[mark:] if r["event"] == "model_changed" and "broken" in r["servers"]]
    assert daemon.server("broken")["pid"] == ready["pid"]


def test_fatal_reason_is_the_workers_own_error_line(start_daemon: StartDaemon, models: Path) -> None:
    """`server_fatal` and `status` carry what the worker said, not only 'exit 2'."""
    alien = copy_model(models / "alien", model_type="no_such_architecture")
    daemon = start_daemon(dict(alien={**real(free_port(), alien), "method": "affine", "bits": 4}), **REAL_WORKERS)
    daemon.wait_states({"alien": "fatal"}, timeout=LOAD_S)
    fatal = daemon.events("server_fatal", server="alien")[-1]
    assert fatal["reason"].startswith("worker exited with code 2: error: cannot serve")
    assert "no_such_architecture" in fatal["reason"]
    assert daemon.server("alien")["last_exit"]["error"].startswith("error: cannot serve")
    status = daemon.cli("status")
    assert f"alien: {fatal['reason']}" in status.stdout and status.returncode == 3


def test_moved_or_deleted_log_is_reopened_and_logs_says_which_file(start_daemon: StartDaemon) -> None:
    """After the log is moved (logrotate) the daemon writes to a new file at the path;
    after it is deleted, SIGHUP recreates it; `veloxd logs` reads the new file, and says so clearly
    when the path has no file instead of printing nothing with exit 0."""
    daemon = start_daemon(dict(alpha=real(free_port(), SHIPPED)), **REAL_WORKERS)
    daemon.wait_states({"alpha": "ready"}, timeout=LOAD_S)
    log = daemon.log_file
    os.rename(log, log.with_name("veloxd.jsonl.rotated"))
    absent = daemon.cli("logs")
    assert absent.returncode == 1 and "does not exist (moved or deleted?)" in absent.stderr
    assert daemon.cli("reload").returncode == 0  # any event: the handler notices the move
    wait_for(lambda: log.exists(), 60, "a new log file at the path")
    reopened = daemon.wait_event("log_reopened", timeout=60)
    assert reopened["reason"] == "moved_or_deleted" and reopened["log_file"] == str(log)
    first = json.loads(log.read_text().splitlines()[0])
    assert first["event"] == "log_reopened", first  # the new file says why it exists before anything else
    shown = daemon.cli("logs")
    assert shown.returncode == 0 and '"event": "config_unchanged"' in shown.stdout and not shown.stderr
    port = daemon.servers["alpha"]["port"]
    assert http_json(f"http://127.0.0.1:{port}/health", timeout=60)[0] == 200

    log.unlink()
    daemon.signal(signal.SIGHUP)
    wait_for(lambda: log.exists(), 60, "the log recreated on SIGHUP")
    assert daemon.wait_event("log_reopened", reason="sighup", timeout=60)
    assert daemon.wait_event("config_unchanged", source="sighup", timeout=60)


def test_state_write_failure_is_logged_retried_and_stops_no_server(start_daemon: StartDaemon) -> None:
    """The state directory becomes unusable (here: replaced by a file, which fails for root
    too); the next state write fails, `state_write_failed` is logged, the daemon and its servers go
    on; once the directory is back, the next change is written and `state_write_recovered` logged."""
    daemon = start_daemon(dict(alpha=real(free_port(), SHIPPED)), **REAL_WORKERS)
    before = daemon.wait_states({"alpha": "ready"}, timeout=LOAD_S)
    away = daemon.state_dir.with_name("state.away")
    os.rename(daemon.state_dir, away)
    daemon.state_dir.write_text("not a directory")
    try:
        mark = daemon.mark()
        daemon.servers["alpha"]["description"] = "edited while the state dir is gone"
        save(daemon)
        failed = daemon.wait_event("state_write_failed", after=mark, timeout=60)
        assert failed["state_dir"] == str(daemon.state_dir) and "NotADirectoryError" in failed["error"]
        port = daemon.servers["alpha"]["port"]
        assert http_json(f"http://127.0.0.1:{port}/health", timeout=60)[0] == 200
        daemon.check_alive()
    finally:
        daemon.state_dir.unlink()
        os.rename(away, daemon.state_dir)
    mark = daemon.mark()
    daemon.servers["alpha"]["description"] = "state dir is back"
    save(daemon)
    daemon.wait_event("state_write_recovered", after=mark, timeout=60)
    wait_for(
        lambda: daemon.state()["config"]["servers"]["alpha"]["description"] == "state dir is back",
        60,
        "the state file written again",
    )
    assert daemon.server("alpha")["pid"] == before["alpha"]["pid"]


def test_alias_bomb_by_size_is_refused_and_the_daemon_keeps_serving(start_daemon: StartDaemon) -> None:
    """A file under 1 MiB whose anchors point at a 900 KB string used a thousand times is
    refused with a located error (it used to take gigabytes); every server keeps running."""
    daemon = start_daemon(dict(alpha=real(free_port(), SHIPPED)), **REAL_WORKERS)
    before = daemon.wait_states({"alpha": "ready"}, timeout=LOAD_S)
    good = daemon.config.read_text()
    big = "x" * 900_000
    bomb = good + f'x-big: &big "{big}"\nx-use: [{", ".join(["*big"] * 1000)}]\n'
    assert len(bomb.encode()) < 1 << 20
    mark = daemon.mark()
    daemon.write(bomb)
    failed = daemon.wait_event("config_reload_failed", after=mark, timeout=60)
    assert any("characters (an alias bomb?)" in line for line in failed["error_lines"]), failed["error_lines"]
    assert all(len(line) < 1000 for line in failed["error_lines"])
    assert daemon.server("alpha")["pid"] == before["alpha"]["pid"]
    daemon.write(good)
    daemon.wait_event("config_reloaded", after=mark, timeout=60)


def test_secrets_redacted_auth_scheme_status_codes_closed_pipe(start_daemon: StartDaemon) -> None:
    """The entry's HF_TOKEN and the api_key_env value appear nowhere in the state file,
    `status --json` or the log; `Authorization: bearer ...` (lowercase scheme, RFC 7235) is accepted;
    `status` exits 0 with every server ready; `veloxd status | true` (reader gone before we write)
    ends without a traceback."""
    daemon = start_daemon(
        dict(alpha=real(free_port(), SHIPPED, api_key_env="VELOXD_REL_KEY", env={"HF_TOKEN": HUB_TOKEN})),
        **REAL_WORKERS,
    )
    daemon.wait_states({"alpha": "ready"}, timeout=LOAD_S)
    state_text = (daemon.state_dir / "state.json").read_text()
    assert json.loads(state_text)["config"]["servers"]["alpha"]["env"] == {"HF_TOKEN": "<redacted>"}
    status_json = daemon.cli("status", "--json")
    for text in (state_text, status_json.stdout, daemon.log_file.read_text()):
        assert HUB_TOKEN not in text and API_KEY not in text
    port = daemon.servers["alpha"]["port"]
    for scheme in ("Bearer", "bearer", "BEARER"):
        request = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"{scheme} {API_KEY}"}
        )
        with urllib.request.urlopen(request, timeout=60) as response:
            assert response.status == 200, scheme
    assert http_json(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": "bearer wrong"})[0] == 401
    assert daemon.cli("status").returncode == 0 and status_json.returncode == 0
    command = " ".join(veloxd_cmd("status", "--state-dir", str(daemon.state_dir)))
    piped = subprocess.run(f"{command} | true", shell=True, capture_output=True, text=True, cwd=REPO, timeout=120)
    assert "Traceback" not in piped.stderr and "BrokenPipe" not in piped.stderr, piped.stderr
