"""The benchmark arms: every veloxd method and bit width, eviction budgets, and mlx_lm's peer cache.

An arm knows how to build one request's per-layer caches for a model and a context length.
Methods whose module does not import yet are reported as unavailable instead of failing the run.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any

from veloxd.kv import KVCacheConfig, registry

PEER = "mlx_quantized"  # mlx_lm's QuantizedKVCache, quantized from token 0 (group 64)
PEER_BITS = (2, 3, 4, 8)
EVICTION_FRACTION = 0.25
EVICTION_FIXED_BUDGET = 512  # the "512 tokens at 4k" budget


@dataclass(frozen=True)
class Arm:
    label: str
    method: str  # a registry name, or PEER
    family: str  # baseline / quantization / eviction / hybrid / peer
    bits: int | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    budget: int | None = None  # eviction: tokens kept per layer

    def config(self) -> KVCacheConfig | None:
        if self.method == PEER:
            return None
        return KVCacheConfig(method=self.method, bits=self.bits, **self.settings)

    def make_caches(self, model: Any) -> list[Any]:
        if self.method == PEER:
            from mlx_lm.models.cache import QuantizedKVCache

            if self.bits is None:
                raise ValueError(f"arm {self.label!r}: the {PEER} peer needs a bit width")
            # Built directly so it is quantized from token 0 (mlx_lm's quantized_kv_start skips that).
            return [QuantizedKVCache(group_size=64, bits=self.bits) for _ in model.layers]
        from veloxd.kv import make_caches

        config = self.config()
        assert config is not None  # only the peer has no veloxd config, and it returned above
        return make_caches(model, config)

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "method": self.method,
            "family": self.family,
            "bits": self.bits,
            "settings": dict(self.settings),
            "budget": self.budget,
        }


def availability(method: str) -> str | None:
    """None if the method's cache class imports, else the reason it does not (yet)."""
    if method == PEER or method == "fp16":
        return None
    module_name, class_name = registry.get(method).impl.split(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as error:  # a module being written right now may fail in any way
        return f"{type(error).__name__}: {error}"
    if not hasattr(module, class_name):
        return f"{module_name} has no {class_name}"
    return None


def eviction_settings(method: str, budget: int) -> dict[str, Any]:
    """KVCacheConfig fields that give `method` a total of `budget` tokens per layer."""
    if method == "streaming_llm":
        return {"streaming_llm_sinks": 4, "streaming_llm_window": budget - 4}
    if method == "knorm":
        return {"knorm_budget": budget, "knorm_window": min(32, budget // 4)}
    if method == "snapkv":
        return {"snapkv_budget": budget, "snapkv_window": min(32, budget // 4)}
    if method == "tova":
        return {"tova_budget": budget}
    if method == "h2o":
        return {"h2o_budget": budget, "h2o_window": budget // 2}
    raise ValueError(f"no budget rule for eviction method '{method}'")


def rotated_affine_arm(bits: int) -> Arm:
    """`affine-rot-<bits>`: affine as veloxd.yaml's defaults run it (rotated keys)."""
    return Arm(f"affine-rot-{bits}", "affine", "quantization", bits, {"affine_rotate": True})


def quantizer_arms(quick: bool) -> list[Arm]:
    arms = []
    for info in registry.METHODS:
        if info.family != "quantization":
            continue
        bits = info.bits_choices if not quick else (info.default_bits,)
        # `affine-<b>` stays the unrotated arm it always was; `affine-rot-<b>` is the (default) rotated one
        plain = {"affine_rotate": False} if info.name == "affine" else {}
        for b in bits:
            arms.append(Arm(f"{info.name}-{b}", info.name, "quantization", b, dict(plain)))
        if info.name == "affine" and not quick:
            arms += [rotated_affine_arm(b) for b in (2, 3, 4)]
            arms.append(Arm("affine-k8v4", "affine", "quantization", 4, {"affine_key_bits": 8}))
            # the recent window's share of the KL: the same codes without it
            arms.append(
                Arm("affine-rot-4-w0", "affine", "quantization", 4, {"affine_rotate": True, "recent_window": 0})
            )
            # one scale and bias per 128-element vector, 16 exact tokens: under mlx-q4's footprint at d 128
            one_group = {"affine_rotate": True, "affine_group_size": 128, "recent_window": 16}
            arms.append(Arm("affine-rot-4-g128-w16", "affine", "quantization", 4, one_group))
        if info.name == "turboquant_mse" and not quick:
            # mixed widths: keys weigh more in the scores (4-bit keys, 3-bit values), window sizes
            for window, suffix in ((32, ""), (16, "-w16"), (0, "-w0")):
                settings = {"turboquant_key_bits": 4, "recent_window": window}
                arms.append(Arm(f"turboquant_mse-3-k4{suffix}", info.name, "quantization", 3, settings))
            # under mlx-q3's footprint with 16 exact tokens: 3 bits on both, or 4-bit keys and 2-bit values
            arms.append(Arm("turboquant_mse-3-w16", info.name, "quantization", 3, {"recent_window": 16}))
            narrow_values = {"turboquant_key_bits": 4, "recent_window": 16}
            arms.append(Arm("turboquant_mse-2-k4-w16", info.name, "quantization", 2, narrow_values))
            uniform = narrow_values | {"turboquant_codebook": "uniform"}  # quantized_matmul's decode speed
            arms.append(Arm("turboquant_mse-2-k4-w16-uniform", info.name, "quantization", 2, uniform))
            arms.append(Arm("turboquant_mse-4-w16", info.name, "quantization", 4, {"recent_window": 16}))
        if info.name == "turboquant_prod" and not quick:  # evenly spaced levels: quantized_matmul's speed
            arms.append(
                Arm("turboquant_prod-4-uniform", info.name, "quantization", 4, {"turboquant_codebook": "uniform"})
            )
        if info.name == "qjl" and not quick:  # a D-row sketch: one read as wide as a 4-bit key's
            arms.append(Arm("qjl-4-s128", info.name, "quantization", 4, {"qjl_sketch_dim": 128}))
    return arms


def eviction_arms(context: int) -> list[Arm]:
    budgets = [max(16, int(context * EVICTION_FRACTION))]
    if context >= 4096 and EVICTION_FIXED_BUDGET not in budgets:
        budgets.append(EVICTION_FIXED_BUDGET)
    arms = []
    for info in registry.METHODS:
        if info.family != "eviction":
            continue
        for budget in budgets:
            label = f"{info.name}-{budget}"
            arms.append(Arm(label, info.name, "eviction", None, eviction_settings(info.name, budget), budget))
    return arms


def hybrid_arms(context: int, quick: bool) -> list[Arm]:
    """Each eviction policy over its quantizer's codes, at the eviction budgets and the storage's
    default bits (quick: snapkv_affine only), labelled `<method>-<bits>-<budget>`."""
    arms = []
    for policy_arm in eviction_arms(context):
        for info in registry.METHODS:
            if (
                info.family != "hybrid"
                or info.parts[0] != policy_arm.method
                or (quick and info.name != "snapkv_affine")
            ):
                continue
            bits = info.default_bits
            label = f"{info.name}-{bits}-{policy_arm.budget}"
            plain = {**policy_arm.settings, "affine_rotate": False}  # as `affine-<b>`: unrotated
            arms.append(Arm(label, info.name, "hybrid", bits, plain, policy_arm.budget))
            if info.name == "snapkv_affine" and not quick:  # rotated keys, for outlier channels
                rotated = {**policy_arm.settings, "affine_rotate": True}
                label = f"{info.name}-rot-{bits}-{policy_arm.budget}"
                arms.append(Arm(label, info.name, "hybrid", bits, rotated, policy_arm.budget))
    return arms


def all_arms(context: int, quick: bool = False) -> list[Arm]:
    """fp16 first (the reference), then the peer, quantizers, eviction methods and hybrids."""
    arms = [Arm("fp16", "fp16", "baseline")]
    arms += [Arm(f"mlx-q{b}", PEER, "peer", b) for b in PEER_BITS if not quick or b in (4, 8)]
    arms += quantizer_arms(quick)
    arms += eviction_arms(context)
    arms += hybrid_arms(context, quick)
    return arms


def split_available(arms: list[Arm]) -> tuple[list[Arm], dict[str, str]]:
    """(arms that can run, {label: reason} for those that cannot)."""
    reasons: dict[str, str] = {}
    ready = []
    cache: dict[str, str | None] = {}
    for arm in arms:
        if arm.method not in cache:
            cache[arm.method] = availability(arm.method)
        reason = cache[arm.method]
        if reason is None:
            try:
                arm.config()
            except ValueError as error:
                reason = f"invalid config: {error}"
        if reason is None:
            ready.append(arm)
        else:
            reasons[arm.label] = reason
    return ready, reasons


def add_arms_option(parser: Any, help_prefix: str = "") -> None:
    """`--arms a,b,...`: run only the arms with these labels (read back by `chosen`)."""
    parser.add_argument("--arms", default="", help=f"{help_prefix}comma-separated arm labels (default all)")


def chosen(arms_option: str) -> tuple[str, ...]:
    """The labels given to --arms; empty: every arm."""
    return tuple(label for label in arms_option.split(",") if label)
