"""Shared test helpers: condition waits, free ports, and a real `veloxd serve` worker process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from testkit.ports import free_port
from testkit.process import cpu_seconds
from veloxd.protocol import READY_PREFIX

__all__ = ["cpu_seconds", "free_port"]  # re-exported: tests import them from here

REPO = Path(__file__).resolve().parent.parent


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = 0.05, what: str = "condition") -> Any:
    """Poll `predicate` until it returns a truthy value; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


def veloxd_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "veloxd", *args]


def run_python(code: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    """`python -c CODE` in a fresh interpreter in the repository, `env` added to this environment."""
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
        env={**os.environ, **env},
    )


def run_veloxd(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(veloxd_cmd(*args), capture_output=True, text=True, timeout=timeout, cwd=REPO, env=env)


# A worker command that records mlx_lm's batch moves on stderr (tests/fixtures/batch_recorder.py).
BATCH_RECORDER = REPO / "tests" / "fixtures" / "batch_recorder.py"
BATCH_PREFIX = "VELOXD_TEST_BATCH "


class Worker:
    """A real `veloxd serve` process; collects stdout/stderr lines, exposes the READY payload.
    With record_batches, it runs through BATCH_RECORDER: `batches()` lists mlx_lm's batch moves."""

    ready_prefix = READY_PREFIX

    def __init__(self, *args: str, env: dict[str, str] | None = None, record_batches: bool = False) -> None:
        program = [sys.executable, str(BATCH_RECORDER)] if record_batches else veloxd_cmd()
        self._start([*program, "serve", *args], env)

    def batches(self) -> list[dict[str, Any]]:
        """Each batch mlx_lm built or grew: {"caches": [layer cache classes], "rows": n}."""
        return [json.loads(line[len(BATCH_PREFIX) :]) for line in self.stderr if line.startswith(BATCH_PREFIX)]

    def _start(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            start_new_session=True,
        )
        self.stdout: list[str] = []
        self.stderr: list[str] = []
        self._drains = [
            threading.Thread(target=self._drain, args=(stream, sink), daemon=True)
            for stream, sink in ((self.proc.stdout, self.stdout), (self.proc.stderr, self.stderr))
        ]
        for drain in self._drains:
            drain.start()

    @staticmethod
    def _drain(stream: Any, sink: list[str]) -> None:
        with stream:  # closed at EOF: the worker and every process that inherited the pipe are gone
            for line in stream:
                sink.append(line.rstrip("\n"))

    def ready(self, timeout: float = 120) -> dict[str, Any]:
        def payload() -> dict[str, Any] | None:
            for line in self.stdout:
                if line.startswith(self.ready_prefix):
                    return json.loads(line[len(self.ready_prefix) :])
            if self.proc.poll() is not None:
                raise AssertionError(f"{type(self).__name__} exited {self.proc.returncode}: {self.stderr[-30:]}")
            return None

        return wait_until(payload, timeout, what=self.ready_prefix.strip())

    def stop(self, timeout: float = 120) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            code = self.proc.wait(timeout)
        self.join_output(timeout)
        return code

    def join_output(self, timeout: float = 120) -> None:
        """Wait until both pipes reached EOF (and are closed)."""
        for drain in self._drains:
            drain.join(timeout)


def eos_token_ids(model_dir: Path) -> list[int]:
    """The end-of-sequence token ids a model's config names (a request can bias them away)."""
    eos = json.loads((model_dir / "config.json").read_text())["eos_token_id"]
    return eos if isinstance(eos, list) else [eos]


def http_json(
    url: str, body: dict | None = None, headers: dict[str, str] | None = None, timeout: float = 60
) -> tuple[int, Any]:
    """GET (or POST when body is given) and decode JSON; returns (status, payload)."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        with err:  # it holds the response's socket
            return err.code, json.loads(err.read() or b"null")


# Modules a light command (check, schema, status, ...) must never import: their absence, not a
# duration, is what keeps those commands fast.
HEAVY_MODULES = ("mlx", "mlx_lm", "transformers")

_REPORT_IMPORTS = """
import json, os, sys
from veloxd.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as done:
    code = done.code
finally:
    heavy = sorted({m.split('.')[0] for m in sys.modules} & set(json.loads(os.environ['VELOXD_TEST_HEAVY'])))
    with open(os.environ['VELOXD_TEST_IMPORTS'], 'w') as out:
        json.dump(heavy, out)
sys.exit(code)
"""


def run_reporting_imports(*args: str, timeout: float = 120) -> tuple[subprocess.CompletedProcess, list[str]]:
    """Run `veloxd ARGS` in a fresh interpreter; return its result and the heavy modules it imported."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "imports.json"
        env = {**os.environ, "VELOXD_TEST_IMPORTS": str(report), "VELOXD_TEST_HEAVY": json.dumps(HEAVY_MODULES)}
        done = subprocess.run(
            [sys.executable, "-c", _REPORT_IMPORTS, *args],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=REPO,
            env=env,
        )
        return done, json.loads(report.read_text())
