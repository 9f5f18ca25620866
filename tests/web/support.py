"""Helpers for the dashboard tests: a daemon with a `dashboard:` block, its JSON API and /metrics."""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from tests.fixtures.daemon_harness import DaemonHarness, to_yaml
from tests.gateway.support import GATEWAY, fake_entry, gateway_yaml, model_dir
from tests.support import free_port, http_json, wait_until

DASHBOARD = "@dashboard"  # the dashboard process's name in the daemon's events


def config_text(servers: Mapping[str, Mapping[str, Any]], dashboard: Mapping[str, Any] | None) -> str:
    """veloxd.yaml with these servers and, unless None, this `dashboard:` block."""
    text = to_yaml(servers)
    return text + (f"dashboard: {json.dumps(dict(dashboard))}\n" if dashboard is not None else "")


@contextlib.contextmanager
def dashboard_daemon(
    root: Path,
    servers: Mapping[str, Mapping[str, Any]],
    worker_command: str | None = None,
    log_file: Path | None = None,
) -> Iterator[tuple[DaemonHarness, Page]]:
    """A daemon in `root` with these (stand-in) servers and a dashboard sampling every 0.5 s, all ready
    (optionally another worker command, or its log elsewhere)."""
    h = DaemonHarness(root)
    if worker_command is not None:
        h.worker_command = worker_command
    if log_file is not None:
        h.log_file = log_file
    page = Page(h, free_port())
    h.write(config_text(servers, {"port": page.port, "interval_s": 0.5}))
    try:
        h.start()
        h.wait_states(dict.fromkeys(servers, "ready"))
        page.wait_ready()
        yield h, page
    finally:
        h.cleanup()


@contextlib.contextmanager
def gateway_daemon(
    root: Path,
    gateway: Mapping[str, Any],
    *,
    env: Mapping[str, str] | None = None,
    alpha: Mapping[str, Any] | None = None,
    two: Mapping[str, Any] | None = None,
) -> Iterator[tuple[DaemonHarness, Page]]:
    """A daemon with a gateway (`gateway` keys added to its block) and the dashboard on its port:
    alpha always runs; one and two are on demand and do not fit the budget together (1 MB each
    of 1.5 MB). `alpha` and `two` add keys to those entries; `env` to the daemon's environment."""
    h = DaemonHarness(root)
    page = Page(h, free_port(), process=GATEWAY)
    big = {"weights_bytes": 1_000_000}
    servers = {
        "alpha": fake_entry(model_dir(root, "alpha"), **(alpha or {})),
        "one": fake_entry(model_dir(root, "one", **big), start="on_demand"),
        "two": fake_entry(model_dir(root, "two", **big), start="on_demand", **(two or {})),
    }
    h.write(gateway_yaml({"port": page.port, "memory_budget": 1_500_000, **gateway}, servers))
    try:
        h.start(env=env)
        h.wait_states({GATEWAY: "ready", "alpha": "ready", "one": "stopped", "two": "stopped"})
        yield h, page
    finally:
        h.cleanup()


class Page:
    """The dashboard of a daemon under test, reached over HTTP: the `veloxd web` process by default,
    or the gateway's port (`process="@gateway"`), which serves the same routes."""

    def __init__(self, harness: DaemonHarness, port: int, process: str = DASHBOARD) -> None:
        self.harness = harness
        self.port = port
        self.process = process
        self.url = f"http://127.0.0.1:{port}/"

    def wait_ready(self, timeout: float = 120, after: int = 0) -> dict[str, Any]:
        return self.harness.wait_event("server_ready", timeout=timeout, after=after, server=self.process)

    def request(
        self, path: str, method: str = "GET", headers: Mapping[str, str] | None = None, body: bytes | None = None
    ) -> tuple[int, dict[str, Any] | str]:
        request = urllib.request.Request(
            self.url + path.lstrip("/"), data=body, method=method, headers=dict(headers or {})
        )
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                status, raw = response.status, response.read()
        except urllib.error.HTTPError as err:
            with err:  # it holds the response's socket
                status, raw = err.code, err.read()
        text = raw.decode()
        try:
            return status, json.loads(text)
        except json.JSONDecodeError:
            return status, text

    def state(self) -> dict[str, Any]:
        status, body = self.request("api/state")
        assert status == 200 and isinstance(body, dict), (status, body)
        return body

    def server(self, name: str) -> dict[str, Any]:
        return next((s for s in self.state()["servers"] if s["name"] == name), {})

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """Every sample of /metrics as {(name, labels): value}, parsed by prometheus_client's parser."""
        return samples(self.metrics_text())

    def metrics_text(self) -> str:
        status, text = self.request("metrics")
        assert status == 200 and isinstance(text, str), (status, text)
        return text

    def value(self, name: str, **labels: str) -> float | None:
        return self.metrics().get((name, frozenset(labels.items())))

    def wait_metrics(
        self, *want: tuple[str, dict[str, str], float], timeout: float = 60
    ) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """The first scrape in which every (name, labels, value) holds at once. Workers' counters are
        sampled periodically, so values waited for one by one may come from different samples: a
        test asserts on the one scrape that shows all the events it caused."""

        def scrape() -> dict[tuple[str, frozenset[tuple[str, str]]], float] | None:
            metrics = self.metrics()
            return metrics if all(metrics.get((n, frozenset(labels.items()))) == v for n, labels, v in want) else None

        return wait_until(scrape, timeout, interval=0.2, what=f"one scrape with {want}")

    def wait_value(self, name: str, expected: float, timeout: float = 60, **labels: str) -> None:
        wait_until(
            lambda: self.value(name, **labels) == expected,
            timeout,
            interval=0.2,
            what=f"{name}{labels} == {expected} (last: {self.value(name, **labels)})",
        )


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a Prometheus exposition as {(name, labels): value}, by prometheus_client's parser."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@contextlib.contextmanager
def generating(requests: list[tuple[str, dict[str, Any]]], timeout: float = 120) -> Iterator[None]:
    """While the block runs, one thread per (url, body) posts that completion again and again (load
    for tokens per second and the charts); on exit the threads finish their request and stop."""
    done = threading.Event()

    def loop(url: str, body: dict[str, Any]) -> None:
        while not done.is_set():
            http_json(url, body, timeout=timeout)

    threads = [threading.Thread(target=loop, args=request, daemon=True) for request in requests]
    for thread in threads:
        thread.start()
    try:
        yield
    finally:
        done.set()
        for thread in threads:
            thread.join(timeout + 30)
