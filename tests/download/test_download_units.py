"""The pure parts of the download phase: protocol lines, progress arithmetic and throttling with
a fake clock, the cache completeness check, and the file patterns mlx_lm loads."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from veloxd.daemon.download import DownloadPhase, needs_download, worker_hub_env
from veloxd.download import cache
from veloxd.download.progress import RATE_MIN_SPAN_S, RATE_WINDOW_S, Meter, human_bytes, should_report, summary
from veloxd.download.protocol import EXIT_FATAL, EXIT_RETRY, REASONS, exit_code_for, format_line, parse_line, percent


def test_protocol_lines_round_trip_and_other_lines_are_not_events() -> None:
    line = format_line("progress", done_bytes=5, total_bytes=10)
    assert line.startswith("VELOXD_DOWNLOAD ") and "\n" not in line
    assert parse_line(line) == {"event": "progress", "done_bytes": 5, "total_bytes": 10}
    for other in (
        "Fetching 7 files",
        "VELOXD_DOWNLOAD {broken",
        'VELOXD_DOWNLOAD ["list"]',
        'VELOXD_DOWNLOAD {"x": 1}',
    ):
        assert parse_line(other) is None


def test_exit_codes_follow_the_reason() -> None:
    fatal = {r for r, is_fatal in REASONS.items() if is_fatal}
    assert fatal == {"not_found", "gated", "unauthorized", "no_space", "offline"}
    assert {exit_code_for(r) for r in fatal} == {EXIT_FATAL}
    assert exit_code_for("network") == EXIT_RETRY and exit_code_for("error") == 1


def test_percent_and_summary() -> None:
    assert percent(0, 0) == 100.0 and percent(1, 3) == 33.3 and percent(5, 4) == 100.0
    assert human_bytes(999) == "999 B" and human_bytes(1_500_000) == "1.5 MB" and human_bytes(2.5e9) == "2.5 GB"
    assert summary(1_200_000_000, 2_900_000_000, 12e6, 130) == "41.4% 1.2 GB of 2.9 GB, 12.0 MB/s, ~2m10s left"
    assert summary(0, 10, 0, None) == "0.0% 0 B of 10 B"


def test_meter_rate_follows_the_last_seconds() -> None:
    meter = Meter(total=100_000_000)
    for second in range(0, 11):  # 1 MB/s for 10 s
        meter.update(float(second), second * 1_000_000)
    assert meter.rate() == pytest.approx(1_000_000)
    for second in range(11, 21):  # then 5 MB/s: the window forgets the slow part
        meter.update(float(second), 10_000_000 + (second - 10) * 5_000_000)
    assert meter.rate() == pytest.approx(5_000_000)
    assert meter.eta() == pytest.approx((100_000_000 - 60_000_000) / 5_000_000)


def _link(rate: float, first_byte_at: float, piece: int = 32 * 1024) -> Callable[[float], int]:
    """Bytes arrived by time t on a steady link whose first byte comes at `first_byte_at`, in
    whole `piece`s (the stand-in hub writes 32 KiB at a time; a network read brings what is there)."""
    return lambda t: 0 if t < first_byte_at else int((t - first_byte_at) * rate) // piece * piece


def test_meter_is_right_from_its_first_figure_when_the_first_byte_comes_late() -> None:
    """Listing and connecting take 3.4 s, then 200 kB/s: no figure until bytes have flowed for
    RATE_MIN_SPAN_S, then the rate within 10 % and the ETA within 10 % of the real time left.
    (Counting the 3.4 s of waiting showed ~35 kB/s and ~4 min left for a 42 s download.)"""
    total, rate = 8_274_563, 200_000.0
    arrived = _link(rate, first_byte_at=3.4)
    meter = Meter(total)
    meter.update(0.0, 0)  # the plan: the reference
    shown = []
    for tick in range(1, 42):  # a progress line a second, as `veloxd pull` writes them
        now = float(tick)
        meter.update(now, arrived(now))
        if meter.rate() == 0:
            assert meter.eta() is None, tick  # no ETA without a rate
        else:
            shown.append((now, meter.rate(), meter.eta()))
    for now, measured, eta in shown:
        assert measured == pytest.approx(rate, rel=0.10), now
        real_left = 3.4 + total / rate - now
        assert eta is not None and eta == pytest.approx(real_left, rel=0.10, abs=1.0), now
    first_at = shown[0][0]
    assert 3.4 + RATE_MIN_SPAN_S <= first_at <= 3.4 + RATE_MIN_SPAN_S + 2  # the first tick with bytes, + the span
    assert len(shown) == 41 - first_at + 1  # from then on, every line has a figure


def test_meter_opens_a_new_window_when_the_count_goes_back() -> None:
    """A file that had to start over drops the count: the rate is measured afresh, never across
    the drop (which showed 0 B/s for a whole window)."""
    meter = Meter(100_000_000)
    meter.update(0.0, 0)
    for second in range(1, 11):
        meter.update(float(second), second * 1_000_000)
    assert meter.rate() == pytest.approx(1_000_000)
    meter.update(10.5, 2_000_000)  # 8 MB counted back
    assert meter.rate() == 0 and meter.eta() is None
    restarted = [(10.5 + s, 2_000_000 + s * 2_000_000) for s in range(1, int(RATE_MIN_SPAN_S) + 2)]
    for now, done in restarted:
        meter.update(now, done)
    assert restarted[-1][0] - 10.5 < RATE_WINDOW_S  # still within a window of the drop
    assert meter.rate() == pytest.approx(2_000_000)


def test_events_are_throttled_to_percent_steps_or_ten_seconds() -> None:
    assert should_report(None, 0.0, 0.0, 0.0)  # the first one
    assert not should_report(0.0, 0.0, 0.5, 50.0)  # never twice within a second
    assert should_report(0.0, 4.9, 1.0, 5.0)  # a new 5 % step
    assert not should_report(0.0, 5.0, 9.9, 9.9)  # same step, quiet for less than 10 s
    assert should_report(0.0, 5.0, 10.0, 5.1)  # 10 s of silence


def test_download_phase_turns_lines_into_throttled_events() -> None:
    phase = DownloadPhase(now=100.0)
    assert phase.progress()["percent"] == 0.0  # nothing listed yet is not "complete"
    events = []
    lines = [{"event": "plan", "revision": "abc", "files": 3, "total_bytes": 1000, "local_bytes": 200}]
    lines += [{"event": "progress", "done_bytes": 200 + 8 * i, "total_bytes": 1000} for i in range(1, 101)]
    for i, line in enumerate(lines):  # one line every 0.5 s
        if (event := phase.on_line(line, 100.0 + i / 2)) is not None:
            events.append(event)
    assert 1 < len(events) < len(lines) / 4
    assert events[0]["done_bytes"] == 200 and events[0]["total_bytes"] == 1000
    assert events[-1]["percent"] <= 100.0 and events[-1]["rate_bps"] == pytest.approx(16, rel=0.01)
    phase.on_line({"event": "done", "total_bytes": 1000, "fetched_bytes": 800, "revision": "abc", "path": "/x"}, 160)
    assert phase.finished(160.0) == {
        "size_bytes": 1000,
        "fetched_bytes": 800,
        "resumed_from_bytes": 200,
        "download_s": 60.0,
        "revision": "abc",
        "path": "/x",
    }


def test_download_phase_names_a_crash_without_a_verdict() -> None:
    phase = DownloadPhase(now=0.0)
    assert phase.failure_reason({"code": None, "signal": "SIGKILL"})[0] == "error"
    assert "killed by SIGKILL" in phase.failure_reason({"code": None, "signal": "SIGKILL"})[1]
    phase.on_line({"event": "failed", "reason": "gated", "message": "accept the terms"}, 1.0)
    assert phase.failure_reason({"code": 2, "signal": None}) == ("gated", "accept the terms")


def test_allow_patterns_are_mlx_lms() -> None:
    from mlx_lm.utils import DEFAULT_ALLOW_PATTERNS

    assert list(cache.ALLOW_PATTERNS) == DEFAULT_ALLOW_PATTERNS
    chosen = [
        p
        for p in (
            "config.json",
            "model-00001-of-00002.safetensors",
            "consolidated.safetensors",
            "README.md",
            "tokenizer.model",
            "chat_template.jinja",
            "pytorch_model.bin",
        )
        if cache.wanted(p)
    ]
    assert chosen == ["config.json", "model-00001-of-00002.safetensors", "tokenizer.model", "chat_template.jinja"]


def test_cache_dir_follows_huggingface_hubs_variables(tmp_path: Path) -> None:
    assert cache.hub_cache_dir({"HF_HUB_CACHE": "/a", "HF_HOME": "/b"}) == Path("/a")
    assert cache.hub_cache_dir({"HF_HOME": "/b"}) == Path("/b/hub")
    assert cache.hub_cache_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/huggingface/hub")
    assert cache.offline({"HF_HUB_OFFLINE": "1"}) and cache.offline({"TRANSFORMERS_OFFLINE": "yes"})
    assert not cache.offline({"HF_HUB_OFFLINE": "0"}) and not cache.offline({})


def _snapshot(root: Path, files: dict[str, str], listed: list[str] | None) -> Path:
    repo = root / "hub" / "models--o--m"
    commit = "c" * 40
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True)
    for name, text in files.items():
        (snap / name).write_text(text)
    if listed is not None:
        (repo / "trees").mkdir()
        (repo / "trees" / f"{commit}.json").write_text(
            json.dumps({"format_version": 1, "files": {p: {"size": 1, "blob_id": "x"} for p in listed}})
        )
    return snap


def test_local_snapshot_is_exact_with_a_tree_listing(tmp_path: Path) -> None:
    env = {"HF_HOME": str(tmp_path)}
    snap = _snapshot(
        tmp_path,
        {"config.json": "{}", "tokenizer.json": "{}"},
        ["config.json", "tokenizer.json", "model.safetensors", "README.md"],
    )
    assert cache.local_snapshot("o/m", env) is None and needs_download("o/m", env)  # weights missing
    (snap / "model.safetensors").write_text("w")
    assert cache.local_snapshot("o/m", env) == snap and not needs_download("o/m", env)  # README.md is not needed


def test_local_snapshot_without_a_listing_checks_config_tokenizer_and_indexed_shards(tmp_path: Path) -> None:
    env = {"HF_HOME": str(tmp_path)}
    index = json.dumps({"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}})
    snap = _snapshot(
        tmp_path,
        {
            "config.json": "{}",
            "tokenizer.json": "{}",
            "model.safetensors.index.json": index,
            "model-1.safetensors": "w",
        },
        None,
    )
    assert cache.local_snapshot("o/m", env) is None
    (snap / "model-2.safetensors").write_text("w")
    assert cache.local_snapshot("o/m", env) == snap
    assert cache.local_snapshot("o/other", env) is None


def test_only_hub_models_download_and_workers_of_hub_models_stay_offline(tmp_path: Path) -> None:
    assert cache.is_hub_model("mlx-community/Qwen2.5-0.5B-Instruct-4bit")
    assert not cache.is_hub_model(str(tmp_path)) and not cache.is_hub_model("../up/x")
    assert not needs_download(str(tmp_path), {})
    assert worker_hub_env("o/m") == {"HF_HUB_OFFLINE": "1"} and worker_hub_env(str(tmp_path)) == {}
