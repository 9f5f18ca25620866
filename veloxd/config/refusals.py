"""Why a KV-cache setting an entry writes does not apply to its method, and which method would take it."""

from __future__ import annotations

from typing import Any

from veloxd.config.errors import short_repr
from veloxd.kv import registry
from veloxd.kv.config import OWN_KEYS, owners


def not_applicable(name: str, method: str, value: Any = None) -> str:
    """The refusal of setting `name` (= `value`, which only bits quotes) for `method`, and the hybrid that takes it.

    Own keys (bits, seed) say "does not apply ... (only to: ...)"; overrides "applies to method ...,
    not ...", as KVCacheConfig's own check words it.
    """
    hybrids = _hybrids_of(method, name)
    if name == "bits" and any(value in registry.get(h).bits_choices for h in hybrids):
        # Only a bit width the hybrid offers may be quoted back as "N-bit codes".
        return registry.bits_refusal(method, short_repr(value))
    hint = ""
    if hybrids:
        stores = " or ".join(dict.fromkeys(registry.parts(h)[1] for h in hybrids))
        hint = f"; to keep {method}'s tokens as {stores} codes use method {', '.join(hybrids)}"
    having = owners(name)
    if name not in OWN_KEYS:
        return f"{name} applies to method {', '.join(having)}, not {method}{hint}"
    plain = [m for m in having if registry.get(m).family != "hybrid"]
    mixed = [m for m in having if registry.get(m).family == "hybrid"]
    also = f", and the hybrids {', '.join(mixed)}" if mixed else ""
    return f"{name} does not apply to method {method} (only to: {', '.join(plain)}{also}){hint}"


def _hybrids_of(method: str, name: str) -> list[str]:
    """The hybrids whose eviction policy is `method` and that take setting `name`."""
    return [m for m in owners(name) if registry.get(m).family == "hybrid" and registry.parts(m)[0] == method]
