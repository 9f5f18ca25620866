"""`KVCacheConfig`: the single source of truth for KV-cache settings.

Every field carries its own metadata (the methods it applies to, its type, its range or
choices, a one-line description). The YAML schema, `veloxd serve --set`, `veloxd methods`
and the docs/reference.md tables are all generated from it. This module imports no mlx.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from veloxd.checks import did_you_mean
from veloxd.kv import config_rules, registry
from veloxd.kv.config_rules import TURBOQUANT, KVConfigError
from veloxd.kv.refusals import OWN_KEYS

# Settings with their own key in a veloxd.yaml entry (and their own `veloxd serve` flag); every
# other setting of a method goes in its `overrides` mapping (or `--set FIELD=VALUE`).
SEEDED = (*registry.with_hybrids("affine"), "turboquant_mse", "turboquant_prod", "qjl")
# The per-token codecs whose queries meet exact keys (QJL's queries are sketch projections: none).
WINDOWED = ("affine", "turboquant_mse", "turboquant_prod")
# Settings of several methods that mean the same for each: in `overrides`, with no method prefix.
SHARED = ("recent_window",)


def setting(
    default: Any,
    *,
    methods: tuple[str, ...],
    kind: type,
    help: str,
    choices: tuple[Any, ...] | None = None,
    minimum: float | None = None,
    maximum: float | None = None,
    nullable: bool = False,
) -> Any:
    """Declare one config field with the metadata everything else is generated from."""
    meta = {
        "methods": methods,
        "kind": kind,
        "help": help,
        "choices": choices,
        "minimum": minimum,
        "maximum": maximum,
        "nullable": nullable,
    }
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class KVCacheConfig:
    """Settings of one compressed KV cache. Invalid or irrelevant settings raise KVConfigError."""

    method: str
    bits: int | None = setting(
        None,
        methods=registry.methods_with_bits(),
        kind=int,
        nullable=True,
        help="Bits per stored element; valid values depend on the method (unset: its default).",
    )
    seed: int = setting(
        0,
        methods=SEEDED,
        kind=int,
        minimum=0,
        maximum=2**31 - 1,
        help="Seed for random rotations and sketches (layer i uses seed + i).",
    )
    recent_window: int = setting(
        32,
        methods=WINDOWED,
        kind=int,
        minimum=0,
        maximum=4096,
        help="Newest tokens also kept in full precision, read instead of their codes (0: none); costs "
        "recent_window x (D + Dv) x 2 bytes per layer and KV head.",
    )
    # --- affine: per-token affine groups (mx.quantize triples) ---
    affine_group_size: int = setting(
        64,
        methods=registry.with_hybrids("affine"),
        kind=int,
        choices=(32, 64, 128),
        help="Elements sharing one scale and bias, along the head dimension.",
    )
    affine_key_bits: int | None = setting(
        None,
        methods=registry.with_hybrids("affine"),
        kind=int,
        choices=(2, 3, 4, 6, 8),
        nullable=True,
        help="Bit width of keys when it differs from values (e.g. 8-bit keys, 4-bit values).",
    )
    affine_rotate: bool = setting(
        True,
        methods=registry.with_hybrids("affine"),
        kind=bool,
        help="Rotate keys and queries by a randomized Hadamard transform to spread outlier channels "
        "(default: on, as measured best: docs/results.md).",
    )
    # --- kivi: per-channel keys, per-token values, full-precision recent window ---
    kivi_group_size: int = setting(
        32,
        methods=("kivi",),
        kind=int,
        choices=(32, 64, 128),
        help="Tokens per key-quantization group (per channel) and channels per value group.",
    )
    kivi_residual_length: int = setting(
        128,
        methods=("kivi",),
        kind=int,
        minimum=0,
        maximum=8192,
        help="Recent tokens kept in full precision (R to R+G-1 between steps, G = kivi_group_size); a multiple of G.",
    )
    # --- turboquant_mse / turboquant_prod ---
    turboquant_outlier_channels: int = setting(
        0,
        methods=TURBOQUANT,
        kind=int,
        minimum=0,
        maximum=512,
        help="Rotated channels given one extra bit (fractional rates, e.g. 32 of 128 at 3 bits = 3.25); a multiple of 32.",
    )
    turboquant_key_bits: int | None = setting(
        None,
        methods=TURBOQUANT,
        kind=int,
        choices=(2, 3, 4),
        nullable=True,
        help="Bit width of keys when it differs from values (keys weigh more in the attention scores: e.g. 4-bit keys, 3-bit values).",
    )
    turboquant_codebook: str = setting(
        "lloyd_max",
        methods=TURBOQUANT,
        kind=str,
        choices=("lloyd_max", "uniform"),
        help="Levels per rotated coordinate: Lloyd-Max (the paper) or the best evenly spaced ones (faster attention on CPU).",
    )
    # --- qjl: 1-bit JL sketch of keys, affine values ---
    qjl_sketch_dim: int = setting(
        256,
        methods=("qjl",),
        kind=int,
        minimum=32,
        maximum=4096,
        help="Rows of the Gaussian projection (sign bits stored per key); a multiple of 32.",
    )
    qjl_value_group_size: int = setting(
        64,
        methods=("qjl",),
        kind=int,
        choices=(32, 64, 128),
        help="Elements sharing one scale and bias in the affine-quantized values.",
    )
    # --- streaming_llm: attention sinks + recent window ---
    streaming_llm_sinks: int = setting(
        4,
        methods=registry.with_hybrids("streaming_llm"),
        kind=int,
        minimum=0,
        maximum=1024,
        help="First tokens always kept (attention sinks).",
    )
    streaming_llm_window: int = setting(
        1024,
        methods=registry.with_hybrids("streaming_llm"),
        kind=int,
        minimum=1,
        maximum=1 << 20,
        help="Most recent tokens kept.",
    )
    # --- knorm: keep low-norm keys ---
    knorm_budget: int = setting(
        1024,
        methods=registry.with_hybrids("knorm"),
        kind=int,
        minimum=1,
        maximum=1 << 20,
        help="Tokens kept per layer after eviction (recent window included).",
    )
    knorm_window: int = setting(
        32,
        methods=registry.with_hybrids("knorm"),
        kind=int,
        minimum=0,
        maximum=1 << 20,
        help="Most recent tokens always kept, inside the budget.",
    )
    # --- snapkv (+ PyramidKV budgets) ---
    snapkv_budget: int = setting(
        1024,
        methods=registry.with_hybrids("snapkv"),
        kind=int,
        minimum=1,
        maximum=1 << 20,
        help="Prompt tokens kept per KV head at the end of prefill (observation window included).",
    )
    snapkv_window: int = setting(
        32,
        methods=registry.with_hybrids("snapkv"),
        kind=int,
        minimum=1,
        maximum=4096,
        help="Last prompt queries whose attention scores the prompt (observation window).",
    )
    snapkv_kernel: int = setting(
        5,
        methods=registry.with_hybrids("snapkv"),
        kind=int,
        minimum=1,
        maximum=63,
        help="Width of the 1-D max pooling that smooths the scores (odd).",
    )
    snapkv_pyramid: bool = setting(
        False,
        methods=registry.with_hybrids("snapkv"),
        kind=bool,
        help="PyramidKV: budgets shrink from lower to higher layers, same average.",
    )
    snapkv_pyramid_beta: int = setting(
        20,
        methods=registry.with_hybrids("snapkv"),
        kind=int,
        minimum=1,
        maximum=1000,
        help="PyramidKV steepness: the last layer keeps 1/beta of the average prompt budget (window excluded).",
    )
    # --- tova ---
    tova_budget: int = setting(
        1024,
        methods=registry.with_hybrids("tova"),
        kind=int,
        minimum=1,
        maximum=1 << 20,
        help="Tokens kept per layer; over budget, the lowest-attention token is dropped.",
    )
    # --- h2o ---
    h2o_budget: int = setting(
        1024,
        methods=registry.with_hybrids("h2o"),
        kind=int,
        minimum=2,
        maximum=1 << 20,
        help="Tokens kept per layer: heavy hitters plus the recent window.",
    )
    h2o_window: int = setting(
        256,
        methods=registry.with_hybrids("h2o"),
        kind=int,
        minimum=1,
        maximum=1 << 20,
        help="Most recent tokens always kept, inside the budget.",
    )

    def __post_init__(self) -> None:
        try:
            info = registry.get(self.method)
        except ValueError as err:  # names the valid methods and a near miss
            raise KVConfigError("method", str(err)) from None
        for f in settings():
            config_rules.check_setting(f, getattr(self, f.name), self.method)
        if self.bits is None:
            object.__setattr__(self, "bits", info.default_bits)
        elif not info.bits_choices:
            raise KVConfigError("bits", registry.bits_refusal(self.method, self.bits))
        elif self.bits not in info.bits_choices:
            raise KVConfigError(
                "bits",
                f"bits={self.bits} is not valid for method {self.method}; choose one of {list(info.bits_choices)}",
            )
        config_rules.check_cross_fields(self.to_dict())

    @property
    def bit_width(self) -> int:
        """`bits` of a method that has a bit width (__post_init__ filled in its default)."""
        if self.bits is None:
            raise ValueError(f"method {self.method} has no bit width")
        return self.bits

    def to_dict(self) -> dict[str, Any]:
        """Every field, defaults included (the effective configuration)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def applied(self) -> dict[str, Any]:
        """`method` and the settings that apply to it: what a worker echoes in its READY line."""
        return {"method": self.method, **{name: getattr(self, name) for name in fields_for(self.method)}}

    def overrides(self) -> dict[str, Any]:
        """Fields that differ from their defaults, besides method and the OWN_KEYS."""
        return {
            f.name: getattr(self, f.name)
            for f in settings()
            if f.name not in OWN_KEYS and getattr(self, f.name) != f.default
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> KVCacheConfig:
        """Inverse of to_dict; unknown keys raise KVConfigError with a suggestion."""
        if "method" not in data:
            raise KVConfigError("method", "missing field 'method'")
        for key in data:
            if key != "method":
                field_named(key)
        return cls(**data)


def settings() -> tuple[dataclasses.Field, ...]:
    """All fields except `method`, in declaration order."""
    return tuple(f for f in dataclasses.fields(KVCacheConfig) if f.name != "method")


def field_named(name: str) -> dataclasses.Field:
    """The field called `name`; KVConfigError with a did-you-mean otherwise."""
    for f in settings():
        if f.name == name:
            return f
    raise KVConfigError(name, f"unknown field '{name}'{did_you_mean(name, [f.name for f in settings()])}")


def fields_for(method: str) -> tuple[str, ...]:
    """Names of the fields that apply to `method` (bits only if it has a bit width)."""
    return tuple(f.name for f in settings() if method in f.metadata["methods"])


def override_fields_for(method: str) -> tuple[str, ...]:
    """Fields that go in a YAML entry's `overrides` (those with their own key excluded)."""
    return tuple(n for n in fields_for(method) if n not in OWN_KEYS)


def owners(name: str) -> tuple[str, ...]:
    """Methods a field applies to."""
    return tuple(field_named(name).metadata["methods"])


def parse_value(name: str, text: str) -> Any:
    """Parse a `--set FIELD=VALUE` string with the field's declared type."""
    meta = field_named(name).metadata
    kind = meta["kind"]
    if meta["nullable"] and text.lower() in ("", "none", "null"):
        return None
    if kind is bool:
        lowered = text.lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise KVConfigError(name, f"{name} must be true or false, not '{text}'")
    try:
        return kind(text)
    except ValueError:
        raise KVConfigError(name, f"{name} must be {kind.__name__}, not '{text}'") from None
