"""What one decode step's reads cost per element in MLX's kernels on this device, side by side.

A decode step of every cache is a few reads over all stored tokens: scores (queries times the keys,
contracted over the head dimension) and the weighted sum (weights times the values, contracted
over the tokens). This measures each read form alone, at the speed benchmark's shape (2 KV heads,
4 query rows each, head_dim 128, `--tokens` cached tokens), as nanoseconds per stored element:
- dense: a float32 matmul (what the fp16 cache and eviction slots read);
- packed b-bit codes through `mx.quantized_matmul` (mlx_lm's QuantizedKVCache, affine, KIVI,
  uniform TurboQuant, QJL's 1-bit sketch), scores (`transpose=True`) and weighted sum;
- packed b-bit codes decoded by `mx.dequantize` alone, and by veloxd's `ops.dequant` where it
  unpacks with shifts instead (1, 3 and 6 bits): what a prefill block does before a dense matmul;
- Lloyd-Max codes decoded by veloxd's fused kernel and multiplied densely, one 1024-key block at
  a time (veloxd.kv.ops.levels), as Lloyd-Max TurboQuant's decode step reads them;
- why per-token scores cost what they do: the same 4-bit scores from ONE query row (the kernel's
  cost per row), and from the codes packed channel-major (`channel_major_scores`: each channel's
  codes packed along the tokens, per-token scales applied after the matmul), which takes MLX's
  other loop order (`transpose=False`). A layout experiment: no veloxd cache stores keys that way.
Medians of 100 calls after 3 warm-ups; each form interleaved with the others round by round.

    python -m benchmarks.kv.kernels [--tokens 8192] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import mlx.core as mx

from benchmarks.provenance import cpu_name, mlx_version
from veloxd.kv.ops import dequant
from veloxd.kv.ops.codebooks import codebook
from veloxd.kv.ops.levels import LevelCodes

KV_HEADS, ROWS, DIM, GROUP = 2, 4, 128, 64
ROUNDS, CALLS = 10, 10


def forms(tokens: int) -> dict[str, Callable[[], mx.array]]:
    """Every read form: name -> a function returning the (lazy) result of one read."""
    q = mx.random.normal((KV_HEADS, ROWS, DIM))  # [Hkv, R, D]
    p = mx.softmax(mx.random.normal((KV_HEADS, ROWS, tokens)), axis=-1)  # [Hkv, R, T]
    dense = mx.random.normal((KV_HEADS, tokens, DIM))  # [Hkv, T, D]
    out: dict[str, Callable[[], mx.array]] = {
        "dense scores": lambda: q @ dense.swapaxes(-1, -2),
        "dense weighted": lambda: p @ dense,
    }
    for bits in (1, 2, 3, 4, 6, 8):
        codes = mx.random.randint(0, 2**bits, (KV_HEADS, tokens, DIM)).astype(mx.float32)
        packed, scales, biases = mx.quantize(codes, group_size=GROUP, bits=bits) if bits > 1 else _one_bit(codes)
        mx.eval(packed, scales, biases)

        # The default arguments bind this iteration's arrays and width (the loop rebinds the names).
        def scores(
            packed: mx.array = packed, scales: mx.array = scales, biases: mx.array = biases, bits: int = bits
        ) -> mx.array:
            return mx.quantized_matmul(q, packed, scales, biases, transpose=True, group_size=GROUP, bits=bits)

        def weighted(
            packed: mx.array = packed, scales: mx.array = scales, biases: mx.array = biases, bits: int = bits
        ) -> mx.array:
            return mx.quantized_matmul(p, packed, scales, biases, transpose=False, group_size=GROUP, bits=bits)

        # what a prefill block does instead: decode the codes, then multiply densely
        def dequantize(
            packed: mx.array = packed, scales: mx.array = scales, biases: mx.array = biases, bits: int = bits
        ) -> mx.array:
            return mx.dequantize(packed, scales, biases, group_size=GROUP, bits=bits)

        out[f"{bits}-bit quantized_matmul scores"] = scores
        out[f"{bits}-bit quantized_matmul weighted"] = weighted
        out[f"{bits}-bit dequantize"] = dequantize
        if bits in dequant.SHIFTED:

            def shifted_dequantize(
                packed: mx.array = packed, scales: mx.array = scales, biases: mx.array = biases, bits: int = bits
            ) -> mx.array:
                return dequant.dequantize(packed, scales, biases, GROUP, bits)

            out[f"{bits}-bit ops.dequant"] = shifted_dequantize
    out.update(_scores_layouts(q, tokens))
    for bits in (3, 4):
        lloyd = LevelCodes(codebook("lloyd_max", DIM, bits).levels, bits, DIM)
        arrays = lloyd.pack(mx.random.randint(0, 2**bits, (1, KV_HEADS, tokens, DIM)).astype(mx.uint32))
        mx.eval(arrays)

        def lloyd_scores(a: list[mx.array], lloyd: LevelCodes = lloyd) -> mx.array:
            return lloyd.dot(q[None, :, :, None], a)

        def lloyd_weighted(a: list[mx.array], lloyd: LevelCodes = lloyd) -> mx.array:
            return lloyd.weighted(p[None, :, :, None, : a[0].shape[2]], a)

        out[f"{bits}-bit Lloyd-Max decode + dense scores"] = _blocked(lloyd_scores, arrays, tokens)
        out[f"{bits}-bit Lloyd-Max decode + dense weighted"] = _blocked(lloyd_weighted, arrays, tokens)
    return out


def _scores_layouts(q: mx.array, tokens: int) -> dict[str, Callable[[], mx.array]]:
    """4-bit per-token scores read from one query row, and from channel-major packed codes."""
    codes = mx.random.randint(0, 16, (KV_HEADS, tokens, DIM)).astype(mx.uint32)  # [Hkv, T, D]
    shape = (KV_HEADS, tokens, DIM // GROUP)
    scales, biases = mx.random.uniform(0.01, 0.1, shape), mx.random.normal(shape)  # [Hkv, T, D/G]
    packed = pack_along_last(codes, 4)  # [Hkv, T, D/8]
    channel_major = ChannelMajor.pack(codes, scales, biases, 4)
    mx.eval(packed, scales, biases, *channel_major.arrays())
    one_row = q[:, :1]  # [Hkv, 1, D]

    def per_row() -> mx.array:  # ROWS times this rate is the 4-row read's, if the cost is per row
        return mx.quantized_matmul(one_row, packed, scales, biases, transpose=True, group_size=GROUP, bits=4)

    return {
        "4-bit quantized_matmul scores, 1 query row": per_row,
        "4-bit channel-major codes scores": lambda: channel_major.scores(q),
    }


def pack_along_last(codes: mx.array, bits: int) -> mx.array:
    """b-bit integer codes [..., n] packed 32 // bits per uint32 word along the last axis, low bits first."""
    per_word = 32 // bits
    shifts = mx.arange(per_word, dtype=mx.uint32) * bits
    words = codes.astype(mx.uint32).reshape(*codes.shape[:-1], -1, per_word)  # [..., n / per_word, per_word]
    return (words << shifts).sum(axis=-1).astype(mx.uint32)  # [..., n / per_word]


class ChannelMajor:
    """Per-token affine key codes (groups of GROUP channels, a scale and bias per token and group)
    packed channel-major: for each channel, its codes over the tokens in words of 32 // bits tokens.

    Scores q . k_t = sum_g scale[t, g] * (q_g . c_t,g) + bias[t, g] * sum(q_g): the integer part
    is one `quantized_matmul(transpose=False)` per group (unit scales, zero biases: the per-token
    scales cannot live in the kernel's per-channel groups), the rest is elementwise over [R, T]."""

    TOKEN_GROUP = 128  # the kernel's group along the tokens: the fewest unit scales

    def __init__(self, words: mx.array, scales: mx.array, biases: mx.array, bits: int) -> None:
        self.words, self.scales, self.biases, self.bits = words, scales, biases, bits
        unit = (*words.shape[:-1], words.shape[-1] * (32 // bits) // self.TOKEN_GROUP)  # [Hkv, g, G, T / 128]
        self.ones, self.zeros = mx.ones(unit), mx.zeros(unit)

    @classmethod
    def pack(cls, codes: mx.array, scales: mx.array, biases: mx.array, bits: int) -> ChannelMajor:
        """codes [Hkv, T, D] (T a multiple of TOKEN_GROUP), scales and biases [Hkv, T, D / GROUP]."""
        H, T, D = codes.shape
        by_channel = codes.reshape(H, T, D // GROUP, GROUP).transpose(0, 2, 3, 1)  # [Hkv, g, G, T]
        return cls(pack_along_last(by_channel, bits), scales, biases, bits)

    def arrays(self) -> list[mx.array]:
        return [self.words, self.scales, self.biases, self.ones, self.zeros]

    def scores(self, q: mx.array) -> mx.array:
        """q [Hkv, R, D] -> scores [Hkv, R, T], equal to quantized_matmul(q, ..., transpose=True)."""
        H, R, D = q.shape
        by_group = q.reshape(H, R, D // GROUP, GROUP).transpose(0, 2, 1, 3)  # [Hkv, g, R, G]
        integer = mx.quantized_matmul(
            by_group, self.words, self.ones, self.zeros, transpose=False, group_size=self.TOKEN_GROUP, bits=self.bits
        )  # [Hkv, g, R, T]
        scaled = (integer * self.scales.transpose(0, 2, 1)[:, :, None, :]).sum(axis=1)  # [Hkv, R, T]
        return scaled + by_group.sum(axis=-1).swapaxes(1, 2) @ self.biases.swapaxes(1, 2)  # + [Hkv, R, g] @ [Hkv, g, T]


def _one_bit(codes: mx.array) -> tuple[mx.array, mx.array, mx.array]:
    """1-bit codes packed 32 per word with unit scales and zero biases (mx.quantize starts at 2 bits)."""
    packed = pack_along_last(codes, 1)  # [Hkv, T, D/32]
    shape = (*codes.shape[:-1], codes.shape[-1] // GROUP)
    return packed, mx.ones(shape), mx.zeros(shape)


def _blocked(read: Callable[[list[mx.array]], mx.array], arrays: list[mx.array], tokens: int) -> Callable[[], mx.array]:
    """The read over 1024-key blocks, evaluated block by block (as a Lloyd-Max decode step)."""

    def run() -> mx.array:
        last = None
        for start in range(0, tokens, 1024):
            last = read([a[:, :, start : start + 1024] for a in arrays])
            mx.eval(last)
        assert last is not None
        return last

    return run


def measure(tokens: int) -> dict[str, float]:
    """Median ns per stored element of every form."""
    reads = forms(tokens)
    times: dict[str, list[float]] = {name: [] for name in reads}
    for read in reads.values():
        for _ in range(3):
            mx.eval(read())
    for _ in range(ROUNDS):
        for name, read in reads.items():
            for _ in range(CALLS):
                start = time.perf_counter()
                mx.eval(read())
                times[name].append(time.perf_counter() - start)
    elements = KV_HEADS * tokens * DIM
    return {name: statistics.median(t) * 1e9 / elements for name, t in times.items()}


def render(rates: dict[str, float], tokens: int) -> str:
    dense = {kind: rates[f"dense {kind}"] for kind in ("scores", "weighted")}
    lines = [f"| read ({tokens} tokens) | ns per element | × dense |", "|---|---|---|"]
    for name, ns in rates.items():
        kind = "scores" if name.endswith("scores") else "weighted" if name.endswith("weighted") else None
        relative = "" if kind is None else f"{ns / dense[kind]:.1f}"  # a decode alone has no dense peer
        lines.append(f"| {name} | {ns:.2f} | {relative} |")
    preload = os.environ.get("LD_PRELOAD", "") or "none"
    lines += [
        "",
        f"{cpu_name()}, {os.cpu_count()} cores, MLX {mlx_version()} {mx.default_device()}, LD_PRELOAD={preload}",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--json", type=Path, help="write the rates here")
    args = parser.parse_args(argv)
    rates = measure(args.tokens)
    print(render(rates, args.tokens), flush=True)
    if args.json:
        payload = {"tokens": args.tokens, "machine": cpu_name(), "mlx": mlx_version(), "ns_per_element": rates}
        payload["blas_preload"] = os.environ.get("LD_PRELOAD", "")
        args.json.write_text(json.dumps(payload, indent=2) + "\n")


if __name__ == "__main__":
    main()
