"""The one module that touches huggingface_hub: list a model, fetch a file resumably, file it in the cache.

Why not just `snapshot_download`: since huggingface_hub 1.x each download writes to a
process-unique temporary file that is deleted on failure (huggingface_hub PR 4228), so an
interrupted multi-gigabyte shard starts again from byte 0. veloxd fetches each missing blob
itself, with huggingface_hub's own `http_get` (auth headers, proxies, retries, Range resume),
into a stable `blobs/<etag>.incomplete` that a later run continues, then lets
`snapshot_download` do the cache bookkeeping (snapshot symlinks, tree listing), which finds
every blob present and transfers nothing. Plain HTTP is used for Xet-backed files too.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from urllib.parse import urlsplit

import httpx2
from huggingface_hub import HfApi, constants, get_hf_file_metadata, hf_hub_url, snapshot_download
from huggingface_hub.errors import (
    DisabledRepoError,
    GatedRepoError,
    HfHubHTTPError,
    OfflineModeIsEnabled,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.file_download import http_get
from huggingface_hub.utils import WeakFileLock, build_hf_headers, disable_progress_bars, get_token

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


CHUNK_BYTES = 1 << 20


def configure() -> None:
    """No huggingface_hub progress bars (veloxd reports progress itself), and 1 MiB reads.

    huggingface_hub reads a body in 10 MiB pieces and writes each whole: a small model would
    show no progress until done, and a kill would lose up to 10 MiB of a partial file.
    """
    disable_progress_bars()
    constants.DOWNLOAD_CHUNK_SIZE = CHUNK_BYTES


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


class _Counting:
    """The file object http_get writes to: counts bytes for progress and honours cancellation."""

    def __init__(self, handle: BinaryIO, on_bytes: Callable[[int], None], cancelled: Callable[[], bool]) -> None:
        self._handle = handle
        self._on_bytes = on_bytes
        self._cancelled = cancelled

    def write(self, chunk: bytes) -> int:
        if self._cancelled():
            raise Cancelled()
        written = self._handle.write(chunk)
        self._on_bytes(len(chunk))
        return written

    def tell(self) -> int:
        return self._handle.tell()

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self._handle.seek(offset, whence)

    def truncate(self, size: int | None = None) -> int:
        # The server ignored our Range (200 instead of 206): http_get starts over; so does the count.
        self._handle.flush()
        before = os.fstat(self._handle.fileno()).st_size
        after = self._handle.truncate(size)
        self._on_bytes(after - before)
        return after


def fetch(listing: Listing, file: RemoteFile, on_bytes: Callable[[int], None], cancelled: Callable[[], bool]) -> None:
    """Bring one blob into the cache, continuing a partial file; `on_bytes` gets each chunk's size."""
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
            with open(partial, "ab") as handle:
                resume = handle.tell()
                if resume > file.size:  # not ours to continue: start over
                    handle.truncate(0)
                    on_bytes(-resume)
                    resume = 0
                http_get(
                    file.url,
                    _Counting(handle, on_bytes, cancelled),  # type: ignore[arg-type]
                    resume_size=resume,
                    headers=headers,
                    expected_size=file.size,
                )
            os.replace(partial, blob)
    except (DownloadError, Cancelled):
        raise
    except Exception as err:
        raise classify(err, listing.repo_id) from err


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
