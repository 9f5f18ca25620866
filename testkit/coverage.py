"""The family coverage matrix: every testkit family through every method, served or refused.

A cell is either served (a 64-token prompt, then 8 decode steps teacher-forced on the fp16
continuation, compared with mlx_lm's own caches: mean KL and greedy top-1 agreement) or refused
before load by the pre-load check on the family's config.json (veloxd.kv.preflight), with its
reason. Settings are small so that compression really engages at 64 tokens (`SETTINGS`).

The docs table shows each cell's verdict (`verdicts`: the pre-load check alone, fast); the matrix
test (tests/kv/test_families.py) proves that every "served" cell really serves within its bound.
`python -m testkit.coverage` prints the table (`--figures`: runs the matrix and prints each served
cell's KL and agreement); `--write` splices the table into docs/models.md between the markers
(tests/kv/test_families.py checks the page for drift).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from testkit import families
from veloxd.kv import KVCacheConfig, registry

PROMPT, DECODE = 64, 8
SMALL_BUDGET = {"knorm": 48, "snapkv": 48, "tova": 48, "h2o": 48}
SETTINGS: dict[str, dict[str, Any]] = {  # per method part: windows small enough for a 64-token prompt
    "affine": {"recent_window": 8},
    "turboquant_mse": {"recent_window": 8},
    "turboquant_prod": {"recent_window": 8},
    "kivi": {"kivi_group_size": 32, "kivi_residual_length": 32},
    "streaming_llm": {"streaming_llm_sinks": 4, "streaming_llm_window": 44},
    "knorm": {"knorm_budget": 48, "knorm_window": 8},
    "snapkv": {"snapkv_budget": 48, "snapkv_window": 8},
    "tova": {"tova_budget": 48},
    "h2o": {"h2o_budget": 48, "h2o_window": 8},
}
DOC = Path(__file__).resolve().parents[1] / "docs" / "models.md"
BEGIN, END = "<!-- coverage:begin (python -m testkit.coverage --write) -->", "<!-- coverage:end -->"


@dataclass(frozen=True)
class Cell:
    family: str
    method: str
    refusal: str | None = None  # the pre-load check's reason
    kl: float = math.nan  # mean KL(fp16 || method) over the decode steps
    agreement: float = math.nan  # fraction of decode steps whose top-1 token is fp16's (ties: see compare)


def methods() -> list[str]:
    return [m for m in registry.names() if m != "fp16"]


def kv_config(method: str) -> KVCacheConfig:
    info = registry.get(method)
    fields: dict[str, Any] = {}
    for part in info.parts or (method,):
        fields.update(SETTINGS.get(part, {}))
    if info.family == "hybrid":  # a hybrid's recent window is the policy's; the quantizer's own does not apply
        fields.pop("recent_window", None)
    return KVCacheConfig(method=method, **fields)


def refusal(family: str, method: str) -> str | None:
    from veloxd.kv.preflight import check

    try:
        check(families.config(family), kv_config(method))
    except ValueError as err:
        return str(err)
    return None


def _logprobs(logits: Any) -> Any:
    import mlx.core as mx

    return logits - mx.logsumexp(logits, axis=-1, keepdims=True)


def run(model: Any, config: KVCacheConfig, prompt: list[int], forced: list[int] | None) -> tuple[list[int], list[Any]]:
    """Prompt, then DECODE - 1 single-token steps: the tokens fed and the log-probs after the prompt and each.

    `forced` None decodes greedily (the fp16 reference); otherwise those tokens are fed (teacher forcing).
    """
    import mlx.core as mx

    from veloxd.kv import make_caches

    cache = make_caches(model, config)
    lps = [_logprobs(model(mx.array([prompt]), cache=cache)[0, -1])]
    fed: list[int] = []
    for step in range(DECODE - 1):
        token = cast(int, mx.argmax(lps[-1]).item()) if forced is None else forced[step]
        fed.append(token)
        lps.append(_logprobs(model(mx.array([[token]]), cache=cache)[0, -1]))
        mx.eval(lps[-1])
    return fed, lps


TIE_NATS = 0.1  # a token fp16 rates within this of its best is as greedy a choice as its argmax


def compare(ref: list[Any], got: list[Any]) -> tuple[float, float]:
    """(mean KL(fp16 || method), greedy agreement) over the steps.

    Random weights give flat next-token distributions whose top two often differ by hundredths of
    a nat, so agreement counts the method's top-1 as fp16's when fp16 rates it within TIE_NATS of
    its own top-1 (a tie in the reference, not a change of the greedy choice).
    """
    import mlx.core as mx

    kls = [float((mx.exp(p) * (p - q)).sum().item()) for p, q in zip(ref, got)]
    agree = [int(p.max().item() - p[mx.argmax(q)].item() <= TIE_NATS) for p, q in zip(ref, got)]
    return sum(kls) / len(kls), sum(agree) / len(agree)


def random_prompt(seed: int) -> list[int]:
    import mlx.core as mx

    mx.random.seed(seed + 1)
    return cast(list[int], mx.random.randint(3, families.VOCAB, (PROMPT,)).tolist())


def family_cells(family: str, method_names: list[str] | None = None, seed: int = 0) -> list[Cell]:

    names = method_names or methods()
    verdicts = {m: refusal(family, m) for m in names}
    cells = [Cell(family, m, refusal=r) for m, r in verdicts.items() if r is not None]
    served = [m for m, r in verdicts.items() if r is None]
    if served:
        model = families.build(family, seed)
        prompt = random_prompt(seed)
        forced, ref = run(model, KVCacheConfig("fp16"), prompt, None)
        for method in served:
            kl, agreement = compare(ref, run(model, kv_config(method), prompt, forced)[1])
            cells.append(Cell(family, method, kl=kl, agreement=agreement))
    order = {m: i for i, m in enumerate(names)}
    return sorted(cells, key=lambda c: order[c.method])


def matrix(family_names: list[str] | None = None) -> list[Cell]:
    """Every cell, served ones measured (minutes on a CPU)."""
    return [c for f in family_names or families.families() for c in family_cells(f)]


def verdicts(family_names: list[str] | None = None) -> list[Cell]:
    """Every cell's pre-load verdict only (no model is built): what the docs table shows."""
    return [Cell(f, m, refusal=refusal(f, m)) for f in family_names or families.families() for m in methods()]


def short_reason(reason: str) -> str:
    """The refusal's cause, as the table states it (the words after the model type)."""
    from veloxd.kv import attention

    for phrase, label in (
        (attention.FUSED, "fused kernel"),
        (attention.SOFTCAP, "soft-capping"),
        (attention.BY_HAND, "hand-written"),
        (attention.SINKS, "sinks"),
        (attention.KV_READ_BACK, "KV read-back"),
        (attention.KV_SHARED, "KV sharing"),
        (attention.NO_ATTENTION, "no attention"),
        ("no plain attention layer", "no plain layer"),
    ):
        if phrase in reason:
            return label
    return reason.split(":")[0]


def table(cells: list[Cell]) -> str:
    """Markdown: one row per family, one column per method; 'served' or 'refused (cause)'."""
    names = list(dict.fromkeys(c.method for c in cells))
    rows = ["| family | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for family in dict.fromkeys(c.family for c in cells):
        by_method = {c.method: c for c in cells if c.family == family}
        marks = [
            "served" if by_method[m].refusal is None else f"refused ({short_reason(by_method[m].refusal or '')})"
            for m in names
        ]
        rows.append(f"| {family} | " + " | ".join(marks) + " |")
    return "\n".join(rows) + "\n"


def splice(page: str, body: str) -> str:
    start, end = page.index(BEGIN) + len(BEGIN), page.index(END)
    return page[:start] + "\n" + body + page[end:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"splice the table into {DOC}")
    parser.add_argument("--figures", action="store_true", help="also print each served cell's KL and agreement")
    args = parser.parse_args()
    cells = matrix() if args.figures else verdicts()
    body = table(cells)
    if args.figures:
        for c in cells:
            if c.refusal is None:
                print(f"{c.family:12} {c.method:22} kl={c.kl:.4f} agree={c.agreement:.2f}")
    if args.write:
        DOC.write_text(splice(DOC.read_text(), body))
    print(body, end="")


if __name__ == "__main__":
    main()
