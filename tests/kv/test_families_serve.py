"""`veloxd serve` on wrapper families: a SmolLM3-shaped and a Mistral-3-with-sliding-layers-shaped
model directory (testkit.families, random weights) reach READY with a compressed cache and answer
a completion; a Gemma-2-shaped one exits 2 before load with the true reason; a qk-norm family's
READY warns about sharp key codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from testkit.families import write_model_dir
from tests.support import Worker, free_port, http_json, run_veloxd, wait_until

pytestmark = pytest.mark.slow


@pytest.mark.parametrize(
    ("family", "layer_caches"),
    [
        ("smollm3", {"AffineCache": 4}),
        ("mistral3", {"RotatingKVCache": 2, "AffineCache": 2}),  # sliding layers keep mlx_lm's rotating cache
    ],
)
def test_wrapper_family_reaches_ready_and_answers(tmp_path: Path, family: str, layer_caches: dict[str, int]) -> None:
    model = write_model_dir(family, tmp_path / family)
    worker = Worker("--model", str(model), "--method", "affine", "--port", str(free_port()), "--max-tokens", "8")
    try:
        payload = worker.ready()
        assert payload["method"] == "affine"
        assert payload["layer_caches"] == layer_caches
        assert payload["warnings"] == []  # no qk-norm, and affine keys
        body = {"prompt": "def fibonacci(n): return", "max_tokens": 6, "temperature": 0.0}
        status, reply = http_json(payload["endpoints"]["completions"], body)
        assert status == 200, reply
        assert reply["usage"]["completion_tokens"] == 6
    finally:
        assert worker.stop() == 0


def test_gemma2_is_refused_before_load_for_soft_capping(tmp_path: Path) -> None:
    model = write_model_dir("gemma2", tmp_path / "gemma2")
    (model / "model.safetensors").write_bytes(b"not weights: reading this would fail the load differently")
    result = run_veloxd("serve", "--model", str(model), "--method", "kivi", "--port", str(free_port()))
    assert result.returncode == 2, result.stderr
    assert "model type 'gemma2' applies attention logit soft-capping" in result.stderr
    assert "Serve it with method fp16" in result.stderr
    assert "fused kernel" not in result.stderr and "Traceback" not in result.stderr


def test_ready_warns_when_a_qk_norm_model_gets_sharp_key_codes(tmp_path: Path) -> None:
    model = write_model_dir("qwen3", tmp_path / "qwen3")
    worker = Worker("--model", str(model), "--method", "qjl", "--port", str(free_port()))
    try:
        (warning,) = worker.ready()["warnings"]
        assert "model type 'qwen3' normalises queries and keys (qk-norm)" in warning
        # stderr is drained by its own thread: the line may land after READY's stdout line
        wait_until(lambda: f"veloxd serve: warning: {warning}" in worker.stderr, 60, what="the stderr warning")
    finally:
        assert worker.stop() == 0
