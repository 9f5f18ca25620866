"""benchmarks/results/retrieval.md from retrieval.json: accuracy per arm and eviction verdicts."""

from __future__ import annotations

from typing import Any

from benchmarks.provenance import caption

KEEPS = 0.95  # a method's cell may fall short of fp16's by this factor's complement (one miss in 20)
REFERENCE_MIN = 0.8  # fp16 must retrieve this share at each context, or the verdicts mean nothing


def context_label(context: int) -> str:
    return f"{context // 1024}k" if context % 1024 == 0 else str(context)


def by_label(rows: list[dict[str, Any]]) -> dict[str, dict[int, dict[str, Any]]]:
    """{label: {context: row}} in first-seen order."""
    out: dict[str, dict[int, dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row["label"], {})[row["context"]] = row
    return out


def worst_depth(per_context: dict[int, dict[str, Any]]) -> tuple[float, str] | None:
    """(lowest accuracy, "depth @ context") over every measured cell, or None if none was."""
    cells = [
        (accuracy, f"{depth} @ {context_label(context)}")
        for context, row in sorted(per_context.items())
        for depth, accuracy in row.get("by_depth", {}).items()
    ]
    return min(cells, key=lambda c: c[0]) if cells else None


def reference_retrieves(reference: dict[int, dict[str, Any]]) -> bool:
    """The fp16 rows retrieve at least REFERENCE_MIN of the keys at every context (else no verdict)."""
    return bool(reference) and all(row.get("accuracy", 0.0) >= REFERENCE_MIN for row in reference.values())


def keeps_retrieval(per_context: dict[int, dict[str, Any]], reference: dict[int, dict[str, Any]]) -> bool:
    """At every (context, depth) cell of the fp16 reference, at least min(KEEPS, fp16's accuracy there).

    What fp16 retrieves is what a cache can keep: a cell fp16 misses asks nothing of the method.
    """
    if not per_context or any("error" in row for row in per_context.values()):
        return False
    for context, fp16_row in reference.items():
        row = per_context.get(context)
        if row is None:
            return False
        for depth, fp16_accuracy in fp16_row.get("by_depth", {}).items():
            if row["by_depth"].get(depth, 0.0) < min(KEEPS, fp16_accuracy):
                return False
    return True


def percent(row: dict[str, Any] | None, key: str = "accuracy") -> str:
    if row is None:
        return "-"
    if "error" in row:
        return "error"
    return f"{row[key] * 100:.0f} %" if key in row else "-"


def budget_text(per_context: dict[int, dict[str, Any]]) -> str:
    first = next(iter(per_context.values()))
    if first.get("fraction") is None:
        return "full"
    tokens = ", ".join(f"{r['budget']}" for _, r in sorted(per_context.items()))
    return f"{first['fraction'] * 100:.0f} % ({tokens} tokens)"


def verdicts(labels: dict[str, dict[int, dict[str, Any]]]) -> list[str]:
    """One line per eviction / hybrid method: does it keep retrieval at each budget fraction?"""
    methods: dict[str, list[str]] = {}
    # A cache cannot keep what the fp16 cache does not have: without a retrieving reference, no verdict.
    reference = labels.get("fp16", {})
    retrieves = reference_retrieves(reference)
    for label, per_context in labels.items():
        first = next(iter(per_context.values()))
        if first["family"] not in ("eviction", "hybrid"):
            continue
        name = label.split("@")[0]
        kept = keeps_retrieval(per_context, reference)
        answer = ("yes" if kept else "no") if retrieves else "n/a (fp16 does not retrieve)"
        methods.setdefault(name, []).append(f"keeps retrieval at {first['fraction'] * 100:.0f} %: {answer}")
    return [f"- **{name}**: " + "; ".join(parts) for name, parts in methods.items()]


def markdown(report: dict[str, Any]) -> str:
    labels = by_label(report["rows"])
    contexts = sorted({r["context"] for r in report["rows"]})
    head = " | ".join(f"accuracy at {context_label(c)}" for c in contexts)
    head += " | " + " | ".join(f"answer tokens at {context_label(c)}" for c in contexts)
    lines = [
        "# Pass-key retrieval through every cache",
        "",
        "Retrieval model `veloxd/assets/tiny-llama-retrieval`; the key at 11 depths (0.0 = first token of the "
        "prompt, 1.0 = just before the question); the question ends the prompt. Eviction budgets are fractions "
        "of the context. Accuracy: greedy decoding returns the whole key; answer tokens: teacher-forced share "
        "of the key's tokens predicted right (they include the leading space and the full stop, which need no "
        "retrieval: a cache that evicted the key, e.g. streaming_llm at shallow depths, still gets ~0.3). Heatmaps: `retrieval_heatmaps.png`, `retrieval_token_heatmaps.png`.",
        "",
        f"| method | family | budget | {head} | worst depth |",
        "|" + "---|" * (4 + 2 * len(contexts)),
    ]
    for label, per_context in labels.items():
        first = next(iter(per_context.values()))
        worst = worst_depth(per_context)
        worst_text = f"{worst[0] * 100:.0f} % ({worst[1]})" if worst else "-"
        cells = " | ".join(percent(per_context.get(c)) for c in contexts)
        cells += " | " + " | ".join(percent(per_context.get(c), "token_accuracy") for c in contexts)
        lines.append(f"| {label} | {first['family']} | {budget_text(per_context)} | {cells} | {worst_text} |")
    lines += [
        "",
        f"Verdicts (keeps retrieval = at every depth and context, at least {KEEPS * 100:.0f} % of keys, or "
        f"fp16's share where that is lower; given when fp16 retrieves at least {REFERENCE_MIN * 100:.0f} % at "
        "each context):",
        "",
    ]
    lines += verdicts(labels)
    if report.get("unavailable"):
        lines += ["", "Unavailable: " + "; ".join(f"{k}: {v}" for k, v in report["unavailable"].items())]
    plan = report.get("plan", {})
    if "provenance" in report:
        keys = ", ".join(f"{c}: {k}" for c, k in plan.get("keys_per_depth", {}).items())
        seconds = f"{report.get('seconds')} s"
        if report.get("resumed_with_rows"):
            seconds += f" after resuming with {report['resumed_with_rows']} rows measured before an interruption"
        lines += ["", caption(report["provenance"], f"keys per depth {keys}; {seconds}")]
    return "\n".join(lines) + "\n"
