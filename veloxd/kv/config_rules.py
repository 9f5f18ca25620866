"""The rules a `KVCacheConfig` checks on construction: each setting's type, owner and range
(from the metadata its field declares), and the rules that tie two settings of a method together.
Every failure is a KVConfigError naming the field."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from types import SimpleNamespace
from typing import Any

from veloxd.kv import registry
from veloxd.kv.refusals import not_applicable

TURBOQUANT = ("turboquant_mse", "turboquant_prod")


class KVConfigError(ValueError):
    """An invalid KV-cache setting: `field` names it ("method", "bits", "seed" or an override)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def check_setting(f: dataclasses.Field, value: Any, method: str) -> None:
    """One setting's type, owner (a non-default value only for its methods), choices and range."""
    meta = f.metadata
    if value is None and meta["nullable"]:
        return
    kind = meta["kind"]
    # bool is a subclass of int: reject it for int fields, and accept nothing else for bools.
    if isinstance(value, bool) != (kind is bool) or not isinstance(value, kind):
        raise KVConfigError(f.name, f"{f.name} must be {kind.__name__}, not {type(value).__name__} {value!r}")
    if method not in meta["methods"] and value != f.default:
        raise KVConfigError(f.name, not_applicable(f.name, method, meta["methods"], value))
    if meta["choices"] is not None and value not in meta["choices"]:
        raise KVConfigError(f.name, f"{f.name}={value!r} for method {method}: choose one of {list(meta['choices'])}")
    if meta["minimum"] is not None and value < meta["minimum"]:
        raise KVConfigError(f.name, f"{f.name}={value!r} for method {method}: must be >= {meta['minimum']}")
    if meta["maximum"] is not None and value > meta["maximum"]:
        raise KVConfigError(f.name, f"{f.name}={value!r} for method {method}: must be <= {meta['maximum']}")


# Settings that take effect only while another (boolean) setting is on: written alone they do
# nothing, which `veloxd check` reports as a warning (the file works, not as its author meant).
ENABLED_BY: dict[str, str] = {"snapkv_pyramid_beta": "snapkv_pyramid"}


def check_cross_fields(settings: Mapping[str, Any]) -> None:
    """Rules beyond one setting's own range (a multiple of, odd, below another setting): the first
    broken one raises. `settings` is every field by name (`KVCacheConfig.to_dict()`): this module
    never imports the config class, which calls it on construction."""
    broken = broken_rules(settings)
    if broken:
        raise broken[0]


def broken_rules(settings: Mapping[str, Any], invalid: AbstractSet[str] = frozenset()) -> list[KVConfigError]:
    """Every rule `settings` breaks, in order, each naming its field. A rule reading a setting in
    `invalid` is skipped: that setting is wrong on its own (the caller puts its default in
    `settings`), so the rule's verdict would rest on a value the user did not write."""
    c = SimpleNamespace(**settings)
    policy = registry.parts(c.method)[0]
    found: list[KVConfigError] = []

    def rule(applies: bool, reads: tuple[str, ...], broken: bool, message: str) -> None:
        # reads[0] is the setting blamed; the others are what it is compared with.
        if applies and broken and not any(name in invalid for name in reads):
            found.append(KVConfigError(reads[0], message))

    rule(
        c.method == "kivi",
        ("kivi_residual_length", "kivi_group_size"),
        c.kivi_residual_length % c.kivi_group_size != 0,
        f"kivi_residual_length={c.kivi_residual_length} for method kivi: "
        f"must be a multiple of kivi_group_size={c.kivi_group_size}",
    )
    rule(
        c.method == "qjl",
        ("qjl_sketch_dim",),
        c.qjl_sketch_dim % 32 != 0,
        f"qjl_sketch_dim={c.qjl_sketch_dim} for method qjl: must be a multiple of 32",
    )
    rule(
        c.method in TURBOQUANT,
        ("turboquant_outlier_channels",),
        c.turboquant_outlier_channels % 32 != 0,
        f"turboquant_outlier_channels={c.turboquant_outlier_channels} for method {c.method}: must be a multiple of 32",
    )
    rule(
        policy == "snapkv",
        ("snapkv_window", "snapkv_budget"),
        c.snapkv_window > c.snapkv_budget,
        f"snapkv_window={c.snapkv_window} for method {c.method}: must not exceed snapkv_budget={c.snapkv_budget}",
    )
    rule(
        policy == "snapkv",
        ("snapkv_kernel",),
        c.snapkv_kernel % 2 == 0,
        f"snapkv_kernel={c.snapkv_kernel} for method {c.method}: must be odd",
    )
    rule(
        policy == "knorm",
        ("knorm_window", "knorm_budget"),
        c.knorm_window >= c.knorm_budget,
        f"knorm_window={c.knorm_window} for method {c.method}: must be below knorm_budget={c.knorm_budget}",
    )
    rule(
        policy == "h2o",
        ("h2o_window", "h2o_budget"),
        c.h2o_window >= c.h2o_budget,
        f"h2o_window={c.h2o_window} for method {c.method}: must be below h2o_budget={c.h2o_budget}",
    )
    return found
