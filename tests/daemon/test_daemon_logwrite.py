"""Log records that cannot be written are counted, shown and announced, never silent.

A real daemon (stand-in workers, a real dashboard for /metrics) whose log file stops being
writable in ways root cannot bypass either: its directory replaced by a regular file, a full
tmpfs (ENOSPC), a read-only directory (a read-only bind mount for root, mode 0555 otherwise).
While broken, the daemon keeps serving and `veloxd status` and /metrics show the loss; once
writing works again, the first record in the file is `log_write_recovered` with the count. The
handler's own pieces are tested in process on real files (and /dev/full for ENOSPC).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.daemon_harness import DaemonHarness, entry, wait_for
from tests.support import free_port, http_json
from tests.web.support import Page, dashboard_daemon
from veloxd.daemon.logs import configure_logging, get_logger, log_write_status, take_write_failure

CHAT = {"messages": [{"role": "user", "content": "hi"}]}


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[tuple[DaemonHarness, Page]]:
    """A daemon with one stand-in server `alpha` and a dashboard, both ready."""
    with dashboard_daemon(tmp_path, {"alpha": entry(free_port())}) as running:
        yield running


def log_write(h: DaemonHarness) -> dict[str, Any]:
    return (h.state().get("daemon") or {}).get("log_write") or {}


def break_then_restart_a_worker(h: DaemonHarness, page: Page, error: str) -> int:
    """With the log broken: a worker's whole restart sequence and a reload happen, unwritten; the
    daemon serves on; status and /metrics show the loss. Returns the records lost so far."""
    assert h.cli("reload").returncode == 0
    wait_for(lambda: log_write(h).get("failing"), 60, "the first lost record")
    old = h.server("alpha")["pid"]
    os.kill(old, signal.SIGKILL)
    wait_for(lambda: h.server("alpha").get("pid") not in (None, old), 120, "alpha restarted")
    h.wait_states({"alpha": "ready"})
    assert h.cli("reload").returncode == 0
    port = h.server("alpha")["port"]
    assert http_json(f"http://127.0.0.1:{port}/v1/chat/completions", CHAT)[0] == 200
    h.check_alive()
    broken = wait_for(lambda: (lw := log_write(h)).get("failing") and lw["lost_records"] >= 5 and lw, 60, "loss")
    assert error in broken["error"], broken
    status = h.cli("status")
    assert status.returncode == 0, status.stdout + status.stderr  # servers are fine: health checks pass
    line = next(text for text in status.stdout.splitlines() if text.startswith("log: cannot write"))
    assert str(h.log_file) in line and error in line and "records lost so far" in line
    page.wait_value("veloxd_log_write_failing", 1)
    # /metrics samples the daemon on its own interval: it may show an earlier count for a moment.
    wait_for(lambda: (page.value("veloxd_log_records_lost_total") or 0) >= 5, 60, "the loss in /metrics")
    _, events = page.request("api/logs?q=log_write_failed")
    assert "log_write_failed" in json.dumps(events)  # not in the file, but on the dashboard's tail
    return int(broken["lost_records"])


def recover(h: DaemonHarness, page: Page, mark: int, lost_before: int) -> None:
    """The next event after the repair: log_write_recovered first, with the whole count."""
    assert h.cli("reload").returncode == 0  # an event to write
    recovered = h.wait_event("log_write_recovered", after=mark, timeout=60)
    records = h.records()[mark:]
    assert records[0]["event"] == "log_write_recovered", [r["event"] for r in records[:3]]
    assert recovered["lost_records"] >= lost_before and recovered["failed_since"].endswith("Z")
    assert recovered["log_file"] == str(h.log_file)
    wait_for(lambda: not log_write(h).get("failing"), 60, "status: writing again")
    assert log_write(h)["lost_records_total"] == recovered["lost_records"]
    page.wait_value("veloxd_log_write_failing", 0)
    page.wait_value("veloxd_log_records_lost_total", recovered["lost_records"])
    assert "could not be written earlier" in h.cli("status").stdout
    h.wait_event("config_unchanged", after=mark, timeout=60)  # and writing goes on
    output = h.output.read_text()
    assert "Logging error" not in output and "Traceback" not in output, output[-2000:]


def test_log_directory_replaced_by_a_file(daemon: tuple[DaemonHarness, Page]) -> None:
    """ENOTDIR/EEXIST: the log directory is moved away and a regular file put at its path."""
    h, page = daemon
    directory = h.log_file.parent
    mark = h.mark()
    away = directory.with_name("logs.away")
    os.rename(directory, away)
    directory.write_text("not a directory")
    lost = break_then_restart_a_worker(h, page, "FileExistsError")
    directory.unlink()
    os.rename(away, directory)
    recover(h, page, mark, lost)


def _mount(*args: str) -> bool:
    return os.geteuid() == 0 and subprocess.run(["mount", *args], capture_output=True).returncode == 0


def test_full_disk(tmp_path: Path) -> None:
    """ENOSPC: the log on a 256 KiB tmpfs that a file fills up; deleting the file is the repair."""
    disk = tmp_path / "disk"
    disk.mkdir()
    if not _mount("-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)):
        pytest.skip("mounting a tmpfs needs root (CAP_SYS_ADMIN); /dev/full covers ENOSPC in process")
    alpha = {"alpha": entry(free_port())}
    try:
        with dashboard_daemon(tmp_path / "d", alpha, log_file=disk / "logs" / "veloxd.jsonl") as (h, page):
            filler = disk / "filler"
            with open(filler, "wb", buffering=0) as out, pytest.raises(OSError, match="No space left"):
                while True:
                    out.write(b"x" * 4096)
            # The log file's last block takes records until it is full too: the gap starts after them.
            wait_for(lambda: h.cli("reload") and log_write(h).get("failing"), 120, "the first lost record")
            mark = h.mark()
            lost = break_then_restart_a_worker(h, page, "No space left on device")
            filler.unlink()
            recover(h, page, mark, lost)
    finally:
        subprocess.run(["umount", str(disk)], check=False)


def test_read_only_log_directory(daemon: tuple[DaemonHarness, Page]) -> None:
    """EROFS/EACCES: the log file is rotated away by someone and its directory is read-only, so it
    cannot be created again (root: a read-only bind mount; others: mode 0555)."""
    h, page = daemon
    directory = h.log_file.parent
    os.rename(h.log_file, directory.parent / "veloxd.jsonl.rotated")
    if os.geteuid() == 0:
        if not (_mount("--bind", str(directory), str(directory)) and _mount("-o", "remount,ro,bind", str(directory))):
            subprocess.run(["umount", str(directory)], check=False)
            pytest.skip("a read-only bind mount needs CAP_SYS_ADMIN; mode 0555 does not stop root")
        error = "Read-only file system"
    else:
        directory.chmod(0o555)
        error = "Permission denied"
    try:
        lost = break_then_restart_a_worker(h, page, error)
    finally:
        if os.geteuid() == 0:
            subprocess.run(["umount", str(directory)], check=False)
        directory.chmod(0o755)
    recover(h, page, 0, lost)  # a new file: its first record


# ---- the handler in process ------------------------------------------------------------------
@pytest.fixture
def logging_to(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "logs" / "veloxd.jsonl"
    configure_logging(path, log_format="json")
    yield path
    root = logging.getLogger()
    for handler in list(root.handlers):
        root.removeHandler(handler)
        handler.close()


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_handler_counts_enospc_announces_once_and_recovers_first(
    logging_to: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """/dev/full at the log's path: every record fails with ENOSPC, is counted, and nothing reaches
    stderr; the failure is offered once per distinct error; the repaired path's first record is
    log_write_recovered, and what a full disk left of a record is cut off rather than run into it."""
    log = get_logger("veloxd.daemon")
    log.info("before")
    saved = logging_to.read_text() + '{"event": "cut off by a full di'  # what a partial write leaves
    logging_to.unlink()
    os.symlink("/dev/full", logging_to)
    for i in range(3):
        log.info("lost", i=i)
    status = log_write_status()
    assert status is not None and status["failing"] and status["lost_records"] == 3
    assert status["errno"] == 28 and status["error"] == "OSError: No space left on device"
    first = take_write_failure()
    assert first is not None and first["error"] == status["error"] and take_write_failure() is None
    logging_to.unlink()
    logging_to.write_text(saved)
    log.info("after")
    before, recovered, after = lines(logging_to)
    assert before["event"] == "before" and after["event"] == "after"
    assert recovered["event"] == "log_write_recovered" and recovered["lost_records"] == 3
    assert recovered["error"] == status["error"] and recovered["level"] == "warning"
    assert log_write_status() == {
        **status,
        "failing": False,
        "failed_since": None,
        "lost_records": 0,
        "error": None,
        "errno": None,
    }
    assert "Logging error" not in capfd.readouterr().err
