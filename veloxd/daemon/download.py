"""The download phase of one entry, as the daemon sees it: whether it is needed, the step's
command, its reported progress (throttled into `server_downloading` events) and its verdict.

The daemon never imports huggingface_hub: the step is a `veloxd pull --progress-json` child
(veloxd/download/), and this module only reads its protocol lines. Stdlib only.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from veloxd import protocol
from veloxd.download import cache
from veloxd.download.progress import Meter, should_report
from veloxd.download.protocol import percent
from veloxd.launch import veloxd_argv

# Verdicts of the download step that are conditions of the world, not failures: the hub cannot be
# reached (or answers 5xx/429), the cache's disk is full. Each can clear by itself, so the entry
# waits and looks again on the recheck schedule, never counting a failure towards FATAL.
WAITS_ON: frozenset[str] = frozenset({"network", "no_space"})


def needs_download(model: str, env: Mapping[str, str]) -> bool:
    """A Hugging Face model that is not complete in the cache the worker would read."""
    return cache.is_hub_model(model) and cache.local_snapshot(model, env) is None


def worker_hub_env(model: str) -> dict[str, str]:
    """Extra worker environment: a hub model is complete in the cache by the time a worker starts
    (the download phase saw to it), so the worker must not touch the network: no surprise
    download of a newer revision inside ready_timeout_s."""
    return {"HF_HUB_OFFLINE": "1"} if cache.is_hub_model(model) else {}


def download_command(model: str, lifeline_fd: int) -> list[str]:
    return veloxd_argv("pull", "--progress-json", "--model", model, protocol.LIFELINE_FLAG, str(lifeline_fd))


class DownloadPhase:
    """What one run of the download step reported; `now` is monotonic, passed in."""

    def __init__(self, now: float) -> None:
        self.started = now
        self.meter = Meter(total=0)
        self.revision: str | None = None
        self.local_bytes = 0  # already on disk when this run began (a resumed download)
        self.result: dict[str, Any] | None = None  # the `done` line
        self.failure: dict[str, Any] | None = None  # the `failed` line
        self._reported_at: float | None = None
        self._reported_percent = 0.0

    def on_line(self, payload: dict[str, Any], now: float) -> dict[str, Any] | None:
        """Record one protocol line; returns the fields of a `server_downloading` event when one is due."""
        event = payload.get("event")
        if event == "plan":
            self.revision = payload.get("revision")
            self.local_bytes = int(payload.get("local_bytes") or 0)
            self.meter.update(now, self.local_bytes, int(payload.get("total_bytes") or 0))
        elif event == "progress":
            self.meter.update(now, int(payload.get("done_bytes") or 0), int(payload.get("total_bytes") or 0))
        elif event == "done":
            self.result = payload
            return None
        elif event == "failed":
            self.failure = payload
            return None
        else:
            return None
        done_percent = percent(self.meter.done, self.meter.total)
        if not should_report(self._reported_at, self._reported_percent, now, done_percent):
            return None
        self._reported_at, self._reported_percent = now, done_percent
        return self.progress()

    def progress(self) -> dict[str, Any]:
        """Bytes done, total, percent, rate (over the last seconds) and ETA: the event and the status."""
        meter = self.meter
        eta = meter.eta()
        done_percent = percent(meter.done, meter.total) if meter.total else 0.0  # 0 until the files are listed
        return {
            "done_bytes": meter.done,
            "total_bytes": meter.total,
            "percent": done_percent,
            "rate_bps": round(meter.rate()),
            "eta_s": None if eta is None else round(eta, 1),
        }

    def finished(self, now: float) -> dict[str, Any]:
        """The fields of `server_downloaded`."""
        result = self.result or {}
        return {
            "size_bytes": result.get("total_bytes", self.meter.total),
            "fetched_bytes": result.get("fetched_bytes"),
            "resumed_from_bytes": self.local_bytes,
            "download_s": round(now - self.started, 3),
            "revision": result.get("revision") or self.revision,
            "path": result.get("path"),
        }

    def failure_reason(self, exit: Mapping[str, Any]) -> tuple[str, str]:
        """(reason, message) of a failed run; a crash without a `failed` line is an `error`."""
        if self.failure is not None:
            return str(self.failure.get("reason") or "error"), str(self.failure.get("message") or "")
        how = f"was killed by {exit['signal']}" if exit.get("signal") else f"exited with code {exit.get('code')}"
        return "error", f"the download step {how} (see last_lines); the next try continues where it stopped"
