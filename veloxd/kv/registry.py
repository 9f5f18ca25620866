"""The method registry: one `MethodInfo` per KV-cache method veloxd serves.

Drives the YAML schema, `veloxd methods`, CLI help, the READY line and the docs tables.
Every method listed here is servable end to end; there is no "crash tier". The flags are
honest: `storage` says what is really resident, `batchable` whether mlx_lm's batched path
keeps the compressed class, `trimmable` whether prefix reuse can trim it. A `hybrid` method is
an eviction policy over a quantizer's packed store, named `<policy>_<quantizer>` (one entry per
implemented pair, so every consumer of the registry sees exactly the pairs that exist); the
settings of both parts apply to it (`with_hybrids`).
This module imports no mlx, and nothing else of veloxd: `veloxd.kv.config` builds on it (the
fields that apply to a method come from `config.fields_for`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

from veloxd.checks import did_you_mean

Family = Literal["baseline", "quantization", "eviction", "hybrid"]
Storage = Literal["fp16", "packed", "evicted"]
Trimmable = Literal["yes", "until_eviction", "no"]


@dataclass(frozen=True)
class MethodInfo:
    name: str
    family: Family
    summary: str
    paper: str
    storage: Storage
    batchable: bool
    trimmable: Trimmable
    impl: str  # "module:Class" of the per-request cache, imported lazily (mlx lives there)
    bits_choices: tuple[int, ...] = ()
    default_bits: int | None = None
    deviations: str = ""
    parts: tuple[str, ...] = ()  # hybrid: (eviction policy, quantizer holding its retained tokens)

    @property
    def evicts(self) -> bool:
        """Holds at most a budget of tokens (an eviction policy, alone or over a quantized store)."""
        return self.family in ("eviction", "hybrid")

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["bits_choices"] = list(self.bits_choices)
        data["parts"] = list(self.parts)
        del data["impl"]
        return data


_SINGLE: tuple[MethodInfo, ...] = (  # the baseline, the quantizers, the eviction policies
    MethodInfo(
        name="fp16",
        family="baseline",
        summary="Uncompressed cache in the model's activation dtype (mlx_lm's KVCache). The explicit baseline, never a fallback.",
        paper="(none: reference arm)",
        storage="fp16",
        batchable=True,
        trimmable="yes",
        impl="mlx_lm.models.cache:KVCache",
    ),
    MethodInfo(
        name="affine",
        family="quantization",
        summary="Per-token affine groups stored as mx.quantize triples; optional separate key bits and Hadamard-rotated keys.",
        paper="Per-token group quantization as in mlx_lm QuantizedKVCache; rotation after QuaRot (Ashkboos et al., 2024)",
        storage="packed",
        batchable=True,
        trimmable="yes",
        impl="veloxd.kv.quant.affine:AffineCache",
        bits_choices=(2, 3, 4, 6, 8),
        default_bits=4,
        deviations="Values are never rotated (QuaRot folds their rotation into model weights); one rotation per layer from seed + layer index; fp16 scales and biases (bits + 32/group_size bits per element). The newest recent_window tokens are also kept exact and read instead of their codes by every query within that distance (a KIVI-style residual window over any per-token codec: veloxd.kv.quant.window); after a trim of n tokens the n oldest window slots read codes until new tokens arrive.",
    ),
    MethodInfo(
        name="kivi",
        family="quantization",
        summary="Keys quantized per channel over token groups, values per token, recent tokens in full precision.",
        paper="KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache (Liu et al., ICML 2024, arXiv 2402.02750)",
        storage="packed",
        batchable=True,
        trimmable="yes",
        impl="veloxd.kv.quant.kivi:KIVICache",
        bits_choices=(2, 4),
        default_bits=4,
        deviations="Values are quantized with their keys, whole groups at a time, so R..R+G-1 recent tokens of both stay exact (KIVI: exactly R values, 0..R-1 keys); fp16 scales and zeros; trimming into a quantized group dequantizes its kept part into the window.",
    ),
    MethodInfo(
        name="turboquant_mse",
        family="quantization",
        summary="Randomized Hadamard rotation, Lloyd-Max scalar codebook per coordinate, one norm per vector.",
        paper="TurboQuant: Online Vector Quantization with Near-optimal Distortion Rate (Zandieh et al., 2025, arXiv 2504.19874)",
        storage="packed",
        batchable=True,
        trimmable="yes",
        impl="veloxd.kv.quant.turboquant:TurboQuantMSECache",
        bits_choices=(2, 3, 4),
        default_bits=4,
        deviations="Randomized Hadamard rotation instead of a dense random orthogonal matrix; the fp16 per-vector scalar is the norm re-corrected for the decoded vector's norm (the paper stores the plain norm); outlier channels are the first turboquant_outlier_channels rotated channels given one more bit (the paper splits channels found before rotation); Lloyd-Max attention decodes codes per key chunk (~2.5-3x fp16 attention time on CPU); turboquant_codebook: uniform uses evenly spaced levels and quantized_matmul instead. Bits per element: bits + outliers/d + 16/d; turboquant_key_bits gives keys their own width. The newest recent_window tokens are also kept exact and read instead of their codes by every query within that distance (a KIVI-style residual window over any per-token codec: veloxd.kv.quant.window); after a trim of n tokens the n oldest window slots read codes until new tokens arrive.",
    ),
    MethodInfo(
        name="turboquant_prod",
        family="quantization",
        summary="TurboQuant-MSE at bits-1 plus a 1-bit QJL sketch of the key residual: unbiased inner products.",
        paper="TurboQuant (Zandieh et al., 2025, arXiv 2504.19874), inner-product variant",
        storage="packed",
        batchable=True,
        trimmable="yes",
        impl="veloxd.kv.quant.turboquant:TurboQuantProdCache",
        bits_choices=(2, 3, 4),
        default_bits=4,
        deviations="As turboquant_mse; the residual sketch S is a d x d Gaussian per layer (seed + layer index), fp16 residual norm. Keys (bits-1) + 1 + outliers/d + 32/d bits per element, values bits + outliers/d + 16/d. turboquant_key_bits replaces bits for the keys. The newest recent_window tokens are also kept exact and read instead of their codes by every query within that distance (a KIVI-style residual window over any per-token codec: veloxd.kv.quant.window); after a trim of n tokens the n oldest window slots read codes until new tokens arrive.",
    ),
    MethodInfo(
        name="qjl",
        family="quantization",
        summary="Keys as a 1-bit Johnson-Lindenstrauss sign sketch plus their norms; values affine-quantized (bits = value bits).",
        paper="QJL: 1-Bit Quantized JL Transform for KV Cache Quantization with Zero Overhead (Zandieh et al., 2024, arXiv 2406.03482)",
        storage="packed",
        batchable=True,
        trimmable="yes",
        impl="veloxd.kv.quant.qjl:QJLCache",
        bits_choices=(2, 4, 8),
        default_bits=4,
        deviations="No separate sketch for outlier channels and no unquantized first layers; one dense Gaussian S per layer (seed + layer index); fp16 key norms. Bits per token and head: qjl_sketch_dim + 16 (key) + Dv * (bits + 32/qjl_value_group_size) (value). No recent window (its queries are sketch projections, which exact keys cannot meet).",
    ),
    MethodInfo(
        name="streaming_llm",
        family="eviction",
        summary="Attention-sink tokens plus a window of the most recent tokens; constant memory.",
        paper="Efficient Streaming Language Models with Attention Sinks (Xiao et al., ICLR 2024, arXiv 2309.17453)",
        storage="evicted",
        batchable=True,
        trimmable="until_eviction",
        impl="veloxd.kv.evict.streaming:StreamingLLMCache",
        deviations="Keys keep their true positions (the paper re-indexes positions inside the cache); the sink + window visibility also applies inside prefill chunks, so chunking never changes the result.",
    ),
    MethodInfo(
        name="knorm",
        family="eviction",
        summary="Keeps the keys with the lowest L2 norm plus a recent window; needs no queries.",
        paper="A Simple and Effective L2 Norm-Based Strategy for KV Cache Compression (Devoto et al., EMNLP 2024, arXiv 2406.11430)",
        storage="evicted",
        batchable=True,
        trimmable="until_eviction",
        impl="veloxd.kv.evict.knorm:KNormCache",
        deviations="Selection per KV head (as kvpress); the knorm_window most recent tokens are always kept; eviction after every step that leaves more than knorm_budget tokens.",
    ),
    MethodInfo(
        name="snapkv",
        family="eviction",
        summary="At the end of prefill, keeps the prompt tokens an observation window of queries attends to most, per KV head.",
        paper="SnapKV: LLM Knows What You are Looking for Before Generation (Li et al., 2024, arXiv 2404.14469); PyramidKV budgets (Cai et al., 2024, arXiv 2406.02069)",
        storage="evicted",
        batchable=True,
        trimmable="until_eviction",
        impl="veloxd.kv.evict.snapkv:SnapKVCache",
        deviations="Decode re-compresses every snapkv_window steps when over budget (the paper lets decode grow), so a layer holds at most budget + window tokens; pooling runs over retained tokens in position order; after a trim the observation window holds only the queries stashed before the cut.",
    ),
    MethodInfo(
        name="tova",
        family="eviction",
        summary="Over budget, drops the token with the lowest attention from the current query, averaged over heads.",
        paper="Transformers are Multi-State RNNs (Oren et al., 2024, arXiv 2401.06104)",
        storage="evicted",
        batchable=True,
        trimmable="until_eviction",
        impl="veloxd.kv.evict.tova:TOVACache",
        deviations="A prefill chunk attends with nothing evicted inside it, then keeps the tova_budget tokens its last query attends to most.",
    ),
    MethodInfo(
        name="h2o",
        family="eviction",
        summary="Keeps heavy hitters by accumulated attention plus the most recent tokens.",
        paper="H2O: Heavy-Hitter Oracle for Efficient Generative Inference of Large Language Models (Zhang et al., NeurIPS 2023, arXiv 2306.14048)",
        storage="evicted",
        batchable=True,
        trimmable="until_eviction",
        impl="veloxd.kv.evict.h2o:H2OCache",
        deviations="A prefill chunk attends with nothing evicted inside it and evicts at its end; after a trim the accumulated scores keep what the trimmed queries contributed.",
    ),
)


def _hybrid(policy: MethodInfo, storage: MethodInfo, impl: str, paper: str, deviations: str) -> MethodInfo:
    """An eviction policy whose retained tokens are held in a quantizer's packed per-token form."""
    return MethodInfo(
        name=f"{policy.name}_{storage.name}",
        family="hybrid",
        summary=f"{policy.name} eviction; the retained tokens are stored as {storage.name} codes (bits per element).",
        paper=f"{policy.paper}; storage: {paper}",
        storage="packed",
        batchable=policy.batchable and storage.batchable,
        trimmable="until_eviction",
        impl=impl,
        bits_choices=storage.bits_choices,
        default_bits=storage.default_bits,
        deviations=f"{policy.name}: {policy.deviations} Storage: {deviations}",
        parts=(policy.name, storage.name),
    )


# Eviction over a quantized store: which (policy, quantizer) pairs are implemented. Only
# per-token quantizers fit the eviction slots (evicting a token is a gather of its codes rows);
# QUANTIZERS_NOT_STORABLE says why the others are absent, for the error a user gets.
_AFFINE_SLOTS = (
    "Keys and values are stored as per-token affine groups along the head dimension (affine_group_size, "
    "affine_key_bits, affine_rotate and seed as for affine; rotated keys meet rotated queries in every "
    "score); a step's own keys are quantized before it attends to them, as in affine; the policy scores "
    "tokens from the quantized keys, except knorm, which takes norms of the keys before quantization."
)
_SINGLE_BY_NAME = {m.name: m for m in _SINGLE}
HYBRIDS: tuple[MethodInfo, ...] = tuple(
    _hybrid(
        _SINGLE_BY_NAME[policy],
        _SINGLE_BY_NAME["affine"],
        f"veloxd.kv.evict.quantized:{cls}AffineCache",
        "per-token affine groups along the head dimension, as mlx's mx.quantize (mlx_lm QuantizedKVCache)",
        _AFFINE_SLOTS,
    )
    for policy, cls in (
        ("streaming_llm", "StreamingLLM"),
        ("knorm", "KNorm"),
        ("snapkv", "SnapKV"),
        ("tova", "TOVA"),
        ("h2o", "H2O"),
    )
)
QUANTIZERS_NOT_STORABLE = {
    "kivi": "KIVI quantizes keys per channel over groups of tokens, so one token cannot leave its group "
    "without requantizing the group",
    "turboquant_mse": "not implemented yet (per-token, so it could be)",
    "turboquant_prod": "not implemented yet (per-token, so it could be)",
    "qjl": "not implemented yet (per-token, so it could be)",
}
METHODS: tuple[MethodInfo, ...] = _SINGLE + HYBRIDS
_BY_NAME = {m.name: m for m in METHODS}


def names() -> tuple[str, ...]:
    """Every method, in registry order (each one servable: there is no "crash tier")."""
    return tuple(m.name for m in METHODS)


def get(name: str) -> MethodInfo:
    """The method called `name`; ValueError naming the valid ones (and a near miss) otherwise."""
    info = _BY_NAME.get(name)
    if info is None:
        raise ValueError(unknown_method(name))
    return info


def unknown_method(name: str) -> str:
    """Why `name` is not a method: a near miss, or the reason an eviction x quantizer pair is absent."""
    for policy in (m for m in METHODS if m.family == "eviction"):
        storage = name.removeprefix(f"{policy.name}_")
        if storage != name and storage in QUANTIZERS_NOT_STORABLE:
            have = [m.name for m in HYBRIDS if m.parts[0] == policy.name]
            return (
                f"unknown method '{name}': {policy.name} over {storage} storage is not implemented: "
                f"{QUANTIZERS_NOT_STORABLE[storage]} (implemented: {', '.join(have) or 'none'})"
            )
    return f"unknown method '{name}'{did_you_mean(name, names())} (valid: {', '.join(names())})"


def parts(name: str) -> tuple[str, ...]:
    """The methods whose settings apply to `name`: its parts for a hybrid, else itself."""
    return _BY_NAME[name].parts or (name,)


def with_hybrids(*names: str) -> tuple[str, ...]:
    """`names` and every hybrid built on one of them (the methods a shared setting applies to)."""
    return (*names, *(m.name for m in HYBRIDS if set(m.parts) & set(names)))


def methods_with_bits() -> tuple[str, ...]:
    return tuple(m.name for m in METHODS if m.bits_choices)


def bits_refusal(method: str, bits: object) -> str:
    """Why `bits` is refused for `method`, which has no bit width: every method that has one, hybrids included."""
    having = methods_with_bits()
    plain = [m for m in having if _BY_NAME[m].family != "hybrid"]
    hybrids = [m for m in having if _BY_NAME[m].family == "hybrid"]
    own = [m for m in hybrids if _BY_NAME[m].parts[0] == method]
    text = f"bits does not apply to method {method} (only to: {', '.join(plain)}, and the hybrids {', '.join(hybrids)})"
    if own:
        text += f"; to keep {method}'s tokens as {bits}-bit codes use method {', '.join(own)}"
    return text
