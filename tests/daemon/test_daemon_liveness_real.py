"""Real `veloxd serve` workers: a daemon run from a folder holding a `veloxd` package still brings
them up (children start with `python -P`), and one generating a long completion answers its
liveness probes all along: busy is not hung.
"""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.daemon_harness import DaemonHarness, entry
from tests.support import REPO, free_port, http_json, wait_until
from veloxd.launch import veloxd_argv

SHIPPED = REPO / "veloxd" / "assets" / "tiny-llama"
LOAD_S = 300
# Probed five times a second; two misses of 5 s each in a row would mark it unresponsive.
HEALTH = {"interval_s": 0.2, "timeout_s": 5.0, "failures": 2}
LONG = 300  # tokens: many probe intervals of generation on any machine


def start_from(h: DaemonHarness, cwd: Path) -> None:
    """`veloxd run` as its console script runs it (no cwd on sys.path), from `cwd`."""
    argv = veloxd_argv("run", "--config", str(h.config), "--log-file", str(h.log_file), "--state-dir", str(h.state_dir))
    with open(h.output, "a") as out:
        h.proc = subprocess.Popen(argv, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_workers_start_beside_a_shadowing_folder_and_a_long_generation_is_not_hung(tmp_path: Path) -> None:
    shadow = tmp_path / "src"
    (shadow / "veloxd").mkdir(parents=True)
    (shadow / "veloxd" / "__init__.py").write_text("raise ImportError('the shadowing folder was imported')\n")
    h = DaemonHarness(tmp_path, real_worker=True)
    port = free_port()
    h.write({"tiny": entry(port, model=str(SHIPPED), ready_timeout_s=LOAD_S, health=HEALTH)})
    try:
        start_from(h, shadow)
        h.wait_states({"tiny": "ready"}, timeout=LOAD_S)
        before = h.server("tiny")
        answer: dict[str, Any] = {}

        def generate() -> None:
            answer["reply"] = http_json(
                f"http://127.0.0.1:{port}/v1/completions",
                {"prompt": "hello " * 50, "max_tokens": LONG},
                timeout=LOAD_S,
            )

        worker = threading.Thread(target=generate)
        worker.start()
        wait_until(
            lambda: h.server("tiny")["health"]["probes"] >= before["health"]["probes"] + 3, LOAD_S, what="probes"
        )
        worker.join(LOAD_S)
        after = h.server("tiny")
        status, reply = answer["reply"]
        assert status == 200 and reply["usage"]["completion_tokens"] == LONG, reply
        assert after["state"] == "ready" and after["pid"] == before["pid"]
        assert after["health"]["probes"] > before["health"]["probes"] + 3
        assert not h.events("server_health_failed") and not h.events("server_unresponsive")
        assert "shadowing folder" not in h.output.read_text()
        assert h.stop(timeout=120) == 0
    finally:
        h.cleanup()
