"""READY's KV memory figure: the fp16 reference is exact arithmetic on the model's shapes, and a
figure measured once is read back on the next start of the same model files and KV settings
(`source: "cached"`), measured again when either changes, and never fails a start when the
state directory cannot be written."""

from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest

from veloxd import protocol
from veloxd.kv import KVCacheConfig
from veloxd.kv.factory import native_caches
from veloxd.kv.footprint import fp16_lines, kvcache_bytes, measure
from veloxd.kv.ops.packing import CAPACITY_STEP
from veloxd.serve.options import ServeOptions
from veloxd.serve.wiring import wire_caches
from veloxd.serve.worker import kept_figure

LENGTHS = (1, 100, 255, 256, 257, 511, 512, 700, 1100)


@pytest.fixture(scope="module")
def model_dir(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the tiny model whose files the tests may change (`model` holds the same weights, loaded)."""
    return Path(shutil.copytree(tiny_model, tmp_path_factory.mktemp("figures") / "model"))


def filled(model: Any, n: int) -> int:
    """Bytes mlx_lm's own caches hold after a prompt of n tokens, as mlx_lm prefills it."""
    caches = native_caches(model)
    tokens = (mx.arange(n) * 13 % model.args.vocab_size)[None]
    for start in range(0, n - 1, 512):
        model(tokens[:, start : min(start + 512, n - 1)], cache=caches)
        mx.eval([c.state for c in caches])
    model(tokens[:, n - 1 :], cache=caches)
    mx.eval([c.state for c in caches])
    return sum(c.nbytes for c in caches)


def test_fp16_reference_is_the_kvcache_formula_and_equals_a_filled_kvcache(model: Any) -> None:
    lines = fp16_lines(model)
    assert lines is not None
    args = model.args
    itemsize = model.layers[0].self_attn.k_proj.weight.dtype.size  # activations run in the weights' dtype
    per_token = args.num_hidden_layers * 2 * args.num_key_value_heads * args.head_dim * itemsize
    assert sum(line.per_token for line in lines) == per_token
    for n in LENGTHS:
        expected = per_token * CAPACITY_STEP * -(-n // CAPACITY_STEP)
        assert kvcache_bytes(lines, n) == expected == filled(model, n), n


def test_the_fp16_method_is_derived_without_probes(model: Any) -> None:
    figure = measure(model, KVCacheConfig(method="fp16")).to_dict()
    lines = fp16_lines(model)
    assert lines is not None
    assert figure["at"]["4096"] == {
        "method": kvcache_bytes(lines, 4096),
        "fp16": kvcache_bytes(lines, 4096),
        "ratio": 1.0,
    }
    assert figure["source"] == "measured" and "derived from the model's key/value shapes" in figure["how"]


def wired_figure(model: Any, model_dir: Path, kv: KVCacheConfig) -> dict[str, Any]:
    """The figure the worker's READY would carry, through the worker's own wiring."""
    return wire_caches(model, kv, kept_figure(ServeOptions(model=str(model_dir), kv=kv))).kv_memory


def without_label(figure: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in figure.items() if k not in ("source", "measured_at")}


def test_a_figure_is_reused_then_remeasured_when_settings_or_files_change(
    model: Any, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(protocol.STATE_DIR_ENV, str(tmp_path / "state"))
    kivi4, kivi2 = KVCacheConfig(method="kivi", bits=4), KVCacheConfig(method="kivi", bits=2)
    first = wired_figure(model, model_dir, kivi4)
    assert first["source"] == "measured"
    assert len(list((tmp_path / "state" / "kv-figures").glob("*.json"))) == 1
    second = wired_figure(model, model_dir, kivi4)
    assert second["source"] == "cached" and second["measured_at"]
    assert without_label(second) == without_label(first)

    other = wired_figure(model, model_dir, kivi2)  # KV settings changed
    assert other["source"] == "measured"
    assert other["bytes_per_token"]["method"] < first["bytes_per_token"]["method"]
    assert wired_figure(model, model_dir, kivi2)["source"] == "cached"

    config = model_dir / "config.json"  # the model's files changed (a rewritten file: new mtime)
    stat = config.stat()
    os.utime(config, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert wired_figure(model, model_dir, kivi4)["source"] == "measured"
    assert wired_figure(model, model_dir, kivi4)["source"] == "cached"
    (model_dir / "extra.safetensors").write_bytes(b"\0" * 8)  # a file added
    assert wired_figure(model, model_dir, kivi4)["source"] == "measured"


def test_an_unwritable_state_dir_is_a_logged_event_not_a_failure(
    model: Any, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state directory should be")
    monkeypatch.setenv(protocol.STATE_DIR_ENV, str(blocker))
    kv = KVCacheConfig(method="fp16")
    with caplog.at_level(logging.INFO, logger="veloxd.serve.figures"):
        assert wired_figure(model, model_dir, kv)["source"] == "measured"
        assert wired_figure(model, model_dir, kv)["source"] == "measured"  # nothing kept: measured again
    assert [r.getMessage().split()[0] for r in caplog.records] == ["kv_figure_unwritable"] * 2


def test_a_corrupt_kept_figure_is_measured_again_and_replaced(
    model: Any, model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv(protocol.STATE_DIR_ENV, str(tmp_path))
    kv = KVCacheConfig(method="fp16")
    assert wired_figure(model, model_dir, kv)["source"] == "measured"
    (kept,) = (tmp_path / "kv-figures").glob("*.json")
    kept.write_text("{not json")
    with caplog.at_level(logging.INFO, logger="veloxd.serve.figures"):
        assert wired_figure(model, model_dir, kv)["source"] == "measured"
    assert caplog.records[0].getMessage().startswith("kv_figure_unreadable")
    assert wired_figure(model, model_dir, kv)["source"] == "cached"


def test_a_worker_started_by_hand_keeps_figures_in_the_user_cache_dir(tmp_path: Path) -> None:
    from veloxd.serve.figures import state_dir

    assert state_dir({"XDG_CACHE_HOME": str(tmp_path)}) == tmp_path / "veloxd"
    assert state_dir({"HOME": "/h"}).name == "veloxd"
    assert state_dir({protocol.STATE_DIR_ENV: str(tmp_path / "s")}) == tmp_path / "s"


@pytest.mark.slow
def test_a_second_worker_start_reads_the_figure_back(tiny_model: Path, tmp_path: Path) -> None:
    from tests.support import Worker, free_port

    env = {protocol.STATE_DIR_ENV: str(tmp_path)}
    labels = []
    for _ in range(2):
        worker = Worker("--model", str(tiny_model), "--method", "fp16", "--port", str(free_port()), env=env)
        labels.append(worker.ready()["kv_memory"]["source"])
        assert worker.stop() == 0
    assert labels == ["measured", "cached"]
