"""`affine`: packed triples, separate key bits, Hadamard rotation, memory, exact trim/chunking."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import mlx.core as mx
import pytest
from mlx_lm.models.cache import KVCache

from tests.kv.support import DIM, HEADS, SCALE, data, fresh, greedy, prefill, reference_attention, rel
from veloxd.kv.base import LayerSpec
from veloxd.kv.config import KVCacheConfig
from veloxd.kv.ops.hadamard import Rotation, hadamard_block
from veloxd.kv.quant.affine import AffineCache, quantize_fp16


def cache(bits: int = 4, **fields: Any) -> AffineCache:
    return AffineCache(KVCacheConfig(method="affine", bits=bits, **fields), LayerSpec(0, 1))


def attention_error(q: mx.array, k: mx.array, v: mx.array, bits: int, **fields: Any) -> float:
    c = cache(bits, **fields)
    c.update_and_fetch(k, v)
    return rel(c.attend(q, SCALE, "causal"), reference_attention(q, k, v, SCALE, "causal"))


@pytest.mark.parametrize("bits", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("group", [32, 64, 128])
def test_reconstruction_error_is_bounded(bits: int, group: int) -> None:
    _, k, _ = data(256)
    codes, scales, biases = quantize_fp16(k, group, bits)
    assert scales.dtype == mx.float16  # 32 bits of metadata per group even in fp32 compute
    restored = mx.dequantize(codes, scales, biases, group_size=group, bits=bits).astype(mx.float32)
    # uniform quantizer on Gaussian groups: rms error ~ range / (2^b - 1) / sqrt(12), range <= ~5.5 sigma
    assert rel(restored, k) < 1.7 / (2**bits - 1)


def test_attention_error_on_random_data() -> None:
    q, k, v = data()
    assert attention_error(q, k, v, 8) < 0.01
    assert attention_error(q, k, v, 4) < 0.15
    assert attention_error(q, k, v, 2) < 0.6


def test_rotation_spreads_outlier_key_channels() -> None:
    q, k, v = data(outliers=True)
    plain = attention_error(q, k, v, 4, affine_rotate=False)
    rotated = attention_error(q, k, v, 4, affine_rotate=True)
    assert rotated < 0.7 * plain, (rotated, plain)
    assert rotated < 0.3
    assert attention_error(q, k, v, 8, affine_rotate=True) < 0.02


def test_wider_keys_cut_the_error_and_cost_their_bits() -> None:
    q, k, v = data(outliers=True)
    assert attention_error(q, k, v, 4, affine_key_bits=8) < 0.5 * attention_error(q, k, v, 4)
    k8v4 = cache(4, affine_key_bits=8)
    k8v4.update_and_fetch(k, v)
    assert k8v4.codec is not None  # built by the first append
    assert k8v4.codec.bits_per_token() / (k8v4.codec.k_dim + k8v4.codec.v_dim) == pytest.approx(
        ((8 + 0.5) + (4 + 0.5)) / 2
    )
    assert not hasattr(k8v4, "bits")


@pytest.mark.parametrize("dim", [128, 96, 80, 72])
def test_rotation_is_orthogonal_and_reproducible(dim: int) -> None:
    x = mx.random.normal((3, 5, dim))
    rot = Rotation(dim, seed=7, layer_index=2)
    y = rot.apply(x)
    assert float(mx.abs(mx.linalg.norm(y, axis=-1) - mx.linalg.norm(x, axis=-1)).max()) < 1e-3
    assert float(mx.abs(rot.invert(y) - x).max()) < 1e-4
    assert mx.array_equal(Rotation(dim, 7, 2).signs, rot.signs)
    assert not mx.array_equal(Rotation(dim, 7, 3).signs, rot.signs)  # per layer
    assert dim % hadamard_block(dim) == 0


def test_unsupported_hadamard_sizes_use_power_of_two_blocks() -> None:
    assert [hadamard_block(d) for d in (128, 96, 80, 72, 100)] == [128, 96, 80, 8, 4]


def test_group_size_must_divide_head_dim() -> None:
    c = cache(4, affine_group_size=64)
    with pytest.raises(ValueError, match="affine_group_size=64"):
        c.update_and_fetch(mx.zeros((1, 1, 2, 96)), mx.zeros((1, 1, 2, 96)))


def test_four_bit_stores_under_030x_of_fp16_at_1024_tokens() -> None:
    _, k, v = data(1024)
    k, v = k.astype(mx.float16), v.astype(mx.float16)
    fp16 = KVCache()
    fp16.update_and_fetch(k, v)
    ours = cache(4)
    for start in range(0, 1024, 128):
        ours.update_and_fetch(k[:, :, start : start + 128], v[:, :, start : start + 128])
        ours.attend(k[:, :, :1], DIM**-0.5, None)  # as a model step does: the window drops the read chunk
    assert ours.store is not None and ours.codec is not None  # built by the first append
    assert ours.offset == 1024 and ours.store["k_codes"].shape[2] == 1024  # no capacity padding
    held = sum(a.nbytes for a in ours.store.values())
    assert held / fp16.nbytes <= 0.30, held / fp16.nbytes
    # the recent window: exact fp16 keys and values of the newest tokens, plus one flag per slot
    B, H, _, D = k.shape
    window = ours.config.recent_window
    fixed = sum(a.nbytes for a in ours.codec.constants())  # the rotation's signs (affine_rotate)
    assert window > 0 and ours.nbytes == held + fixed + window * B * H * 2 * D * 2 + window * B


@pytest.mark.parametrize(
    "fields",
    [
        {"bits": 2},
        {"bits": 3},
        {"bits": 4},
        {"bits": 6},
        {"bits": 8},
        {"bits": 4, "affine_group_size": 32},
        {"bits": 4, "affine_group_size": 128},
        {"bits": 4, "affine_key_bits": 8},
        {"bits": 3, "affine_rotate": True},
    ],
)
def test_stored_bytes_follow_bits_plus_32_over_group(fields: dict[str, Any]) -> None:
    _, k, v = data(1024)
    c = AffineCache(KVCacheConfig(method="affine", recent_window=0, **fields), LayerSpec(0, 1))
    c.update_and_fetch(k, v)
    group = fields.get("affine_group_size", 64)
    key_bits = fields.get("affine_key_bits") or fields["bits"]
    analytic_bits = DIM * (key_bits + 32 / group) + DIM * (fields["bits"] + 32 / group)  # per token and head
    stored = c.nbytes - (DIM * 4 if c.config.affine_rotate else 0)  # minus the rotation signs
    assert abs(stored - HEADS * 1024 * analytic_bits / 8) <= 0.05 * stored


@pytest.fixture(scope="module")
def lm(tiny_model: Path) -> tuple[Any, list[int]]:
    from mlx_lm import load

    from testkit.tinymodel import corpus

    model, tokenizer = load(str(tiny_model))[:2]
    return model, tokenizer.encode(" ".join(corpus()[:2]))[:120]


def test_trim_and_chunking_are_exact_for_per_token_groups(lm: tuple[Any, list[int]]) -> None:
    model, prompt = lm
    # the codes alone (tests/kv/quant/test_window.py covers what a trim does to the recent window)
    trimmed = fresh(model, "affine", 4, affine_rotate=True, recent_window=0)
    prefill(model, trimmed, prompt, 120)
    for c in trimmed:
        c.trim(70)
    chunked = fresh(model, "affine", 4, affine_rotate=True, recent_window=0)
    prefill(model, chunked, prompt[:50], 7)
    tail = prompt[50:53]
    assert float(mx.abs(prefill(model, trimmed, tail, 3) - prefill(model, chunked, tail, 3)).max()) < 1e-4


def test_rotated_k8v4_decodes_like_fp16(lm: tuple[Any, list[int]]) -> None:
    from veloxd.kv.factory import native_caches

    model, prompt = lm
    reference, _ = greedy(model, native_caches(model), prompt, 8)
    tokens, _ = greedy(model, fresh(model, "affine", 4, affine_key_bits=8, affine_rotate=True), prompt, 8)
    assert tokens == reference
