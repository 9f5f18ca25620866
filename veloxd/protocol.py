"""What the daemon and its workers (and later the gateway) agree on. Stdlib only.

The contract, in one place:
- **Command line.** The daemon runs `veloxd serve --entry-json DOC --lifeline-fd N`. DOC is one
  JSON object holding the whole entry (`ENTRY_KEYS`: the dests of `veloxd serve`'s flags, `kv`
  being `KVCacheConfig.to_dict()` with every default included, and a `version`), or the path of a
  file holding it. `entry_document` renders it and `read_entry_document` reads it; the worker takes
  no other setting flag beside it. The hand-typed flags (`--model`, `--kv-json`, `--port`, ...) are
  for people running a worker by hand; both roads meet in one validation (veloxd.serve.options).
- **Environment.** The daemon adds `WORKER_ENV` to the entry's `env`: unbuffered output, so the
  READY line is not held back in a pipe buffer; and `STATE_DIR_ENV`, its state directory, where
  the worker keeps measured memory figures for the next start.
- **Lifeline.** fd N is the read end of a pipe whose only write end the daemon holds. EOF on it
  means the daemon died (even by SIGKILL): the worker exits 0 within `LIFELINE_GRACE_S`.
- **READY line.** Once the model is loaded, its caches wired and its KV memory figure present, and
  before serving, the worker prints one stdout line `READY_PREFIX + json` (`ReadyPayload`). The
  figure (`kv_memory`) is labelled `source: "measured"` (probed by this start) or `"cached"`
  (measured by an earlier start on the same model files, KV settings and code, read back from
  the state directory): a worker never answers before its figure exists, so READY always
  carries it. The daemon refuses a worker whose READY line is malformed or whose `config`
  differs from the document it was given.
- **Output lines.** The daemon logs each line a worker writes as `server_output`, at the level the
  line carries (`line_level`: its WORKER_LOG_FORMAT level name, or a `veloxd serve: warning:` /
  `error:` account), else info.
- **Exit codes** (`ExitCode`): 0 a clean stop, 2 invalid input (retrying cannot help), 3 a failure
  worth a restart, 4 the port is held by another process (the daemon waits until it is free).
  The gateway and the dashboard sidecar (`veloxd gateway`, `veloxd web`) follow the same READY
  line, lifeline and exit codes.
- **Control socket.** The daemon tells the gateway where its control socket is in
  `CONTROL_SOCKET_ENV`.
"""

from __future__ import annotations

import difflib
import enum
import json
import re
from pathlib import Path
from typing import Any, TypedDict

from veloxd.openai_errors import json_kind

READY_PREFIX = "VELOXD_READY "
READY_SCHEMA_VERSION = 1
KV_JSON_FLAG = "--kv-json"
ENTRY_JSON_FLAG = "--entry-json"
ENTRY_DOCUMENT_VERSION = 1
LIFELINE_FLAG = "--lifeline-fd"
LIFELINE_GRACE_S = 1.0  # after EOF on the lifeline, the worker is gone within this
CONTROL_SOCKET_ENV = "VELOXD_CONTROL_SOCKET"
WORKER_ENV = {"PYTHONUNBUFFERED": "1"}
# The daemon's state directory, set in every worker's environment: the worker keeps its measured
# KV memory figures there (veloxd.serve.figures); a worker started by hand uses the user cache dir.
STATE_DIR_ENV = "VELOXD_STATE_DIR"
# A worker's own account on stderr, a line each ("veloxd serve: error: ...", "... warning: ..."):
# the daemon shows the last one that is not a warning as why the worker exited.
WORKER_PREFIX = "veloxd serve: "
# How a worker under the daemon logs on stderr (the daemon's log timestamps each line itself).
WORKER_LOG_FORMAT = "%(levelname)s %(message)s"
ROUTINE_LOG_LINES = ("DEBUG ", "INFO ")  # progress in that format, never the cause of an exit
# The level a worker's output line carries: a line in WORKER_LOG_FORMAT (or in the timestamped
# format of a hand-run worker and of a distributed rank, "<asctime> - LEVEL - ...") or a
# WORKER_PREFIX account. The daemon logs the line (`server_output`) at it; CRITICAL counts as error.
_LEVELED_LINE = re.compile(
    r"^(?:\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} - )?(WARNING|ERROR|CRITICAL)(?: - | )"
    rf"|^{re.escape(WORKER_PREFIX)}(warning|error): "
)


def last_notable_line(stderr: list[str]) -> str | None:
    """The last stderr line worth showing for why a worker ended: not blank, not routine progress."""
    notable = [line.strip() for line in stderr if line.strip() and not line.startswith(ROUTINE_LOG_LINES)]
    return notable[-1] if notable else None


def line_level(line: str) -> str:
    """ "warning" or "error" for an output line that carries that level (`_LEVELED_LINE`), else "info"."""
    match = _LEVELED_LINE.match(line)
    level = (match.group(1) or match.group(2)).lower() if match else "info"
    return "error" if level == "critical" else level


class ExitCode(enum.IntEnum):
    """How a worker ends; the daemon decides restart or FATAL from it."""

    OK = 0  # stopped on SIGTERM/SIGINT, or the lifeline closed
    INVALID = 2  # bad flags, a model the method cannot serve: never fixes itself
    FAILED = 3  # the model failed to load or the generation thread died: worth a restart
    PORT_IN_USE = 4  # cannot listen on --host/--port now (held, or not this machine's address yet): the daemon waits


class ProtocolError(ValueError):
    """A line or document that does not follow this contract; the message says how."""


class ReadyPayload(TypedDict, total=False):
    """The JSON of the READY line (schema_version 1). `config` is the effective KVCacheConfig.to_dict()."""

    schema_version: int
    model: str  # the id /v1/models reports (an absolute path for a local model)
    method: str
    bits: int | None
    config: dict[str, Any]
    host: str
    port: int
    pid: int
    layer_caches: dict[str, int]  # cache class name -> number of layers using it
    batchable: bool
    trimmable: str
    storage: str
    auth: bool  # bearer token required
    endpoints: dict[str, str]
    kv_bytes_per_token: dict[str, Any]  # short form of kv_memory: bytes per token and the ratio at 4k
    kv_memory: dict[str, Any]  # fixed bytes, bytes per token (measured), totals at 4k/32k/max (derived);
    # a group's: the sum over its ranks (veloxd.distributed.kv_figures), each rank's own in distributed.ranks[].kv_memory
    distributed: dict[str, Any]  # a distributed group only: parallelism, world size, idle, per-rank figures
    # (ranks: [{rank, pid, host, kv_bytes_per_token, kv_memory, layer_caches, load_s}])
    memory: dict[str, Any]  # loaded weight bytes, Metal's recommended working set: the gateway's admission
    limits: dict[str, Any]  # the effective per-request limits (context length resolved)
    load_s: float
    warnings: list[str]  # what the loaded model tells about the method (e.g. qk-norm with sharp key codes)
    servers: list[str]  # the gateway's: the entries it routes to
    actions: bool  # the dashboard sidecar's: whether its action buttons are on (an API key is set)


# Every process the daemon supervises (model workers, the dashboard sidecar) sends these; a model
# worker also sends model, method and config, which the daemon checks against its entry.
REQUIRED_READY_KEYS = ("schema_version", "host", "port", "pid")


# A supervised sidecar (the gateway) reports events for the daemon's log as one JSON line each:
# `VELOXD_EVENT {"event": ..., "level": ..., ...}` on stdout.
EVENT_PREFIX = "VELOXD_EVENT "


# ---- READY line ---------------------------------------------------------------------------
def format_ready(payload: ReadyPayload) -> str:
    """The READY line (without newline): prefix, then compact sorted JSON on one line."""
    return READY_PREFIX + json.dumps(payload, sort_keys=True)


def is_ready_line(line: str) -> bool:
    return line.startswith(READY_PREFIX)


def parse_ready(line: str) -> ReadyPayload:
    """The payload of a READY line; ProtocolError naming what is wrong otherwise."""
    if not is_ready_line(line):
        raise ProtocolError(f"not a READY line (expected the prefix {READY_PREFIX!r})")
    try:
        payload = json.loads(line[len(READY_PREFIX) :])
    except json.JSONDecodeError as err:
        raise ProtocolError(f"READY line is not JSON: {err}") from None
    if not isinstance(payload, dict):
        raise ProtocolError("READY line is not a JSON object")
    missing = [k for k in REQUIRED_READY_KEYS if k not in payload]
    if missing:
        raise ProtocolError(f"READY line lacks {', '.join(missing)}")
    if payload["schema_version"] != READY_SCHEMA_VERSION:
        raise ProtocolError(
            f"READY schema_version {payload['schema_version']!r}; this veloxd reads {READY_SCHEMA_VERSION}"
        )
    return payload  # type: ignore[return-value]


def config_mismatch(asked: dict[str, Any], echoed: Any) -> str | None:
    """Why the worker's echoed KV config differs from the one it was given, or None if it matches."""
    if not isinstance(echoed, dict):
        return "the READY line has no config object"
    diffs = [  # every setting asked for must be echoed as asked; settings of other methods may be left out
        f"{key}: asked {asked[key]!r}, got {echoed.get(key)!r}"
        for key in sorted(asked)
        if echoed.get(key, _MISSING) != asked[key]
    ]
    if not diffs:
        return None
    shown = "; ".join(diffs[:3]) + (f"; and {len(diffs) - 3} more" if len(diffs) > 3 else "")
    return f"the worker runs a different KV config than asked ({shown})"


_MISSING = object()


# ---- the entry document (--entry-json) -----------------------------------------------------
# Every key of the worker's document, named as the `veloxd serve` flag it stands for (`port` is
# --port, `limit_max_tokens` --limit-max-tokens, `kv` the object --kv-json takes), with the JSON
# types it may hold. A key left out or null means the flag's default.
ENTRY_KEYS: dict[str, tuple[str, ...]] = {
    "model": ("string",),
    "kv": ("object",),
    "host": ("string", "null"),
    "port": ("integer", "null"),
    "adapter_path": ("string", "null"),
    "max_tokens": ("integer", "null"),
    "temp": ("number", "null"),
    "top_p": ("number", "null"),
    "prompt_cache_size": ("integer", "null"),
    "prompt_cache_bytes": ("integer", "string", "null"),  # bytes, or a size like "2G"
    "limit_max_tokens": ("integer", "null"),
    "limit_max_prompt_tokens": ("integer", "null"),
    "request_body_timeout": ("number", "null"),
    "max_body_bytes": ("integer", "string", "null"),
    "api_key_env": ("string", "null"),
    "served_name": ("array", "null"),  # of strings: --served-name repeated
    "distributed": ("string", "null"),
}
REQUIRED_ENTRY_KEYS = ("version", "model", "kv")


def entry_document(settings: dict[str, Any]) -> str:
    """The one-line JSON text passed with --entry-json: `settings` (keys of ENTRY_KEYS) and the
    version. Checked as the worker reads it, so a document the daemon writes is one it accepts."""
    document = {"version": ENTRY_DOCUMENT_VERSION, **settings}
    check_entry_document(document, ENTRY_JSON_FLAG)
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def read_entry_document(text: str) -> dict[str, Any]:
    """The settings of an --entry-json document (inline or a file): every key of ENTRY_KEYS, None
    where the document leaves it out; ProtocolError naming the key otherwise."""
    document, source = _json_object(text, ENTRY_JSON_FLAG, "the worker's settings")
    check_entry_document(document, source)
    settings = {key: document.get(key) for key in ENTRY_KEYS}
    for key, kinds in ENTRY_KEYS.items():  # 30 is a number too: as float as the flag would make it
        value = settings[key]
        if kinds[0] == "number" and isinstance(value, int):
            settings[key] = float(value)
    return settings


def check_entry_document(document: dict[str, Any], source: str) -> None:
    """ProtocolError naming the first key that is unknown, missing or of the wrong type, or the version."""
    unknown = sorted(set(document) - set(ENTRY_KEYS) - {"version"})
    if unknown:
        close = difflib.get_close_matches(unknown[0], ENTRY_KEYS, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else f" (keys: version, {', '.join(ENTRY_KEYS)})"
        raise ProtocolError(f"{source}: unknown key {unknown[0]!r}{hint}")
    missing = [key for key in REQUIRED_ENTRY_KEYS if document.get(key) is None]
    if missing:
        raise ProtocolError(f"{source}: missing key {missing[0]!r} (required: {', '.join(REQUIRED_ENTRY_KEYS)})")
    if document["version"] != ENTRY_DOCUMENT_VERSION:
        raise ProtocolError(f"{source}: version {document['version']!r}; this veloxd reads {ENTRY_DOCUMENT_VERSION}")
    for key, kinds in ENTRY_KEYS.items():
        value = document.get(key)
        if json_kind(value) not in kinds and not (json_kind(value) == "integer" and "number" in kinds):
            raise ProtocolError(f"{source}: {key} must be {' or '.join(kinds)}, not {json.dumps(value)}")
        if kinds[0] == "array" and value is not None and not all(isinstance(item, str) for item in value):
            raise ProtocolError(f"{source}: {key} must be an array of strings, not {json.dumps(value)}")


# ---- the KV document (--kv-json, by hand) --------------------------------------------------
def read_kv_document(text: str) -> dict[str, Any]:
    """The JSON object given with --kv-json: inline (starts with '{' or '[') or the path of a file holding it."""
    return _json_object(text, KV_JSON_FLAG, "KV-cache settings")[0]


def _json_object(text: str, flag: str, what: str) -> tuple[dict[str, Any], str]:
    """The JSON object `text` holds, inline (starts with '{' or '[') or in the file it names, and how to
    name its source in an error ("--flag" or "--flag PATH")."""
    source = flag
    if not text.lstrip().startswith(("{", "[")):
        path = Path(text).expanduser()
        try:
            text = path.read_text()
        except OSError as err:
            raise ProtocolError(f"{flag} {path}: cannot read ({err.strerror or err})") from None
        source = f"{flag} {path}"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ProtocolError(f"{source}: not JSON ({err})") from None
    if not isinstance(data, dict):
        raise ProtocolError(f"{source}: expected a JSON object of {what}, not {type(data).__name__}")
    return data, source
