"""How `veloxd pull` shows a download: protocol lines, a progress bar on a terminal, or plain lines.

Each renderer takes the events of download/protocol.py (`plan`, `progress`, `done`, `failed`)
for one model at a time.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from veloxd.download.progress import human_bytes, human_seconds, summary
from veloxd.download.protocol import format_line

PLAIN_EVERY_S = 5.0  # a log file or CI output wants a line now and then, not a redraw per chunk


class JsonLines:
    """`VELOXD_DOWNLOAD {json}` lines on stdout: what the daemon reads."""

    def __init__(self, out: TextIO = sys.stdout) -> None:
        self.out = out

    def __call__(self, event: str, **fields: Any) -> None:
        self.out.write(format_line(event, **fields) + "\n")
        self.out.flush()


class PlainLines:
    """One line at the start, one every few seconds, one at the end."""

    def __init__(self, label: str, out: TextIO = sys.stdout) -> None:
        self.label = label
        self.out = out
        self._last = 0.0

    def __call__(self, event: str, **f: Any) -> None:
        now = time.monotonic()
        if event == "plan":
            local = f" ({human_bytes(f['local_bytes'])} already here)" if f["local_bytes"] else ""
            self._say(f"{f['files']} files, {human_bytes(f['total_bytes'])}{local}, revision {f['revision'][:12]}")
            self._last = now
        elif event == "progress" and now - self._last >= PLAIN_EVERY_S:
            self._say(summary(f["done_bytes"], f["total_bytes"], f["rate_bps"], f["eta_s"]))
            self._last = now
        elif event == "done":
            self._say(_done_text(f))

    def _say(self, text: str) -> None:
        self.out.write(f"{self.label}: {text}\n")
        self.out.flush()


class ProgressBar:
    """A tqdm bar in bytes on the terminal (stderr), then one line saying where the model is."""

    def __init__(self, label: str, out: TextIO = sys.stderr) -> None:
        self.label = label
        self.out = out
        self._bar: Any = None

    def __call__(self, event: str, **f: Any) -> None:
        from tqdm import tqdm

        if event == "plan":
            self.close()
            self._bar = tqdm(
                total=f["total_bytes"],
                initial=f["local_bytes"],
                unit="B",
                unit_scale=True,
                unit_divisor=1000,
                desc=self.label,
                file=self.out,
                dynamic_ncols=True,
                mininterval=0.2,
            )
        elif event == "progress" and self._bar is not None:
            self._bar.update(f["done_bytes"] - self._bar.n)
        elif event == "done":
            self.close()
            self.out.write(f"{self.label}: {_done_text(f)}\n")
            self.out.flush()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _done_text(f: dict[str, Any]) -> str:
    if not f.get("fetched_bytes"):
        return f"complete in the cache: {f['path']}"
    return f"downloaded {human_bytes(f['fetched_bytes'])} in {human_seconds(f['seconds'])}: {f['path']}"
