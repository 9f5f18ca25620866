"""Why a KV-cache setting does not apply to a method, and which hybrid would take it.

One wording for every place that refuses a setting: `veloxd check` (veloxd.config.validate),
`veloxd serve --set`/`--seed` and KVCacheConfig's own check (config_rules.check_setting).
It depends on the registry only, so the rules module can use it.
"""

from __future__ import annotations

from collections.abc import Sequence

from veloxd.kv import registry

OWN_KEYS = ("bits", "seed")  # settings written on the entry (flags of their own), not under overrides


def not_applicable(name: str, method: str, having: Sequence[str], value: object = None) -> str:
    """The refusal of setting `name` (= `value`, which only bits quotes) for `method`, given the
    methods `having` it, and the hybrid that takes it.

    Own keys (bits, seed) say "does not apply ... (only to: ...)"; overrides "applies to method ...,
    not ...".
    """
    hybrids = [m for m in having if registry.get(m).family == "hybrid" and registry.parts(m)[0] == method]
    if name == "bits" and any(value in registry.get(h).bits_choices for h in hybrids):
        # Only a bit width the hybrid offers (a small int) may be quoted back as "N-bit codes".
        return registry.bits_refusal(method, value)
    hint = ""
    if hybrids:
        stores = " or ".join(dict.fromkeys(registry.parts(h)[1] for h in hybrids))
        hint = f"; to keep {method}'s tokens as {stores} codes use method {', '.join(hybrids)}"
    if name not in OWN_KEYS:
        return f"{name} applies to method {', '.join(having) or 'no method'}, not {method}{hint}"
    plain = [m for m in having if registry.get(m).family != "hybrid"]
    mixed = [m for m in having if registry.get(m).family == "hybrid"]
    also = f", and the hybrids {', '.join(mixed)}" if mixed else ""
    return f"{name} does not apply to method {method} (only to: {', '.join(plain)}{also}){hint}"
