"""Train the retrieval model: code text, pass-key prompts, key=value recall and copy blocks.

`python -m benchmarks.training.train_retrieval` (OpenBLAS preloaded) trains a fixed number of steps from a
fixed seed (reproducible, no deadline) in float32 and writes fp16 weights, config, the shipped
tiny-llama tokenizer and `training.json` to veloxd/assets/tiny-llama-retrieval. Model, optimizer,
step and LR schedule are train_tiny's; the loss adds attention supervision (attention_guide,
`--guide`), without which no induction head formed in the runs this machine affords. The shipped
model is six stages (`make train-retrieval`): the defaults (200 steps at 256 tokens, where the
circuit forms), `--init` of that with a curriculum to real 4096-token sequences (RoPE does not
extrapolate past what it saw), more pass-key prompts at 1k and 4k, `--induction longest` (the
induction head taught the occurrence with the longest matching context), `--hard-keys` (periodic
and repeated-digit keys) and `--lookback 3` (a third layer-0 head, so the induction head can
match trigrams; docs/results.md says why).
"""

from __future__ import annotations

import argparse
import functools
import json
import shutil
import sys
import time
from pathlib import Path

import mlx.core as mx
import numpy as np
from tokenizers import Tokenizer

from benchmarks.data import PassKey, documents, tokenize
from benchmarks.model import ASSET
from benchmarks.training.attention_guide import INDUCTION_MATCHES, guide_targets, guided_heads, guided_loss
from benchmarks.training.retrieval_data import Mix, RetrievalStream
from benchmarks.training.retrieval_probe import Probe
from benchmarks.training.train_tiny import Trainer, finish, learning_rate, log_step, model_config, phase_at

OUT = ASSET.parent / "tiny-llama-retrieval"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
CHECKPOINT = Path(".cache/train_retrieval_checkpoint")
# (fraction of the steps at which the phase starts, context length, copy-only warm-up): short
# sequences, many retrieval examples per step while the lookup circuit forms (stage 1).
CURRICULUM = [(0.0, 256, False)]


def parse_curriculum(text: str) -> list[tuple[float, int, bool]]:
    """ "0:32c,0.2:256,0.4:1024" -> [(0.0, 32, True), (0.2, 256, False), (0.4, 1024, False)]: a `c`
    phase trains on repeated random blocks only (retrieval_data.copy_sequence), an induction warm-up."""
    phases = []
    for part in text.split(","):
        start, length = part.split(":")
        phases.append((float(start), int(length.rstrip("c")), length.endswith("c")))
    return phases


def guide_weight(text: str) -> float:
    """--guide's value: a weight of the attention loss, so 0 or more."""
    weight = float(text)
    if not weight >= 0:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r} is not a weight of 0 or more")
    return weight


def fraction(text: str) -> float:
    """A fraction's value: 0 to 1."""
    value = float(text)
    if not 0 <= value <= 1:  # also refuses nan
        raise argparse.ArgumentTypeError(f"{text!r} is not a fraction from 0 to 1")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--steps", type=int, default=200, help="fixed step count")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--intermediate", type=int, default=640)
    p.add_argument(
        "--rope-theta",
        type=float,
        default=500000.0,
        help="RoPE base: long-context bases keep more dimensions slow enough to match content 4k tokens apart",
    )
    p.add_argument("--batch-tokens", type=int, default=4096)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--passkey", type=float, default=Mix.passkey, help="fraction of pass-key sequences")
    p.add_argument("--recall", type=float, default=Mix.recall, help="fraction of key=value recall sequences")
    p.add_argument("--max-recalls", type=int, default=Mix.max_recalls, help="recall pairs per sequence, at most")
    p.add_argument("--copy", type=float, default=Mix.copy, help="fraction of repeated random-span sequences")
    p.add_argument(
        "--hard-keys",
        type=fraction,
        default=Mix.hard_keys,
        help="fraction of keys and values that are periodic or repeated-digit (retrieval_data.KEY_SHAPES)",
    )
    p.add_argument(
        "--guide",
        type=guide_weight,
        default=1.0,
        help="weight of the attention-supervision loss (benchmarks/training/attention_guide.py; 0 = LM loss only)",
    )
    p.add_argument(
        "--induction",
        choices=INDUCTION_MATCHES,
        default="bigram",
        help="which earlier occurrence the induction head is taught to read: the latest same bigram, "
        "or the longest matching context",
    )
    p.add_argument(
        "--lookback",
        type=int,
        default=2,
        help="layer-0 heads taught to attend 1 .. N tokens back: the induction head matches N tokens of context",
    )
    p.add_argument("--probe-every", type=int, default=50, help="steps between pass-key probes (0 = none)")
    p.add_argument("--curriculum", type=parse_curriculum, default=CURRICULUM, help="start:length,... (step fractions)")
    p.add_argument(
        "--stop-at", type=int, default=0, help="end after this step of the --steps schedule (0 = run it all)"
    )
    p.add_argument("--init", type=Path, default=None, help="fine-tune these weights (e.g. the shipped tiny-llama)")
    p.add_argument("--checkpoint-every", type=int, default=40, help="steps between checkpoints")
    p.add_argument("--resume", action="store_true", help=f"continue from {CHECKPOINT}")
    p.add_argument("--measure", type=int, default=0, help="time this many steps per phase and exit")
    args = p.parse_args(argv)
    if not 1 <= args.lookback <= args.heads:  # before the corpus is read: one layer-0 head per token back
        p.error(f"--lookback {args.lookback}: expected 1 to {args.heads} (--heads: one layer-0 head each)")
    return args


def config_for(args: argparse.Namespace) -> dict:
    """train_tiny's llama config (the vocab is the shared tokenizer's); --init takes that model's."""
    if args.init is not None:
        return json.loads((args.init / "config.json").read_text())
    return model_config(argparse.Namespace(**{**vars(args), "vocab": 2048}))


def write_model(trainer: Trainer, config: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    trainer.save_fp16(out)
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in TOKENIZER_FILES:
        shutil.copyfile(ASSET / name, out / name)


def make_trainer(args: argparse.Namespace, config: dict) -> Trainer:
    if not args.guide:
        return Trainer(args, config)
    if config["num_hidden_layers"] < 2 or config["num_attention_heads"] < 2:
        raise SystemExit("--guide needs at least 2 layers and 2 attention heads (attention_guide.guided_heads)")
    heads = guided_heads(args.lookback)
    return Trainer(args, config, functools.partial(guided_loss, guide_weight=args.guide, heads=heads))


def train_step(trainer: Trainer, tokens: np.ndarray, weights: np.ndarray, lr: float, args: argparse.Namespace) -> float:
    """One step on a (batch, length + 1) token batch, with the guide's head targets when guided."""
    extra = guide_targets(tokens[:, :-1], args.induction, guided_heads(args.lookback)) if args.guide else ()
    return trainer.run_step(tokens, weights, lr, *extra)


def measure(trainer: Trainer, stream: RetrievalStream, args: argparse.Namespace) -> None:
    """Seconds per step and tokens per second at every curriculum length (after one warm-up step)."""
    for _, length, _ in args.curriculum:
        tokens, weights = stream.batch(max(1, args.batch_tokens // length), length)
        train_step(trainer, tokens, weights, 0.0, args)
        start = time.perf_counter()
        for _ in range(args.measure):
            train_step(trainer, tokens, weights, 0.0, args)
        seconds = (time.perf_counter() - start) / args.measure
        print(
            json.dumps(
                {
                    "event": "step_timed",
                    "context": length,
                    "s_per_step": round(seconds, 3),
                    "tokens_per_s": round(tokens.shape[0] * length / seconds),
                }
            ),
            flush=True,
        )


def probe_step(probes: dict[int, Probe], step: int, length: int, trainer: Trainer) -> dict:
    """Whole-key accuracy on held-out prompts at the current context length, logged as an event."""
    record = {"step": step, "probe_context": length, "whole_key": probes[length].accuracy(trainer.model)}
    print(json.dumps({"event": "retrieval_probed", **record}), flush=True)
    return record


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    tokenizer = Tokenizer.from_file(str(ASSET / "tokenizer.json"))
    corpus = tokenize(tokenizer, documents()["train"])
    config = config_for(args)
    mix = Mix(args.passkey, args.recall, args.max_recalls, args.copy, args.hard_keys)
    trainer = make_trainer(args, config)
    if args.init is not None:
        trainer.model.load_weights(str(args.init / "model.safetensors"))
        trainer.model.set_dtype(mx.float32)  # the shipped weights are fp16; train in float32
    stream = RetrievalStream(corpus, PassKey(tokenizer), seed=args.seed, mix=mix)
    if args.measure:
        measure(trainer, stream, args)
        return 0
    step, history = 0, []
    if args.resume and (CHECKPOINT / "step.json").exists():
        step = trainer.load_checkpoint(CHECKPOINT)
        history = json.loads((CHECKPOINT / "history.json").read_text())
        # Replay the data stream to where the checkpoint left it, so a resumed run sees the same data.
        for replay in range(step):
            _, length, copy_only = phase_at(args.curriculum, replay / args.steps)
            stream.batch(max(1, args.batch_tokens // length), length, copy_only)
    held_out = tokenize(tokenizer, documents()["held_out"])
    probes = {n: Probe(PassKey(tokenizer), held_out, n) for _, n, copy in args.curriculum if not copy}
    window: list[float] = []
    attention_window: list[float] = []
    train_start = time.time()
    last = args.stop_at or args.steps
    while step < last:
        progress = step / args.steps
        _, length, copy_only = phase_at(args.curriculum, progress)
        tokens, weights = stream.batch(max(1, args.batch_tokens // length), length, copy_only)
        lr = learning_rate(step, progress, args)
        window.append(train_step(trainer, tokens, weights, lr, args))
        attention_window.append(trainer.last_auxiliary)
        step += 1
        if step % 20 == 0 or step == last:
            means = {"attention_loss": attention_window} if args.guide else {}
            history.append(log_step(step, length, window, lr, train_start, **means))
            window, attention_window = [], []
        if args.probe_every and (step % args.probe_every == 0 or step == last) and length in probes:
            history.append(probe_step(probes, step, length, trainer))
        if step % args.checkpoint_every == 0 and step < last:
            trainer.save_checkpoint(CHECKPOINT, step)
            (CHECKPOINT / "history.json").write_text(json.dumps(history))
            write_model(trainer, config, args.out)  # a usable model from the first checkpoint on
    write_model(trainer, config, args.out)
    summary = {
        "command": "python -m benchmarks.training.train_retrieval "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "curriculum"},
        "seed": args.seed,
        "steps": args.steps,
        "batch_tokens": args.batch_tokens,
        "tokens_seen": args.steps * args.batch_tokens,
        "stopped_at": step,
        "curriculum": [(start, f"{length}c" if copy else length) for start, length, copy in args.curriculum],
        "data_mix": mix.to_dict(),
        "init": str(args.init) if args.init else "scratch",
        # a fine-tune carries the record of what it started from
        "init_training": json.loads((args.init / "training.json").read_text()) if args.init else None,
        "train_tokens_in_corpus": corpus.total,
        "final_loss": next((r["loss"] for r in reversed(history) if "loss" in r), None),
        "final_probe": next((r for r in reversed(history) if "whole_key" in r), None),
        "resumed": bool(args.resume),
    }
    return finish(args.out, summary, history, step, (train_start, started))


if __name__ == "__main__":
    raise SystemExit(main())
