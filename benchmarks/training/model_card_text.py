"""Render MODEL_CARD.md for the shipped tiny model from its config, training log and evaluation."""

from __future__ import annotations

import math
from typing import Any


def parameter_count(c: dict[str, Any]) -> int:
    h, d, i = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    attention = h * d * (2 * c["num_attention_heads"] + 2 * c["num_key_value_heads"])
    per_layer = attention + 3 * h * i + 2 * h
    return c["num_hidden_layers"] * per_layer + c["vocab_size"] * h + h


def phases_text(phases: list[list[Any]]) -> str:
    """'128 tokens of span-copy warm-up from 0 %, then 256 from 20 %, ...' from the training log."""
    parts = []
    for phase in phases:
        start, length = phase[0], phase[1]
        warmup = len(phase) > 2 and phase[2]
        parts.append(f"{length} tokens{' of span-copy warm-up data' if warmup else ''} from {start:.0%}")
    return ", then ".join(parts) + " of the run"


def render(config: dict[str, Any], training: dict[str, Any], ev: dict[str, Any]) -> str:
    params = parameter_count(config)
    first, last = training["history"][0], training["history"][-1]
    pk = ev["passkey_fp16_1k"]
    depth_cells = " | ".join(f"{v:.0%}" for v in pk["by_depth"].values())
    depth_head = " | ".join(f"depth {d}" for d in pk["by_depth"])
    late = ev["late_identifier_recall"]
    variant = ev["outlier_variant"]
    formed = pk["accuracy"] >= 0.9
    retrieval_note = (
        "Retrieval formed: the model copies the key from wherever it sits in the prompt."
        if formed
        else f"Retrieval reached {pk['accuracy']:.0%}, below the 90 % aim: judge eviction methods by KL and top-1 at "
        "positions past the budget window, and by the late-identifier figures below, not by pass-key alone."
    )
    prov = ev["provenance"]
    copy = ev.get("copy_loss_by_gap", {})
    copied = copy and min(copy.values()) < 0.5 * ev["uniform_nll"]
    copy_note = (
        (
            "Copying probe: mean NLL on the second copy of a 30-token random span, by the random-token gap "
            f"between the copies: {', '.join(f'gap {g}: {v:.2f}' for g, v in copy.items())} nats, against "
            f"{ev['uniform_nll']:.2f} for a uniform guess. "
            + (
                "The model copies: induction heads formed."
                if copied
                else "No induction (copying) head formed within the budget, so the model cannot look a key up."
            )
        )
        if copy
        else ""
    )
    warmup = training.get("induction_warmup", 0)
    command = (
        "python -m benchmarks.training.train_tiny --minutes 55"
        + (f" --induction-warmup {warmup}" if warmup else "")
        + " --out veloxd/assets/tiny-llama"
    )
    notes = "\n".join(f"- {n}" for n in ev.get("notes", []))
    history = f"\n### Run history\n{notes}\n" if notes else ""
    return f"""# tiny-llama (veloxd's benchmark model)

A {params / 1e6:.2f} M-parameter llama-architecture model trained from scratch on this machine so that
KV-cache quality can be measured on a model with real (not random) attention patterns. It is a
measuring instrument, not a useful language model.

## Architecture
| field | value |
|---|---|
| layers | {config["num_hidden_layers"]} |
| hidden size | {config["hidden_size"]} |
| query heads / KV heads (GQA) | {config["num_attention_heads"]} / {config["num_key_value_heads"]} |
| head_dim | {config["head_dim"]} |
| MLP (SwiGLU) | {config["intermediate_size"]} |
| vocabulary | {config["vocab_size"]} (byte-level BPE, `tokenizers`; special tokens `<unk> <s> </s> <|system|> <|user|> <|assistant|>`; chat template from `testkit/tinymodel.py`) |
| positions | RoPE, theta {config["rope_theta"]:.0f}, trained up to 1024 tokens |
| weights | float16 safetensors, tied embeddings, {params * 2 / 1e6:.1f} MB |

## Data
- CPython {prov["python"]} standard-library sources (non-test `.py` files) and the `pydoc_data` topic
  pages: {training["train_tokens_in_corpus"] / 1e6:.2f} M training tokens. Files are split train/held-out by a
  SHA-256 hash of their path (`benchmarks/data.py`, about 3 % held out; {ev["held_out_files"]} held-out files).
- Mixed into 60 % of the sequences: pass-key segments ("The pass key is NNNNN. Remember it. ...
  What is the pass key? The pass key is NNNNN.") at random depths and distances, and copy segments
  that repeat a span (random tokens, loss-masked on first sight, or real text) after a gap of real
  text, so induction/retrieval heads have a reason to form.
- Context curriculum {phases_text(training["curriculum"])}; {training["batch_tokens"]} tokens per step.

## Training
`{command}` (OpenBLAS preloaded),
seed {training["seed"]}, AdamW (beta2 0.95, weight decay 0.1), peak LR {training["lr"]}, {training["warmup"]} warm-up steps,
cosine decay to 10 % over the wall-clock budget, float32, saved as float16.
- steps: {training["steps_done"]} ({training["tokens_seen"] / 1e6:.2f} M tokens), stopped by {training["stopped_by"]}
- wall time: {training["train_minutes"]:.1f} min training, {training["total_minutes"]:.1f} min total (tokenizer, corpus, timing included)
- machine: {training["machine"]}, MLX {training["mlx"]} (CPU), shared with other jobs
- training loss: {first["loss"]:.2f} (step {first["step"]}) -> {last["loss"]:.2f} (step {last["step"]}, mixed data)

{history}
The run is time-boxed, so the step count depends on the machine's load; the data order and
initialization come from the seed, and `--steps N` gives a step-based schedule of the same shape.

## Evaluation (float32, fp16-equivalent cache; `python -m benchmarks.training.model_card`)
| metric | value |
|---|---|
| held-out NLL, {ev["held_out_windows"]} windows x 1024 tokens ({ev["held_out_tokens"]} tokens) | **{ev["held_out_nll"]:.3f} nats/token** (PPL {math.exp(ev["held_out_nll"]):.1f}) |
| unigram baseline on the same tokens (train-split frequencies) | {ev["unigram_nll"]:.3f} nats/token (PPL {math.exp(ev["unigram_nll"]):.1f}) |
| held-out NLL at positions 512-1023 | {ev["held_out_nll_positions_512_1023"]:.3f} |
| NLL of tokens after position 512 that already occurred before it / that did not | {late["nll_repeated"]:.3f} / {late["nll_new"]:.3f} ({late["repeated_fraction"]:.0%} repeated) |

Pass-key retrieval with the fp16 cache, 1024-token prompts of held-out text, {pk["trials"]} trials
(exact match of the key's tokens, greedy):

| {depth_head} | overall |
|{"---|" * (len(pk["by_depth"]) + 1)}
| {depth_cells} | **{pk["accuracy"]:.0%}** |

{retrieval_note}

{copy_note}

## Realistic-keys variant
`benchmarks.model.with_outlier_keys` scales rotary pairs (i, i + D/2) of every k_proj by 20 and the
matching q_proj rows by 1/20 (RoPE commutes with scaling both members of a pair): max |logit
difference| {variant["max_abs_logit_diff"]:.2e} in float32, key channel RMS max/median
{variant["key_max_over_median"][0]:.1f} -> {variant["key_max_over_median"][1]:.1f}.

Measured {prov["date"]} on {prov["machine"]}, MLX {prov["mlx"]} ({prov["device"]}).
"""
