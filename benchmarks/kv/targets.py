"""The acceptance targets of the quantizer and eviction issues, checked against the measured rows."""

from __future__ import annotations

from typing import Any

MIN_DECODE_RATIO = 0.7
MAX_EVICTED_STORED = 0.15


def ok(flag: bool) -> str:
    return "met" if flag else "NOT met"


def usable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in rows if not r.get("error") and r.get("kl_mean") is not None]


def beats_peer(rows: list[dict[str, Any]], bits: int) -> tuple[dict | None, list[dict]]:
    """(the peer row at `bits`, veloxd quantizer rows with lower KL at no more stored bytes)."""
    peer = next((r for r in rows if r["family"] == "peer" and r["bits"] == bits), None)
    if peer is None:
        return None, []
    better = [
        r
        for r in rows
        if r["family"] == "quantization"
        and r["stored_vs_fp16"] <= peer["stored_vs_fp16"]
        and r["kl_mean"] < peer["kl_mean"]
    ]
    return peer, sorted(better, key=lambda r: r["kl_mean"])


def peer_lines(rows: list[dict[str, Any]], variant: str, context: int) -> list[str]:
    lines = []
    for bits in (2, 3, 4):
        peer, better = beats_peer(rows, bits)
        if peer is None:
            continue
        names = ", ".join(f"`{r['label']}` (KL {r['kl_mean']:.4f}, {r['stored_vs_fp16']:.3f}x)" for r in better[:4])
        lines.append(
            f"- {variant}, {context} tokens, {bits} bits: {ok(bool(better))}; mlx-q{bits} KL "
            f"{peer['kl_mean']:.4f} at {peer['stored_vs_fp16']:.3f}x" + (f"; better: {names}" if names else "")
        )
    return lines


def targets_section(report: dict[str, Any], serving: dict[str, Any] | None = None) -> str:
    rows = usable(report["rows"])
    base = sorted({r["variant"] for r in rows})[:1]
    out = ["## Targets (issues 5 and 6)", ""]
    contexts = sorted({r["context"] for r in rows})
    long_context = 4096 if 4096 in contexts else (contexts[-1] if contexts else None)
    at_long = [r for r in rows if r["context"] == long_context and r["variant"] in base]
    out.append(f"Prefill peak <= fp16 at {long_context} tokens ({', '.join(base)}):")
    for r in at_long:
        if r["family"] in ("quantization", "eviction") and r.get("prefill_peak_vs_fp16") is not None:
            out.append(f"- `{r['label']}`: {r['prefill_peak_vs_fp16']:.2f}x, {ok(r['prefill_peak_vs_fp16'] <= 1.0)}")
    out += ["", f"Decode tokens/s >= {MIN_DECODE_RATIO}x fp16 at {long_context} tokens (CPU):"]
    for r in at_long:
        if r["family"] in ("quantization", "eviction", "peer") and r.get("decode_speed_vs_fp16") is not None:
            out.append(
                f"- `{r['label']}`: {r['decode_speed_vs_fp16']:.2f}x, {ok(r['decode_speed_vs_fp16'] >= MIN_DECODE_RATIO)}"
            )
    out += ["", "Some veloxd quantizer has lower KL than mlx_lm QuantizedKVCache at equal or fewer stored bytes:"]
    for variant in sorted({r["variant"] for r in rows}):
        for context in contexts:
            out += peer_lines(
                [r for r in rows if r["variant"] == variant and r["context"] == context], variant, context
            )
    evicted = [
        r
        for r in rows
        if r["family"] == "eviction" and r["context"] >= 4096 and r.get("budget") == 512 and r["variant"] in base
    ]
    if evicted:
        out += ["", f"Eviction stored bytes at 4k+ with a 512-token budget <= {MAX_EVICTED_STORED}x fp16:"]
        for r in evicted:
            out.append(
                f"- `{r['label']}` at {r['context']}: {r['stored_vs_fp16']:.3f}x, "
                f"{ok(r['stored_vs_fp16'] <= MAX_EVICTED_STORED)}"
            )
    passkey = [p for p in report.get("passkey", []) if "accuracy" in p]
    reference = {p["variant"]: p["accuracy"] for p in passkey if p["label"] == "fp16"}
    if passkey:
        out += ["", "Pass-key at a 25 % budget (vs the fp16 cache on the same trials):"]
        evicted_passkey = [p for p in passkey if p["family"] == "eviction"]
        for p in evicted_passkey:
            out.append(
                f"- {p['variant']} `{p['label']}`: {p['accuracy']:.0%} (fp16 {reference.get(p['variant'], 0):.0%})"
            )
        if not evicted_passkey:
            out.append(
                f"- not measurable: the fp16 cache itself retrieves "
                f"{', '.join(f'{v:.0%} ({k})' for k, v in reference.items())} of the keys, so the methods were not "
                "run (see the older-only token accuracy instead)"
            )
    if serving:
        out += ["", "Serving: see the serving table (cold start and throughput ratios vs mlx_lm.server)."]
    return "\n".join(out) + "\n"
