"""What a model's KV cache will weigh: measured at two probe lengths, derived at the lengths users ask about.

A cache's bytes are `fixed + per_token * n` (constants such as rotations, sketches, KIVI's
full-precision window, capacity rounding) until an eviction method reaches its budget, where
they stop growing. `measure` fills fresh caches of the served model with two probe prompts whose
lengths are multiples of the 256-token capacity step (and below every eviction budget), reads
every layer's `nbytes` once the prompt has ended (its last token runs as a one-token step, as in
mlx_lm, so SnapKV has compressed and released its query stash), and solves per layer for `fixed` and `per_token`; the fp16 cache
(mlx_lm's KVCache) is measured the same way beside it. `Footprint.at(n)` derives the totals at n
tokens, each evicting layer capped at its budget. Everything reported is labelled measured or
derived: nothing is computed from bit widths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx

from veloxd.kv.config import KVCacheConfig
from veloxd.kv.factory import make_caches, native_caches

PROBE_STEP = 256  # capacity step of the packed stores and of mlx_lm's KVCache
PROBE_LENGTHS = (256, 512)
REPORT_LENGTHS = (4096, 32768)


@dataclass(frozen=True)
class LayerLine:
    """One layer's bytes: fixed + per_token * min(n, cap) (cap None: it never stops growing)."""

    fixed: float
    per_token: float
    cap: int | None

    def at(self, n: int) -> float:
        return self.fixed + self.per_token * (n if self.cap is None else min(n, self.cap))


@dataclass(frozen=True)
class Footprint:
    probe_lengths: tuple[int, int]
    method: tuple[LayerLine, ...]
    fp16: tuple[LayerLine, ...]
    max_context: int | None

    def at(self, n: int) -> dict[str, Any]:
        method = round(sum(line.at(n) for line in self.method))
        fp16 = round(sum(line.at(n) for line in self.fp16))
        return {"method": method, "fp16": fp16, "ratio": round(method / fp16, 4) if fp16 else None}

    def to_dict(self) -> dict[str, Any]:
        """The READY figure: measured fixed bytes and bytes per token, derived totals."""
        lengths = [*REPORT_LENGTHS]
        if self.max_context and self.max_context not in lengths:
            lengths.append(self.max_context)
        caps = sorted({line.cap for line in self.method if line.cap is not None})
        return {
            "fixed_bytes": {
                "method": round(sum(x.fixed for x in self.method)),
                "fp16": round(sum(x.fixed for x in self.fp16)),
            },
            "bytes_per_token": {
                "method": round(sum(x.per_token for x in self.method), 1),
                "fp16": round(sum(x.per_token for x in self.fp16), 1),
            },
            "eviction_cap_tokens": caps or None,
            "max_context": self.max_context,
            "at": {str(n): self.at(n) for n in lengths},
            "probe_tokens": list(self.probe_lengths),
            "source": (
                "fixed_bytes, bytes_per_token: measured (nbytes of every layer cache after probe prefills of "
                f"{self.probe_lengths[0]} and {self.probe_lengths[1]} tokens); at: derived from them, "
                "eviction layers capped at their budget"
            ),
        }


def summary(figure: dict[str, Any], context: int = REPORT_LENGTHS[0]) -> dict[str, Any]:
    """The short form READY keeps as `kv_bytes_per_token` (read by the console, dashboard and
    metrics): bytes per added token, and the total ratio to fp16 at `context` tokens."""
    at = figure["at"][str(context)]
    return {
        "method": figure["bytes_per_token"]["method"],
        "fp16": figure["bytes_per_token"]["fp16"],
        "ratio": at["ratio"],
        "tokens": context,
        "source": f"derived from kv_memory: bytes per added token (measured), ratio of totals at {context} tokens",
    }


def probe_lengths(caches: list[Any]) -> tuple[int, int]:
    """Two lengths, multiples of PROBE_STEP where possible, that no eviction budget cuts."""
    budgets = [c.budget for c in caches if hasattr(c, "budget")]
    low, high = PROBE_LENGTHS
    if budgets and min(budgets) < high:
        high = min(budgets)
        low = max(1, high // 2)
    return low, high


def _layer_bytes(model: Any, caches: list[Any], n: int) -> list[int]:
    vocab = int(getattr(getattr(model, "args", None), "vocab_size", 0) or 256)
    tokens = (mx.arange(n) * 7919 % vocab)[None]  # [1, n] a fixed, varied prompt
    model(tokens[:, :-1], cache=caches)  # as mlx_lm runs a prompt: all but its last token,
    model(tokens[:, -1:], cache=caches)  # then the last one as the first one-token step
    mx.eval([c.state for c in caches])
    return [c.nbytes for c in caches]


def _lines(low: list[int], high: list[int], lengths: tuple[int, int], caps: list[int | None]) -> tuple[LayerLine, ...]:
    a, b = lengths
    out = []
    for lo, hi, cap in zip(low, high, caps):
        per_token = (hi - lo) / (b - a)
        out.append(LayerLine(fixed=lo - per_token * a, per_token=per_token, cap=cap))
    return tuple(out)


def max_context(model: Any) -> int | None:
    args = getattr(model, "args", None)
    for name in ("max_position_embeddings", "max_seq_len", "n_positions"):
        value = getattr(args, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def measure(model: Any, config: KVCacheConfig) -> Footprint:
    """Probe `model` with `config`'s caches and with fp16 caches at two lengths (see module doc)."""
    lengths = probe_lengths(make_caches(model, config))
    caps = [getattr(c, "budget", None) for c in make_caches(model, config)]
    method = [_layer_bytes(model, make_caches(model, config), n) for n in lengths]
    fp16 = [_layer_bytes(model, native_caches(model), n) for n in lengths]
    return Footprint(
        probe_lengths=lengths,
        method=_lines(method[0], method[1], lengths, caps),
        fp16=_lines(fp16[0], fp16[1], lengths, [None] * len(fp16[0])),
        max_context=max_context(model),
    )
