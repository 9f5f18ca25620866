"""What a model's KV cache will weigh: measured on probe prompts, derived at the lengths users ask about.

A cache's bytes are `fixed + per_token * n` (constants such as rotations, sketches, KIVI's
full-precision window, capacity rounding) until an eviction method reaches its budget, from where
they stay at a capped figure. `measure` runs fresh caches of the served model through probe prompts
and reads every layer's `nbytes` once the prompt has ended (its last token runs as a one-token step,
as in mlx_lm, so SnapKV has compressed and released its query stash):

- the fp16 cache (mlx_lm's KVCache) is not probed: its bytes are exact arithmetic on the model's
  key/value shapes (`fp16_lines`: read after one token step), per layer
  (kv_heads_k * head_dim_k + kv_heads_v * head_dim_v) * dtype bytes * allocated slots, slots
  growing in 256-token steps, so its line (no fixed bytes) is exact at every multiple of the step.
  A model whose own caches are not all KVCache (sliding windows, state-space layers) is probed at
  256 and 512 tokens instead, as the method is;
- the method at 256 and 512 tokens too, or, when an eviction budget is smaller, at half the budget
  and the budget (below a small budget an eviction layer holds one capacity step, so its line
  there can be flat: it is then constant, which is what it holds);
- an eviction method once more past its largest budget (prompt of budget + 1 tokens, then one
  generated token, when a decode step has grown its buffer to the most slots it ever holds): each
  evicting layer's capped bytes, measured, not extrapolated from a line.

Probes feed random keys and values of the model's own shapes through each layer's cache and its
attention, not the model's weights, when the model allows it (`veloxd.kv.probe`): bytes depend on
token counts, not values.

`Footprint.at(n)` derives the totals at n tokens: each layer's line, and each evicting layer's
measured capped bytes from its budget on. Everything reported is labelled measured or derived:
nothing is computed from bit widths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from mlx_lm.models.cache import KVCache

from veloxd.kv import probe
from veloxd.kv.base import VeloxCache
from veloxd.kv.config import KVCacheConfig
from veloxd.kv.factory import make_caches, native_caches
from veloxd.kv.ops.packing import CAPACITY_STEP
from veloxd.kv.probe import Feeder, Forward, LayerShape, Synthetic
from veloxd.model_config import as_config, stated_context_length

PROBE_LENGTHS = (CAPACITY_STEP, 2 * CAPACITY_STEP)  # whole steps: every store is exactly full there
REPORT_LENGTHS = (4096, 32768)


@dataclass(frozen=True)
class LayerLine:
    """One layer's bytes: fixed + per_token * n, and capped_bytes from `cap` tokens on (cap None:
    it never stops growing)."""

    fixed: float
    per_token: float
    cap: int | None = None
    capped_bytes: float | None = None

    def at(self, n: int) -> float:
        line = self.fixed + self.per_token * n
        if self.cap is None or self.capped_bytes is None:
            return line
        return self.capped_bytes if n >= self.cap else min(line, self.capped_bytes)


@dataclass(frozen=True)
class Footprint:
    probe_lengths: tuple[int, int]
    method: tuple[LayerLine, ...]
    fp16: tuple[LayerLine, ...]
    max_context: int | None
    fp16_probe_lengths: tuple[int, int] | None = PROBE_LENGTHS  # None: derived from shapes (`fp16_lines`)
    cap_probe_tokens: int | None = None
    method_probed: bool = True  # False: the method is fp16 and shares the derived reference
    synthetic: bool = False  # probes fed random keys and values of the model's shapes (veloxd.kv.probe)

    def at(self, n: int) -> dict[str, Any]:
        method = round(sum(line.at(n) for line in self.method))
        fp16 = round(sum(line.at(n) for line in self.fp16))
        return {"method": method, "fp16": fp16, "ratio": round(method / fp16, 4) if fp16 else None}

    def to_dict(self) -> dict[str, Any]:
        """The READY figure: measured fixed bytes, bytes per token and capped bytes; derived totals."""
        lengths = [*REPORT_LENGTHS]
        if self.max_context and self.max_context not in lengths:
            lengths.append(self.max_context)
        caps = sorted({line.cap for line in self.method if line.cap is not None})
        capped = [line.capped_bytes for line in self.method if line.capped_bytes is not None]
        shapes = f"derived from the model's key/value shapes and KVCache's {CAPACITY_STEP}-token allocation steps"
        if not self.method_probed:
            how = f"fixed_bytes, bytes_per_token: {shapes} (the method is fp16)"
        else:
            low, high = self.probe_lengths
            fp16 = shapes if self.fp16_probe_lengths is None else "at {} and {} tokens".format(*self.fp16_probe_lengths)
            how = (
                "fixed_bytes, bytes_per_token: measured (nbytes of every layer cache after probe prompts of "
                f"{low} and {high} tokens; fp16: {fp16})"
            )
        if self.synthetic:
            how += "; probes fed random keys, values and queries of the model's shapes, no weights run"
        if self.cap_probe_tokens is not None:
            how += (
                f"; capped_bytes: measured (evicting layers after a {self.cap_probe_tokens}-token prompt "
                "and one generated token)"
            )
        how += "; at: derived from them, evicting layers at their capped bytes from their budget on"
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
            "capped_bytes": round(sum(capped)) if capped else None,
            "max_context": self.max_context,
            "at": {str(n): self.at(n) for n in lengths},
            "probe_tokens": list(self.probe_lengths),
            "source": "measured",  # by this process; "cached" when read back (veloxd.serve.figures)
            "how": how,
        }


def summary(figure: dict[str, Any], context: int = REPORT_LENGTHS[0]) -> dict[str, Any]:
    """The short form READY keeps as `kv_bytes_per_token` (read by the console, dashboard and
    metrics): bytes per added token, and the total ratio to fp16 at `context` tokens."""
    at = figure["at"][str(context)]
    caps = figure.get("eviction_cap_tokens") or []
    return {
        "method": figure["bytes_per_token"]["method"],
        "fp16": figure["bytes_per_token"]["fp16"],
        "ratio": at["ratio"],
        "tokens": context,
        # An evicting cache stops growing at its cap: its per-token figure holds below it only (it may be 0).
        "cap_tokens": min(caps) if caps else None,
        "capped_bytes": figure.get("capped_bytes"),
        "source": f"derived from kv_memory: bytes per added token (measured), ratio of totals at {context} tokens",
    }


def probe_lengths(caches: list[Any]) -> tuple[int, int]:
    """Two lengths, multiples of CAPACITY_STEP where possible, that no eviction budget cuts. A
    budget of 1 leaves one length: the other is 0, the caches as made (no prompt run)."""
    budgets = [c.budget for c in caches if hasattr(c, "budget")]
    low, high = PROBE_LENGTHS
    if budgets and min(budgets) < high:
        high = min(budgets)
        low = high // 2
    return low, high


def _layer_bytes(feeder: Feeder, caches: list[Any], n: int, generated: int = 0) -> list[int]:
    """Each layer's nbytes after a prompt of n tokens (none: as made) and `generated` further one-token steps."""
    if n:
        probe.run(feeder, caches, 0, n)
    for i in range(n, n + generated):
        probe.step(feeder, caches, i)
    return [c.nbytes for c in caches]


def _probe_bytes(
    model: Any, feeder: Feeder, config: KVCacheConfig, lengths: tuple[int, int]
) -> tuple[list[int], list[int], list[Any] | None]:
    """Each layer's bytes after prompts of the two lengths, and the caches that ran them when one
    set ran both (None: fresh prompts). While no eviction budget is reached, a cache holds the same
    bytes after its first prompt and a continuation to the second length as after a fresh prompt
    of that length (its stores grow by token count alone, and eviction has nothing to drop;
    tests/kv/test_footprint.py checks it for every method), so one cache runs both: a third less
    probing on a first start. A budget within reach: a fresh prompt per length."""
    caches = make_caches(model, config)
    if any(getattr(c, "budget", None) is not None and c.budget <= lengths[1] for c in caches):
        low, high = (_layer_bytes(feeder, make_caches(model, config), n) for n in lengths)
        return low, high, None
    probe.run(feeder, caches, 0, lengths[0])
    low = [c.nbytes for c in caches]
    probe.run(feeder, caches, lengths[0], lengths[1])
    return low, [c.nbytes for c in caches], caches


def _capped_bytes(
    model: Any, feeder: Feeder, config: KVCacheConfig, n: int, probed: tuple[list[Any], int] | None
) -> list[int]:
    """Each layer's bytes after a prompt of n tokens (past every budget) and one generated step.
    `probed`: caches already holding the first m tokens of the same prompt (the probe lengths',
    all under every budget) continue from there: an evicting layer's slots past its budget do not
    depend on where earlier chunks ended (tests/kv/test_footprint.py checks the figure against a
    fresh prompt for every method), and the probe's tokens are not run twice."""
    if probed is None:
        return _layer_bytes(feeder, make_caches(model, config), n, generated=1)
    caches, m = probed
    probe.run(feeder, caches, m, n)
    probe.step(feeder, caches, n)
    return [c.nbytes for c in caches]


def _lines(low: list[int], high: list[int], lengths: tuple[int, int]) -> list[LayerLine]:
    a, b = lengths
    out = []
    for lo, hi in zip(low, high):
        per_token = (hi - lo) / (b - a)
        out.append(LayerLine(fixed=lo - per_token * a, per_token=per_token))
    return out


def max_context(model: Any) -> int | None:
    """The context length the model's config states (veloxd.model_config's one rule), if any."""
    return stated_context_length(as_config(getattr(model, "args", None)))


def kv_shapes(model: Any) -> list[LayerShape] | None:
    """Each layer's key/value shapes, read from the model's own caches after one token step; None
    when they are not all mlx_lm's KVCache (sliding windows, state-space layers)."""
    caches = native_caches(model)
    if not caches or any(type(c) is not KVCache for c in caches):
        return None
    probe.step(Forward(model), caches, 0)
    shapes = []
    for c in caches:
        _, k_heads, _, k_dim = c.keys.shape  # [B, kv_heads, allocated, head_dim]
        _, v_heads, _, v_dim = c.values.shape
        shapes.append(LayerShape(k_heads, k_dim, v_heads, v_dim, c.keys.dtype))
    return shapes


def fp16_lines(model: Any, shapes: list[LayerShape] | None = None) -> list[LayerLine] | None:
    """Each layer's fp16 (KVCache) line from the model's key/value shapes: per token (kv_heads *
    head_dim of keys + of values) * dtype bytes, no fixed bytes (it is exact at every multiple of
    CAPACITY_STEP; `kvcache_bytes` gives the exact figure at any length). None when the model's own
    caches are not all KVCache: their bytes follow other rules."""
    shapes = kv_shapes(model) if shapes is None else shapes
    if shapes is None:
        return None
    per_token = [(s.k_heads * s.k_dim + s.v_heads * s.v_dim) * s.dtype.size for s in shapes]
    return [LayerLine(fixed=0.0, per_token=float(n)) for n in per_token]


def kvcache_bytes(lines: list[LayerLine], n: int) -> int:
    """What mlx_lm's KVCache holds after n tokens (one sequence): its slots grow in CAPACITY_STEP steps."""
    allocated = -(-n // CAPACITY_STEP) * CAPACITY_STEP
    return round(sum(line.per_token for line in lines) * allocated)


def feeder_for(model: Any, caches: list[Any], shapes: list[LayerShape] | None) -> Feeder:
    """Synthetic keys and values where the shapes say everything a probe needs, else the model."""
    q_heads = None if shapes is None else probe.query_heads(model, shapes)
    if shapes is None or q_heads is None or not all(isinstance(c, VeloxCache) for c in caches):
        return Forward(model)
    return Synthetic(shapes, q_heads)


def measure(model: Any, config: KVCacheConfig) -> Footprint:
    """Probe `model` with `config`'s caches; the fp16 reference from its shapes (see the module doc)."""
    first = make_caches(model, config)
    lengths = probe_lengths(first)
    budgets: list[int | None] = [getattr(c, "budget", None) for c in first]
    shapes = kv_shapes(model)
    derived = fp16_lines(model, shapes)
    fp16_lengths: tuple[int, int] | None = None
    if derived is None:
        low, high = (_layer_bytes(Forward(model), native_caches(model), n) for n in PROBE_LENGTHS)
        fp16, fp16_lengths = _lines(low, high, PROBE_LENGTHS), PROBE_LENGTHS
    else:
        fp16 = derived
    feeder = feeder_for(model, first, shapes)
    continued: tuple[list[Any], int] | None = None
    if config.method == "fp16" and derived is not None:  # the method is the reference: nothing to probe
        method, lengths, probed = list(derived), PROBE_LENGTHS, False
    else:
        low, high, caches = _probe_bytes(model, feeder, config, lengths)
        method, probed = _lines(low, high, lengths), True
        continued = None if caches is None else (caches, lengths[1])
    limit = max_context(model)
    evicting = [b for b in budgets if b is not None and (limit is None or b < limit)]
    cap_tokens = None
    if evicting:  # past every budget that a context can reach: the capped bytes themselves
        cap_tokens = max(evicting) + 1
        capped = _capped_bytes(model, feeder, config, cap_tokens, continued)
        method = [
            LayerLine(line.fixed, line.per_token, b, float(c)) if b is not None and b in evicting else line
            for line, b, c in zip(method, budgets, capped)
        ]
    return Footprint(
        probe_lengths=lengths,
        method=tuple(method),
        fp16=tuple(fp16),
        max_context=limit,
        fp16_probe_lengths=fp16_lengths,
        cap_probe_tokens=cap_tokens,
        method_probed=probed,
        synthetic=isinstance(feeder, Synthetic),
    )
