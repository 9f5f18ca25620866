"""The pure pieces: console compaction of events, the worker's counters, READY's method-only config."""

from __future__ import annotations

import io
from typing import Any

from veloxd.daemon.console import ConsoleProcessor, compact, pretty_line, summary_text, use_colors
from veloxd.kv import KVCacheConfig
from veloxd.serve.stats import RequestStats


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


READY_EVENT: dict[str, Any] = {
    "server": "coder",
    "pid": 7,
    "from_state": "starting",
    "state": "ready",
    "startup_s": 3.2,
    "ready": {
        "method": "kivi",
        "bits": 2,
        "kv_bytes_per_token": {"method": 96.0, "fp16": 512.0, "ratio": 0.1875, "tokens": 4096},
        "endpoints": {"openai_base_url": "http://127.0.0.1:8081/v1"},
        "config": {"kivi_group_size": 32},
    },
    "event": "server_ready",
    "level": "info",
    "logger": "veloxd.server",
    "timestamp": "2026-11-30T08:00:00.5Z",
}


def test_compact_summarises_bulky_values_and_keeps_the_few_keys() -> None:
    short = compact(READY_EVENT)
    assert list(short)[:4] == ["timestamp", "level", "event", "server"]
    assert short["kv_ratio"] == 0.1875 and short["bits"] == 2 and short["url"] == "http://127.0.0.1:8081/v1"
    assert "ready" not in short and "from_state" not in short and "logger" not in short
    capped = {
        **READY_EVENT,
        "ready": {**READY_EVENT["ready"], "kv_bytes_per_token": {"ratio": 0.05, "tokens": 4096, "cap_tokens": 256}},
    }
    assert (compact(capped)["kv_ratio_tokens"], compact(capped)["kv_capped_at_tokens"]) == (4096, 256)
    assert (
        summary_text(READY_EVENT)
        == "pid=7 startup_s=3.2 method=kivi bits=2 kv_ratio=0.1875 kv_ratio_tokens=4096 url=http://127.0.0.1:8081/v1"
    )


def test_config_errors_go_below_the_line_and_a_crash_shows_its_last_error_once() -> None:
    failed = {
        "event": "config_reload_failed",
        "level": "error",
        "timestamp": "2026-11-30T08:00:00Z",
        "errors": [{"line": 3}],
        "error_lines": ["veloxd.yaml:3:5: unknown method 'kivy'"],
    }
    text = ConsoleProcessor(colors=False).render(failed)
    first, second = text.splitlines()
    assert "config_reload_failed" in first and "errors" not in first
    assert second == "    veloxd.yaml:3:5: unknown method 'kivy'"
    exited = {
        "event": "server_exited",
        "level": "warning",
        "server": "a",
        "expected": False,
        "code": 3,
        "last_lines": {"stdout": ["noise"], "stderr": ["Traceback", "ValueError: boom"]},
    }
    # The stderr lines were printed as they came (server_output): the exit names the last one only.
    shown = ConsoleProcessor(colors=False).render(exited).splitlines()
    assert len(shown) == 1 and shown[0].endswith("last_error='ValueError: boom'"), shown
    fatal = {**exited, "event": "server_fatal", "reason": "5 failures within 300s"}
    assert len(ConsoleProcessor(colors=False).render(fatal).splitlines()) == 1
    stopped = {**exited, "expected": True}
    assert len(ConsoleProcessor(colors=False).render(stopped).splitlines()) == 1
    assert "last_error" not in ConsoleProcessor(colors=False).render(stopped)
    killed = {**exited, "code": None, "signal": "SIGKILL", "last_lines": {"stderr": ["ValueError: old", "INFO loaded"]}}
    assert ConsoleProcessor(colors=False).render(killed).endswith("last_error='ValueError: old'")
    routine = {**killed, "last_lines": {"stderr": ["INFO kv_figure_saved path=/x", "DEBUG y"]}}
    assert "last_error" not in ConsoleProcessor(colors=False).render(routine)  # progress is no cause


def test_output_lines_are_shown_raw_and_the_ready_json_cut_short() -> None:
    line = "VELOXD_READY " + "{" + '"x": 1, ' * 40 + "}"
    shown = compact({"event": "server_output", "server": "a", "line": line, "stream": "stdout", "pid": 1})
    assert shown["line"].endswith(" …") and len(shown["line"]) < 70 and "pid" not in shown
    rendered = pretty_line(
        '{"event": "server_output", "server": "a", "line": "INFO: loading", "level": "info"}',
        ConsoleProcessor(colors=False),
    )
    assert rendered.endswith("server=a INFO: loading")
    assert pretty_line("not json", ConsoleProcessor(colors=False)) == "not json"


def test_colors_only_on_a_terminal_without_no_color() -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    assert use_colors(Tty(), {"TERM": "xterm"}) is True
    assert use_colors(Tty(), {"TERM": "xterm", "NO_COLOR": "1"}) is False
    assert use_colors(Tty(), {"TERM": "dumb"}) is False
    assert use_colors(io.StringIO(), {}) is False
    assert "\x1b[" in ConsoleProcessor(colors=True).render(READY_EVENT)
    assert "\x1b[" not in ConsoleProcessor(colors=False).render(READY_EVENT)


def test_request_stats_count_statuses_tokens_and_time() -> None:
    clock = FakeClock()
    stats = RequestStats(clock)
    timer = stats.begin()
    assert stats.to_dict()["in_flight"] == 1
    timer.prompt(12)
    clock.now += 0.2
    tokens = timer.tokens(iter("abcd"))
    assert next(tokens) == "a"  # the first token is timed when it arrives
    clock.now += 1.0
    assert list(tokens) == ["b", "c", "d"]
    timer.finish(200)
    timer.finish(200)  # once only
    stats.begin().finish(404)
    data = stats.to_dict(queued=0)
    assert data["requests"] == {"200": 1, "404": 1} and data["in_flight"] == 0
    assert data["generated_tokens"] == 4 and data["prompt_tokens"] == 12
    assert data["ttft_s"]["count"] == 1 and data["ttft_s"]["sum"] == 0.2
    assert dict((str(b), n) for b, n in data["ttft_s"]["buckets"])["0.25"] == 1
    assert dict((str(b), n) for b, n in data["ttft_s"]["buckets"])["0.1"] == 0
    assert data["latency_s"]["count"] == 2 and data["latency_s"]["buckets"][-1] == ["+Inf", 2]


def test_ready_config_carries_only_the_chosen_methods_fields() -> None:
    config = KVCacheConfig(method="kivi", bits=2).applied()  # what veloxd.serve.worker puts in READY
    assert config["method"] == "kivi" and config["bits"] == 2 and "kivi_group_size" in config
    assert not [key for key in config if key.startswith(("h2o", "snapkv", "tova", "turbo", "qjl"))]
