"""Why some families lose more to key quantization: the attention their fp16 run computes.

For a testkit family, records at every attention call of an fp16 run (mlx_lm's own caches) the
per-head key and query norms, the scale, the spread of the attention logits and the attention's
normalised entropy (1 = uniform over the keys, 0 = one key), then the KL of chosen methods.
`python -m testkit.attention_stats olmo2 gemma3_text llama ...` prints one line per family.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any, cast

from testkit import coverage, families

FIGURE_METHODS: dict[str, dict[str, Any]] = {
    "turboquant_mse-3": {"method": "turboquant_mse", "bits": 3, "recent_window": 8},
    "qjl": {"method": "qjl"},
}


def fp16_attention_stats(family: str, seed: int = 0) -> dict[str, float]:
    """Mean over layers and heads of the fp16 run's key/query norms, logit std and entropy."""
    import mlx.core as mx
    from mlx_lm.models import base

    model = families.build(family, seed)
    prompt = coverage.random_prompt(seed)
    rows: list[dict[str, float]] = []
    original = base.scaled_dot_product_attention

    def recording(queries, keys, values, cache, scale, mask, sinks=None):
        # queries [B, Hq, L, D], keys [B, Hkv, S, D]: GQA heads grouped onto their KV head
        hq, hkv = queries.shape[1], keys.shape[1]
        k = mx.repeat(keys, hq // hkv, axis=1).astype(mx.float32)
        q = queries.astype(mx.float32)
        logits = (q * scale) @ k.swapaxes(-1, -2)  # [B, Hq, L, S]
        s = logits.shape[-1]
        causal = mx.arange(s)[None, :] <= (mx.arange(q.shape[2])[:, None] + s - q.shape[2])
        masked = mx.where(causal, logits, -mx.inf)
        p = mx.softmax(masked, axis=-1)
        entropy = -(mx.where(causal, p * mx.log(mx.maximum(p, 1e-30)), 0.0)).sum(-1)
        norm_entropy = entropy[..., 1:] / mx.log(mx.arange(2, q.shape[2] + 1).astype(mx.float32))
        key_norm = mx.linalg.norm(k, axis=-1)
        rows.append(
            {
                "key_norm": cast(float, key_norm.mean().item()),
                "key_norm_cv": cast(float, (key_norm.std() / key_norm.mean()).item()),
                "query_norm": cast(float, mx.linalg.norm(q, axis=-1).mean().item()),
                "scale": float(scale),
                "logit_std": cast(float, mx.where(causal, logits, 0.0).std().item()),
                "entropy": cast(float, norm_entropy.mean().item()),
            }
        )
        return original(queries, keys, values, cache=cache, scale=scale, mask=mask, sinks=sinks)

    modules = [m for m in {type(x).__module__ for _, x in model.named_modules()} if m.startswith("mlx_lm.models.")]
    saved = {m: getattr(sys.modules[m], "scaled_dot_product_attention", None) for m in modules}
    for m, fn in saved.items():
        if fn is not None:
            sys.modules[m].scaled_dot_product_attention = recording  # type: ignore[attr-defined]
    try:
        model(mx.array([prompt]))  # no cache: one full causal pass
    finally:
        for m, fn in saved.items():
            if fn is not None:
                sys.modules[m].scaled_dot_product_attention = fn  # type: ignore[attr-defined]
    return {key: sum(r[key] for r in rows) / len(rows) for key in rows[0]}


def method_kls(family: str, seed: int = 0) -> dict[str, float]:

    from veloxd.kv import KVCacheConfig

    model = families.build(family, seed)
    prompt = coverage.random_prompt(seed)
    forced, ref = coverage.run(model, KVCacheConfig("fp16"), prompt, None)
    return {
        label: coverage.compare(ref, coverage.run(model, KVCacheConfig(**fields), prompt, forced)[1])[0]
        for label, fields in FIGURE_METHODS.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("family", nargs="+")
    args = parser.parse_args()
    for family in args.family:
        stats = fp16_attention_stats(family)
        kls = method_kls(family)
        print(
            f"{family:12} "
            + " ".join(f"{k}={v:.3f}" for k, v in stats.items())
            + " "
            + " ".join(f"kl[{k}]={v:.3f}" for k, v in kls.items()),
            flush=True,
        )


if __name__ == "__main__":
    main()
