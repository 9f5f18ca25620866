"""One model's download: list, check the disk, fetch the missing bytes in parallel, file the snapshot.

Runs in the `veloxd pull` process (never in the daemon). Events go to `on_event(name, fields)`
in the shape of the protocol lines (see protocol.py); a ticker thread sends `progress` every
`interval` seconds while bytes arrive.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from veloxd.download import cache, hub
from veloxd.download.hub import Cancelled, DownloadError, Listing
from veloxd.download.progress import Meter, human_bytes

Event = Callable[..., None]  # on_event(name, **fields)

# Tests only: pretend the cache's file system has this many bytes free (there is no portable way
# to get a small file system without root). Documented in docs/models.md.
FREE_BYTES_ENV = "VELOXD_TEST_DISK_FREE_BYTES"
HEADROOM_MAX = 1 << 30  # leave 5 % of the download (at most 1 GiB) free: a full disk breaks everything else
WORKERS = 4  # files fetched at once: shards are big, a few streams fill most links


@dataclass(frozen=True)
class Pulled:
    repo_id: str
    revision: str | None
    path: Path
    total_bytes: int
    fetched_bytes: int
    seconds: float


class _Bytes:
    """A counter several fetch threads add to."""

    def __init__(self, start: int) -> None:
        self.value = start
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


def pull(repo_id: str, on_event: Event, interval: float = 1.0, workers: int = WORKERS) -> Pulled:
    """Make `repo_id` complete in the hub cache; raise DownloadError with the reason otherwise."""
    started = time.monotonic()
    if cache.offline():
        path = cache.local_snapshot(repo_id)
        if path is None:
            raise DownloadError("offline", hub.offline_message(repo_id))
        return _finish(on_event, Pulled(repo_id, None, path, 0, 0, time.monotonic() - started))
    hub.configure()
    listing = hub.list_model(repo_id)
    local = sum(listing.on_disk(f) for f in listing.files)
    check_space(listing, listing.total - local)
    on_event(
        "plan",
        model=repo_id,
        revision=listing.commit,
        files=len(listing.files),
        total_bytes=listing.total,
        local_bytes=local,
    )
    done = _Bytes(local)
    meter = Meter(listing.total)
    meter.update(time.monotonic(), local)  # the reference: bytes counted from here are this run's
    ticking = threading.Event()

    def tick() -> None:
        while not ticking.wait(interval):
            _progress(on_event, meter, done.value)

    ticker = threading.Thread(target=tick, name="progress", daemon=True)
    ticker.start()
    try:
        _fetch_all(listing, done, workers)
    finally:
        ticking.set()
        ticker.join()
    _progress(on_event, meter, done.value)
    path = hub.file_snapshot(listing)
    pulled = Pulled(
        repo_id, listing.commit, path, listing.total, max(0, done.value - local), time.monotonic() - started
    )
    return _finish(on_event, pulled)


def _fetch_all(listing: Listing, done: _Bytes, workers: int) -> None:
    """Fetch every missing blob; the first failure cancels the others (their partial files stay)."""
    todo = [f for f in listing.files if not listing.blob(f).is_file()]
    if not todo:
        return
    stop = threading.Event()
    failure: DownloadError | None = None
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(todo))), thread_name_prefix="fetch") as pool:
        futures = [pool.submit(hub.fetch, listing, f, done.add, stop.is_set) for f in todo]
        try:
            for future in as_completed(futures):
                try:
                    future.result()
                except Cancelled:
                    pass
                except DownloadError as err:
                    failure = failure or err
                    stop.set()
        except BaseException:  # Ctrl-C in `veloxd pull`: stop the fetch threads at their next chunk
            stop.set()
            raise
    if failure is not None:
        raise failure


def _progress(on_event: Event, meter: Meter, done: int) -> None:
    meter.update(time.monotonic(), done)
    eta = meter.eta()
    on_event(
        "progress",
        done_bytes=done,
        total_bytes=meter.total,
        rate_bps=round(meter.rate()),
        eta_s=None if eta is None else round(eta, 1),
    )


def _finish(on_event: Event, pulled: Pulled) -> Pulled:
    on_event(
        "done",
        model=pulled.repo_id,
        revision=pulled.revision,
        path=str(pulled.path),
        total_bytes=pulled.total_bytes,
        fetched_bytes=pulled.fetched_bytes,
        seconds=round(pulled.seconds, 3),
    )
    return pulled


def free_bytes(path: Path) -> int:
    """Free bytes on the file system that holds (or will hold) `path`."""
    override = os.environ.get(FREE_BYTES_ENV)
    if override:
        return int(override)
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    return shutil.disk_usage(existing).free


def check_space(listing: Listing, missing: int) -> None:
    """Refuse before transferring anything when the missing bytes (plus headroom) do not fit."""
    need = missing + min(HEADROOM_MAX, missing // 20)
    free = free_bytes(listing.storage)
    if need > free:
        raise DownloadError(
            "no_space",
            f"not enough disk space for {listing.repo_id}: {human_bytes(missing)} still to download "
            f"({human_bytes(listing.total)} in all) into {listing.storage.parent}, {human_bytes(free)} free there: "
            "free some space, or set HF_HUB_CACHE (or HF_HOME) to a larger disk",
        )
