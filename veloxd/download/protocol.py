"""What the download step (`veloxd pull --progress-json`) tells the daemon: lines and exit codes.

Stdlib only. Every machine-readable line on the step's stdout is `VELOXD_DOWNLOAD {json}`, one
JSON object with an `event` key:

- `plan`: `model`, `revision` (commit), `files`, `total_bytes` (the files mlx_lm loads),
  `local_bytes` (already on disk, partial files included: a resumed download starts there)
- `progress`: `done_bytes` (counted as bytes arrive), `total_bytes`, `rate_bps` (over the last
  seconds; 0 until bytes have flowed for a few seconds), `eta_s` (null while the rate is 0)
- `done`: `model`, `revision`, `path` (the snapshot directory), `total_bytes`, `fetched_bytes`
  (transferred by this run), `seconds`
- `failed`: `reason` (one of REASONS), `message` (names the model and what to do)

The exit code carries the verdict: 0 complete, EXIT_FATAL when retrying cannot help (the
`failed` line says why), EXIT_RETRY for network trouble; anything else is a crash (retried).
"""

from __future__ import annotations

import json
from typing import Any, Final

PREFIX: Final = "VELOXD_DOWNLOAD "
EXIT_OK: Final = 0
EXIT_FATAL: Final = 2  # same meaning as the worker's 2: invalid input that no retry fixes
EXIT_RETRY: Final = 75  # EX_TEMPFAIL: the network failed; back off and try again

# reason -> fatal? (fatal reasons end the phase in FATAL at once; the others back off)
REASONS: Final = {
    "not_found": True,  # no such repository (or private and invisible to the token in use)
    "gated": True,  # gated repository: terms not accepted, or no token of an account that did
    "unauthorized": True,  # the token was refused (401/403)
    "no_space": True,  # the files do not fit on the cache's file system
    "offline": True,  # HF_HUB_OFFLINE=1 and the model is not complete in the cache
    "network": False,  # the hub could not be reached or failed (5xx, 429, timeouts)
    "error": False,  # anything else: treated as a crash
}


def format_line(event: str, **fields: Any) -> str:
    """One protocol line (without the newline)."""
    return PREFIX + json.dumps({"event": event, **fields}, separators=(",", ":"))


def parse_line(line: str) -> dict[str, Any] | None:
    """The JSON object of a protocol line, or None for any other line (or a malformed one)."""
    if not line.startswith(PREFIX):
        return None
    try:
        payload = json.loads(line[len(PREFIX) :])
    except json.JSONDecodeError:
        return None
    return payload if isinstance(payload, dict) and isinstance(payload.get("event"), str) else None


def exit_code_for(reason: str) -> int:
    return EXIT_FATAL if REASONS.get(reason, False) else EXIT_RETRY if reason == "network" else 1


def percent(done: int, total: int) -> float:
    """Completion in percent, one decimal; an empty download is complete."""
    return 100.0 if total <= 0 else round(min(100.0, 100.0 * done / total), 1)
