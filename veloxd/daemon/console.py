"""Log events for a person at a terminal: structlog's console renderer over a compacted event.

The JSON log keeps every key of every event (for jq and tools); the console shows the time,
level, event, server and the few keys that tell what happened. Bulky values (a READY payload,
a reload plan, a worker's last lines) are summarised on the line or printed below it.
Used by `veloxd run` on a terminal and by `veloxd logs --pretty` (same rendering of the same events).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TextIO

import structlog
from structlog.dev import Column, ConsoleRenderer, KeyValueColumnFormatter, LogLevelColumnFormatter

from veloxd.daemon.process import exit_account

# Keys never shown on the console: the event name already says them, or they only matter to tools.
HIDDEN = frozenset(
    {
        "from_state",
        "state",
        "argv",
        "worker_command",
        "control_socket",
        "state_dir",
        "config_sha256",
        "kept_config_sha256",
        "errors",
        "exit",
        "expected",
        "stream",
        "logger",
    }
)
MAX_VALUE_CHARS = 80  # longer lists/mappings are left to the JSON log
READY_SHOWN = 60


def use_colors(stream: TextIO, environ: Mapping[str, str] | None = None) -> bool:
    """Colors on a terminal that supports them, unless NO_COLOR is set (https://no-color.org)."""
    env = os.environ if environ is None else environ
    if env.get("NO_COLOR"):
        return False
    if env.get("TERM") == "dumb":
        return False
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def short_time(timestamp: Any, with_date: bool) -> str:
    """The ISO-8601 UTC timestamp of the JSON log as local wall-clock time for a person."""
    if not isinstance(timestamp, str):
        return str(timestamp) if timestamp is not None else ""
    try:
        moment = datetime.fromisoformat(timestamp.replace("Z", "+00:00")).astimezone()
    except ValueError:
        return timestamp
    return moment.strftime("%Y-%m-%d %H:%M:%S" if with_date else "%H:%M:%S")


def _summary(event: dict[str, Any]) -> dict[str, Any]:
    """Short stand-ins for the bulky values some events carry."""
    out: dict[str, Any] = {}
    ready = event.get("ready")
    if isinstance(ready, dict):
        kv = ready.get("kv_bytes_per_token") or {}
        out["method"] = ready.get("method")
        if ready.get("bits") is not None:
            out["bits"] = ready["bits"]
        if isinstance(kv, dict) and kv.get("ratio") is not None:
            out["kv_ratio"] = kv["ratio"]
            if kv.get("tokens") is not None:  # the length the ratio is taken at
                out["kv_ratio_tokens"] = kv["tokens"]
            if kv.get("cap_tokens") is not None:  # an evicting cache: its per-token figure holds below this
                out["kv_capped_at_tokens"] = kv["cap_tokens"]
        url = (ready.get("endpoints") or {}).get("openai_base_url")
        if url:
            out["url"] = url
    plan = event.get("plan")
    if isinstance(plan, dict) and plan.get("summary"):
        out["plan"] = plan["summary"]
    exit_info = event.get("exit")
    if isinstance(exit_info, dict) and event.get("event") == "server_stopped":
        out["exit"] = exit_info.get("signal") or f"code {exit_info.get('code')}"
    return out


def _below(event: dict[str, Any]) -> list[str]:
    """Lines printed under the event: config errors. A worker's stderr tail (`last_lines`) is not:
    each of its lines was printed as it came (server_output); repeating it under server_exited and
    again under server_backoff/server_fatal printed a traceback three times."""
    lines = event.get("error_lines")
    return [str(line) for line in lines] if isinstance(lines, list) else []


def _last_error(event: dict[str, Any]) -> str | None:
    """The last notable line a worker wrote to stderr before an unexpected exit: the exception, usually."""
    tail = event.get("last_lines")
    if event.get("event") != "server_exited" or not isinstance(tail, dict) or event.get("expected", False):
        return None
    return exit_account(tail)


def compact(event: Mapping[str, Any], *, with_date: bool = False) -> dict[str, Any]:
    """The event as the console shows it: timestamp, level, event, server, then a few keys."""
    out: dict[str, Any] = {
        "timestamp": short_time(event.get("timestamp"), with_date),
        "level": event.get("level", "info"),
        "event": event.get("event", ""),
    }
    if event.get("server") is not None:
        out["server"] = event["server"]
    if event.get("event") == "server_output":
        line = str(event.get("line", ""))
        # The READY line is summarised by server_ready right after; its JSON is for the log file.
        out["line"] = (
            line[:READY_SHOWN] + " …" if line.startswith("VELOXD_READY ") and len(line) > READY_SHOWN else line
        )
        return out
    logger = event.get("logger")
    if isinstance(logger, str) and not logger.startswith("veloxd"):
        out["logger"] = logger  # foreign loggers (watchdog, asyncio) say who spoke
    summary = _summary(dict(event))
    for key, value in event.items():
        if key in out or key in HIDDEN or key in ("ready", "plan", "error_lines", "last_lines", "exception"):
            continue
        if value is None or value == "":
            continue
        if isinstance(value, (dict, list)) and len(json.dumps(value, default=str)) > MAX_VALUE_CHARS:
            continue
        out[key] = value
    out.update({k: v for k, v in summary.items() if v is not None})
    last_error = _last_error(dict(event))
    if last_error is not None:
        out["last_error"] = last_error
    below = _below(dict(event))
    exception = event.get("exception")
    if isinstance(exception, list):  # structlog's dict_tracebacks form, as stored in the JSON log
        below += [
            f"{frame.get('exc_type')}: {frame.get('exc_value')}" for frame in exception if isinstance(frame, dict)
        ]
    elif isinstance(exception, str):
        below.append(exception)
    if below:
        out["exception"] = "\n".join("    " + line for part in below for line in part.splitlines())
    return out


def renderer(colors: bool) -> ConsoleRenderer:
    """structlog's ConsoleRenderer with the server name and a worker's output line given columns."""
    styles = ConsoleRenderer.get_default_column_styles(colors)
    levels = {name: style + styles.bright for name, style in ConsoleRenderer.get_default_level_styles(colors).items()}

    def plain(style: str, width: int = 0, key: bool = False) -> KeyValueColumnFormatter:
        return KeyValueColumnFormatter(
            key_style=styles.kv_key if key else None,
            value_style=style,
            reset_style=styles.reset,
            value_repr=str,
            width=width,
        )

    default = KeyValueColumnFormatter(
        key_style=styles.kv_key, value_style=styles.kv_value, reset_style=styles.reset, value_repr=_value_text
    )
    return ConsoleRenderer(
        sort_keys=False,
        columns=[
            Column("", default),
            Column("timestamp", plain(styles.timestamp)),
            Column("level", LogLevelColumnFormatter(levels, reset_style=styles.reset)),
            Column("event", plain(styles.bright, width=22)),
            Column("server", plain(styles.bright + styles.logger_name, key=True)),
            Column("logger", plain(styles.logger_name, key=True)),
            Column("line", plain("")),
        ],
    )


def _value_text(value: object) -> str:
    if isinstance(value, str):
        return repr(value) if not value or set(value) & {" ", "\t", "=", "\n", '"', "'"} else value
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str, separators=(",", ":"))
    return str(value)


class ConsoleProcessor:
    """A ProcessorFormatter processor: compact the event, then render it for a terminal."""

    def __init__(self, colors: bool, with_date: bool = False) -> None:
        self._render = renderer(colors)
        self._with_date = with_date

    def __call__(self, logger: Any, name: str, event_dict: structlog.typing.EventDict) -> str:
        return self.render(event_dict)

    def render(self, event: Mapping[str, Any]) -> str:
        return self._render(None, "", compact(event, with_date=self._with_date))


def summary_text(event: Mapping[str, Any]) -> str:
    """The event's few keys as plain `key=value` text (a worker's output: its line), without time,
    level, event or server: what the dashboard's log tail shows next to those."""
    short = compact(event)
    if "line" in short:
        return str(short["line"])
    skip = ("timestamp", "level", "event", "server", "exception")
    text = " ".join(f"{key}={_value_text(value)}" for key, value in short.items() if key not in skip)
    return text + ("\n" + short["exception"] if "exception" in short else "")


def pretty_line(line: str, processor: ConsoleProcessor) -> str:
    """One line of the JSON log rendered for a person (a line that is not JSON stays as it is)."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError:
        return line
    return processor.render(record) if isinstance(record, dict) else line
