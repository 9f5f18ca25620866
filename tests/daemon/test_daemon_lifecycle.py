"""The daemon's life: degraded start, local model watching, abrupt death, orphans, no mlx."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import psutil

from tests.fixtures.daemon_harness import DaemonHarness, entry, pid_alive, wait_gone
from tests.support import free_port, run_python, wait_until


def make_model_dir(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (path / "model.safetensors").write_bytes(b"\0" * 64)
    return path


def test_degraded_start_then_model_watch_then_sigkill_leaves_no_worker(tmp_path: Path) -> None:
    """Missing, then invalid config: the daemon waits. Valid: servers start. New weights restart
    only their server. A second daemon on the same state dir is refused. SIGKILL of the daemon:
    every worker is gone within 2 s (lifeline)."""
    h = DaemonHarness(tmp_path)
    try:
        h.start()
        failed = h.wait_event("config_reload_failed")
        assert failed["source"] == "startup" and "not found" in failed["error_lines"][0]
        # The state file is written after the event is logged: wait for the verdict in it.
        state = wait_until(lambda: s if "degraded" in (s := h.state()) else None, 60, what="the startup verdict")
        assert state["degraded"] is True and state["servers"] == {}
        control = Path(state["daemon"]["control_socket"])
        assert control.stat().st_mode & 0o777 == 0o600 and h.state_dir.stat().st_mode & 0o777 == 0o700

        mark = h.mark()
        h.config.write_text("version: 1\nservers:\n  a: {model: test/fake-model, port: 99999, method: fp16}\n")
        failed = h.wait_event("config_reload_failed", after=mark)
        assert failed["errors"][0]["line"] == 3 and failed["errors"][0]["path"] == "$.servers.a.port"
        assert h.proc is not None and h.proc.poll() is None

        model = make_model_dir(tmp_path / "weights" / "local-model")
        servers = {"hub": entry(free_port()), "local": entry(free_port(), model=str(model))}
        mark = h.mark()
        h.write(servers)
        reloaded = h.wait_event("config_reloaded", after=mark)
        assert sorted(reloaded["plan"]["added"]) == ["hub", "local"]
        pids = {n: s["pid"] for n, s in h.wait_states({"hub": "ready", "local": "ready"}).items()}

        # The daemon process itself never loads mlx (its workers do): no mlx library is mapped.
        mapped = [region.path for region in psutil.Process(h.proc.pid).memory_maps()]
        assert mapped and not [path for path in mapped if "mlx" in path]

        second = h.cli("run", "--config", str(h.config), "--log-file", str(tmp_path / "other.jsonl"), timeout=30)
        assert second.returncode == 1 and "another veloxd daemon" in second.stderr

        mark = h.mark()
        (model / "model.safetensors").write_bytes(b"\1" * 128)  # new weights at the same path
        changed = h.wait_event("model_changed", after=mark)
        assert changed["servers"] == ["local"] and changed["directory"] == str(model)
        h.wait_event("server_ready", after=mark, server="local")
        after = {n: s["pid"] for n, s in h.wait_states({"hub": "ready", "local": "ready"}).items()}
        assert after["hub"] == pids["hub"] and after["local"] != pids["local"]

        workers = [p for p in after.values()]
        h.signal(signal.SIGKILL)
        h.proc.wait(120)
        wait_gone(workers, 120)  # the lifeline pipe closed: each worker exits by itself (bench-daemon times it)
    finally:
        h.cleanup()


def test_next_daemon_ends_orphans_it_can_identify_and_spares_reused_pids(tmp_path: Path) -> None:
    """A worker that outlived its daemon is ended by the next one before it binds the port; a
    recorded pid whose start time does not match (a reused pid) is left alone."""
    h = DaemonHarness(tmp_path)
    port = free_port()
    seen = tmp_path / "lifeline-closed"
    h.write({"a": entry(port, env={"FAKE_IGNORE_LIFELINE": "1", "FAKE_LIFELINE_SEEN": str(seen)})})
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        h.start()
        orphan = h.wait_states({"a": "ready"})["a"]["pid"]
        h.signal(signal.SIGKILL)
        assert h.proc is not None
        h.proc.wait(120)
        wait_until(seen.exists, 120, what="the worker to see its lifeline close")  # and ignore it, on purpose
        assert pid_alive(orphan)

        state = json.loads((h.state_dir / "state.json").read_text())
        state["servers"]["bystander"] = {
            **state["servers"]["a"],
            "pid": bystander.pid,
            "pgid": bystander.pid,
            "start_time": state["servers"]["a"]["start_time"],
        }
        (h.state_dir / "state.json").write_text(json.dumps(state))

        mark = h.mark()
        h.start()
        found = h.wait_event("orphan_found", after=mark)
        assert found["pid"] == orphan and found["server"] == "a"
        ready = h.wait_event("server_ready", after=mark, server="a")
        assert ready["pid"] != orphan and ready["ready"]["port"] == port
        assert not pid_alive(orphan)
        records = h.records()[mark:]
        events = [r["event"] for r in records]
        assert events.index("orphan_stopped") < events.index("server_starting")
        assert bystander.poll() is None  # same pid in the file, different start time: not ours
        assert h.stop() == 0
    finally:
        h.cleanup()
        bystander.kill()
        bystander.wait()


def test_daemon_code_never_imports_mlx() -> None:
    """Every module `veloxd run` uses, and the CLI, import without pulling in mlx."""
    code = (
        "import sys\n"
        "from veloxd.cli import build_parser\n"
        "build_parser()\n"
        "import veloxd.daemon.daemon, veloxd.cli.daemon, veloxd.daemon.views, veloxd.config\n"
        "bad = sorted(m for m in sys.modules if m == 'mlx' or m.startswith(('mlx.', 'mlx_lm')))\n"
        "assert not bad, bad\n"
    )
    result = run_python(code, timeout=60)
    assert result.returncode == 0, result.stderr


def test_status_without_a_daemon_says_so(tmp_path: Path) -> None:
    h = DaemonHarness(tmp_path)
    status = h.cli("status")
    assert status.returncode == 1 and "no state file" in status.stderr
    reload = h.cli("reload")
    assert reload.returncode == 1 and "no veloxd daemon is listening" in reload.stderr


def test_nothing_starts_again_once_the_daemon_is_stopping(tmp_path: Path) -> None:
    """A restart asked for while the daemon waits for a stubborn worker to exit (SIGTERM ignored,
    SIGKILL after its stop_timeout_s) is refused with the reason, and nothing is spawned again."""
    h = DaemonHarness(tmp_path)
    try:
        h.write({"stubborn": entry(free_port(), stop_timeout_s=8, env={"FAKE_IGNORE_TERM": "1"})})
        h.start()
        h.wait_states({"stubborn": "ready"})
        mark = h.mark()
        h.signal(signal.SIGTERM)
        h.wait_event("daemon_stopping", after=mark)
        answer = h.cli("restart", "stubborn")
        assert answer.returncode != 0 and "the daemon is stopping" in answer.stdout + answer.stderr, answer
        assert h.proc is not None and h.proc.wait(60) == 0
        assert "server_starting" not in [r["event"] for r in h.records()[mark:]]
    finally:
        h.cleanup()
