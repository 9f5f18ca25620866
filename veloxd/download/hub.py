"""The one module that touches huggingface_hub: list a model, fetch a file resumably, file it in the cache.

Why not just `snapshot_download`: since huggingface_hub 1.x each download writes to a
process-unique temporary file that is deleted on failure, so an interrupted multi-gigabyte
shard starts again from byte 0. veloxd fetches each missing blob itself through
huggingface_hub's public HTTP layer (`http_stream_backoff`: its session, auth headers, proxies
and retries) with a Range request, into a stable `blobs/<etag>.incomplete` that a later run
continues, then lets `snapshot_download` do the cache bookkeeping (snapshot symlinks, tree
listing), which finds every blob present and transfers nothing. Plain HTTP is used for
Xet-backed files too. Only public huggingface_hub names are used (httpx2, its HTTP client, is
a declared dependency for the transport errors).
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import httpx2
from huggingface_hub import (
    HfApi,
    constants,
    get_hf_file_metadata,
    hf_hub_download,
    hf_hub_url,
    snapshot_download,
    try_to_load_from_cache,
)
from huggingface_hub.errors import (
    DisabledRepoError,
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.utils import (
    WeakFileLock,
    build_hf_headers,
    disable_progress_bars,
    get_token,
    hf_raise_for_status,
    http_stream_backoff,
)

from veloxd.download.cache import ALLOW_PATTERNS, REVISION, wanted


class DownloadError(Exception):
    """A classified failure: `reason` is a key of protocol.REASONS, the message says what to do."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class Cancelled(Exception):
    """Another file's failure stopped this one (its partial file stays for the next run)."""


@dataclass(frozen=True)
class RemoteFile:
    path: str  # inside the repository
    size: int
    etag: str  # the blob's name in the cache
    url: str  # where the bytes are (after the hub's redirect, if any)
    same_host: bool  # send the token there (a CDN gets no Authorization header)


@dataclass(frozen=True)
class Listing:
    repo_id: str
    commit: str
    files: list[RemoteFile]
    storage: Path  # models--owner--name in the hub cache

    @property
    def total(self) -> int:
        return sum(f.size for f in self.files)

    def blob(self, file: RemoteFile) -> Path:
        return self.storage / "blobs" / file.etag

    def partial(self, file: RemoteFile) -> Path:
        return self.storage / "blobs" / f"{file.etag}.incomplete"

    def on_disk(self, file: RemoteFile) -> int:
        """Bytes of `file` already here: all of it, a resumable part, or none."""
        if self.blob(file).is_file():
            return file.size
        try:
            return min(self.partial(file).stat().st_size, file.size)
        except OSError:
            return 0


# The partial file's write buffer: the disk sees 1 MiB blocks (few writes however small the network's
# reads are), and a kill loses at most that much of a body already received. Progress is counted
# per network read (`_stream`), not per block: a block takes ~9 s to fill at 120 kB/s, and counting
# per block made the rate swing between 0 and ~1.75x the real one.
CHUNK_BYTES = 1 << 20
STREAM_ATTEMPTS = 5  # a transfer that fails or breaks mid-body continues from where it stopped, this many times


def configure() -> None:
    """No huggingface_hub progress bars: veloxd reports progress itself."""
    disable_progress_bars()


def list_model(repo_id: str) -> Listing:
    """The commit at `main` and, for each file mlx_lm loads, its size, blob name and URL."""
    endpoint = constants.ENDPOINT
    try:
        info = HfApi().model_info(repo_id, revision=REVISION, files_metadata=True)
        commit = info.sha
        if not commit:
            raise DownloadError("error", f"{endpoint} returned no commit for {repo_id}")
        files = []
        for sibling in info.siblings or []:
            if not wanted(sibling.rfilename):
                continue
            url = hf_hub_url(repo_id, sibling.rfilename, revision=commit)
            meta = get_hf_file_metadata(url)  # the hub's ETag names the blob, as huggingface_hub files it
            size = meta.size if meta.size is not None else sibling.size
            if meta.etag is None or size is None:
                raise DownloadError("error", f"{endpoint} gave no ETag or size for {repo_id}/{sibling.rfilename}")
            location = meta.location or url
            files.append(
                RemoteFile(
                    sibling.rfilename, size, meta.etag, location, urlsplit(location).netloc == urlsplit(url).netloc
                )
            )
    except DownloadError:
        raise
    except Exception as err:
        raise classify(err, repo_id) from err
    if not files:
        raise DownloadError(
            "not_found",
            f"{repo_id} on {endpoint} has no files mlx_lm can load (no config.json, "
            "model*.safetensors, tokenizer...): is it an MLX model? Check `model:`",
        )
    storage = Path(constants.HF_HUB_CACHE).expanduser() / ("models--" + repo_id.replace("/", "--"))
    return Listing(repo_id, commit, sorted(files, key=lambda f: -f.size), storage)


def fetch(listing: Listing, file: RemoteFile, on_bytes: Callable[[int], None], cancelled: Callable[[], bool]) -> None:
    """Bring one blob into the cache, continuing a partial file; `on_bytes` gets the size of each
    piece of the body as it arrives (and minus what a restarted file drops)."""
    blob, partial = listing.blob(file), listing.partial(file)
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock = listing.storage.parent / ".locks" / listing.storage.name / f"{file.etag}.lock"
    lock.parent.mkdir(parents=True, exist_ok=True)
    headers = build_hf_headers()
    if not file.same_host:
        headers.pop("authorization", None)
    try:
        with WeakFileLock(str(lock)):  # another veloxd pull (or huggingface_hub) on the same blob waits
            if blob.is_file():
                return
            with open(partial, "ab", buffering=CHUNK_BYTES) as handle:
                if handle.tell() > file.size:  # not ours to continue: start over
                    on_bytes(-_truncate(handle))
                for attempt in range(STREAM_ATTEMPTS):
                    try:
                        _stream(file, headers, handle, on_bytes, cancelled)
                        break
                    except httpx2.TransportError:
                        if attempt == STREAM_ATTEMPTS - 1:
                            raise
                        time.sleep(min(2**attempt, 8))  # then continue from the bytes already here
            os.replace(partial, blob)
    except (DownloadError, Cancelled):
        raise
    except Exception as err:
        raise classify(err, listing.repo_id) from err


def _stream(
    file: RemoteFile,
    headers: dict[str, str],
    handle: BinaryIO,
    on_bytes: Callable[[int], None],
    cancelled: Callable[[], bool],
) -> None:
    """Append the rest of `file` to `handle` (a Range request from its current size)."""
    resume = handle.tell()
    if resume == file.size:
        return
    ranged = {**headers, "Range": f"bytes={resume}-"} if resume else headers
    # Its retries cover a refused or failed request (status 429/5xx); a body that breaks is
    # continued by `fetch` with a new Range (retrying inside would replay the stream).
    # huggingface_hub's session waits without limit unless asked: a stalled read raises after
    # HF_HUB_DOWNLOAD_TIMEOUT and `fetch` continues from the bytes already here.
    with http_stream_backoff(
        "GET",
        file.url,
        headers=ranged,
        follow_redirects=True,
        retry_on_exceptions=(),
        timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT,
    ) as response:
        hf_raise_for_status(response)
        if resume and response.status_code != 206:  # the server ignored our Range: start over
            on_bytes(-_truncate(handle))
        # No chunk size: each piece is what one network read brought (at most the transport's read
        # size), so progress moves as bytes arrive; the handle's buffer gathers them into
        # CHUNK_BYTES blocks. A body that breaks keeps every byte received: the buffer is part of
        # handle.tell(), where the next Range starts, and is flushed when `fetch` closes the file.
        for piece in response.iter_bytes():
            if cancelled():
                raise Cancelled()
            handle.write(piece)
            on_bytes(len(piece))
    handle.flush()
    if handle.tell() != file.size:
        raise httpx2.RemoteProtocolError(f"{file.path}: got {handle.tell()} of {file.size} bytes")


def _truncate(handle: BinaryIO) -> int:
    """Empty a partial file; how many bytes it held."""
    handle.flush()
    held = os.fstat(handle.fileno()).st_size
    handle.seek(0)
    handle.truncate(0)
    return held


def cached_or_fetched(repo_id: str, filename: str) -> str | None:
    """The path of one small file of `repo_id` (config.json): from the cache, else fetched unless
    HF_HUB_OFFLINE is set; None when it cannot be had (the load then reports why)."""
    cached = try_to_load_from_cache(repo_id, filename)
    if isinstance(cached, str):
        return cached
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on"):  # read now, not at import
        return None
    try:
        return hf_hub_download(repo_id, filename)
    except Exception:  # network or hub error: the load reports it
        return None


def file_snapshot(listing: Listing) -> Path:
    """Snapshot symlinks, tree listing and refs/main for blobs that are all present (no transfer)."""
    try:
        path = Path(snapshot_download(listing.repo_id, revision=listing.commit, allow_patterns=list(ALLOW_PATTERNS)))
    except Exception as err:
        raise classify(err, listing.repo_id) from err
    ref = listing.storage / "refs" / REVISION
    ref.parent.mkdir(parents=True, exist_ok=True)
    tmp = ref.with_name(f".{REVISION}.{os.getpid()}.tmp")
    tmp.write_text(listing.commit)
    os.replace(tmp, ref)  # last: refs/main is what says "complete" to the daemon
    return path


def classify(err: BaseException, repo_id: str) -> DownloadError:
    """One reason and one sentence (naming the model and what to do) for any failure."""
    endpoint = constants.ENDPOINT
    page = f"{endpoint}/{repo_id}"
    token = "a token is set" if get_token() else "no token is set"
    if isinstance(err, DownloadError):
        return err
    if isinstance(err, OfflineModeIsEnabled):
        return DownloadError("offline", offline_message(repo_id))
    if isinstance(err, GatedRepoError):
        return DownloadError(
            "gated",
            f"{repo_id} is a gated model ({token}): accept its terms at {page} while "
            "logged in, then give veloxd a token of that account (HF_TOKEN in the "
            "entry's env: or the daemon's environment, or `hf auth login`)",
        )
    if isinstance(err, (RepositoryNotFoundError, RevisionNotFoundError, DisabledRepoError)):
        return DownloadError(
            "not_found",
            f"{endpoint} has no model {repo_id} ({token}): check `model:` in "
            "veloxd.yaml; for a private model, set HF_TOKEN to a token that can read it",
        )
    if isinstance(err, HfHubHTTPError) and err.response is not None:
        status = err.response.status_code
        if status == 404:
            return DownloadError(
                "not_found", f"{endpoint} has no model {repo_id} (HTTP 404): check `model:` in veloxd.yaml"
            )
        if status in (401, 403):
            return DownloadError(
                "unauthorized",
                f"{endpoint} refused access to {repo_id} (HTTP {status}, {token}): "
                "check that HF_TOKEN is valid and may read this model",
            )
        return DownloadError("network", f"{endpoint} failed while downloading {repo_id} (HTTP {status}); retrying")
    if isinstance(err, httpx2.TransportError):
        return DownloadError(
            "network", f"cannot reach {endpoint} to download {repo_id} ({type(err).__name__}: {err}); retrying"
        )
    if isinstance(err, OSError) and err.errno in (errno.ENOSPC, errno.EDQUOT):
        return DownloadError(
            "no_space",
            f"the disk filled up while downloading {repo_id} into "
            f"{constants.HF_HUB_CACHE}: free space, or set HF_HUB_CACHE to a larger disk",
        )
    return DownloadError("error", f"downloading {repo_id} failed: {type(err).__name__}: {err}")


def offline_message(repo_id: str) -> str:
    return (
        f"{repo_id} is not complete in the local cache ({constants.HF_HUB_CACHE}) and HF_HUB_OFFLINE is set, "
        "which forbids downloading it: run `veloxd pull` with network access, or unset HF_HUB_OFFLINE"
    )
