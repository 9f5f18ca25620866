"""Train the shipped tiny llama model (GQA, head_dim 128) on stdlib sources + long-range segments.

`python -m benchmarks.training.train_tiny --minutes 55 --out veloxd/assets/tiny-llama` (OpenBLAS preloaded)
trains in float32 with a 256 -> 512 -> 1024 context curriculum, checkpoints periodically, stops at
the deadline and writes fp16 weights, tokenizer, config and `training.json` (steps, losses, time).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.utils import tree_flatten, tree_unflatten
from mlx_lm.models import llama

from benchmarks.data import PassKey, TokenizedCorpus, TrainingStream, documents, tokenize
from benchmarks.provenance import mlx_version
from testkit.tinymodel import write_tokenizer

if TYPE_CHECKING:
    from tokenizers import Tokenizer

# (fraction of the run at which the phase starts, context length, induction-warm-up data);
# batch tokens stay constant.
CURRICULUM = [(0.0, 256, False), (0.35, 512, False), (0.65, 1024, False)]


def curriculum(induction_warmup: float) -> list[tuple[float, int, bool]]:
    """CURRICULUM, optionally preceded by a short-context phase of mostly span-copy data."""
    if induction_warmup <= 0:
        return CURRICULUM
    rest = 1.0 - induction_warmup
    return [(0.0, 128, True)] + [(induction_warmup + start * rest, length, flag) for start, length, flag in CURRICULUM]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", type=Path, default=Path("veloxd/assets/tiny-llama"))
    p.add_argument("--minutes", type=float, default=55.0, help="wall-clock budget (hard stop)")
    p.add_argument("--steps", type=int, default=0, help="fixed step count (reproducible); 0 = fit the budget")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--kv-heads", type=int, default=2)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--intermediate", type=int, default=640)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--batch-tokens", type=int, default=2048)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--checkpoint-minutes", type=float, default=5.0)
    p.add_argument(
        "--induction-warmup",
        type=float,
        default=0.0,
        help="fraction of the run spent first on 128-token span-copy data (0 = none)",
    )
    p.add_argument("--resume", action="store_true", help="continue from .cache/train_tiny_checkpoint")
    p.add_argument("--measure", action="store_true", help="time a few steps per phase and exit")
    return p.parse_args(argv)


def train_tokenizer(out: Path, docs: list[tuple[str, str]], vocab_size: int) -> Tokenizer:
    """Byte-level BPE on the training split, with veloxd's special tokens and chat template."""
    return write_tokenizer(out, vocab_size, (text for _, text in docs))


def model_config(args: argparse.Namespace) -> dict:
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": args.hidden,
        "num_hidden_layers": args.layers,
        "intermediate_size": args.intermediate,
        "num_attention_heads": args.heads,
        "num_key_value_heads": args.kv_heads,
        "head_dim": args.head_dim,
        "rms_norm_eps": 1e-5,
        "vocab_size": args.vocab,
        "max_position_embeddings": 8192,
        "rope_theta": args.rope_theta,
        "tie_word_embeddings": True,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "torch_dtype": "float16",
    }


def phase_at(phases: list[tuple[float, int, bool]], progress: float) -> tuple[float, int, bool]:
    return [phase for phase in phases if progress >= phase[0]][-1]


def learning_rate(step: int, progress: float, args: argparse.Namespace) -> float:
    """Linear warm-up over the first steps, then cosine decay to 10 % over run progress (0..1)."""
    warm = min(1.0, (step + 1) / args.warmup)
    return warm * args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


def loss_fn(model: nn.Module, inputs: mx.array, targets: mx.array, mask: mx.array) -> tuple[mx.array, mx.array]:
    """(masked mean cross-entropy, no auxiliary term): the Trainer's default loss."""
    logits = model(inputs)  # (batch, length, vocab)
    ce = nn.losses.cross_entropy(logits, targets, reduction="none")  # (batch, length)
    loss = (ce * mask).sum() / mask.sum()
    return loss, mx.array(0.0)


class Trainer:
    """Owns the model, optimizer and compiled step; one instance per run.

    `loss(model, inputs, targets, mask, *extra)` returns (total, auxiliary term); the total is
    minimized, the auxiliary term is reported (attention_guide's loss uses it).
    """

    def __init__(
        self, args: argparse.Namespace, config: dict, loss: Callable[..., tuple[mx.array, mx.array]] = loss_fn
    ):
        mx.random.seed(args.seed)
        self.model = llama.Model(llama.ModelArgs.from_dict(config))
        self.optimizer = optim.AdamW(learning_rate=args.lr, betas=[0.9, 0.95], weight_decay=0.1)
        state = [self.model.state, self.optimizer.state]
        grad_fn = nn.value_and_grad(self.model, loss)

        def step(inputs, targets, mask, extra):
            (total, auxiliary), grads = grad_fn(self.model, inputs, targets, mask, *extra)
            grads, _ = optim.clip_grad_norm(grads, 1.0)
            self.optimizer.update(self.model, grads)
            return total, auxiliary

        self.step = mx.compile(step, inputs=state, outputs=state)
        self.state = state
        self.last_auxiliary = 0.0

    def run_step(self, tokens: np.ndarray, mask: np.ndarray, lr: float, *extra: np.ndarray) -> float:
        """One optimizer step; returns the total loss (the auxiliary term is kept in last_auxiliary)."""
        self.optimizer.learning_rate = mx.array(lr)
        batch = mx.array(tokens)  # (batch, length + 1)
        total, auxiliary = self.step(batch[:, :-1], batch[:, 1:], mx.array(mask), tuple(mx.array(e) for e in extra))
        mx.eval(total, auxiliary, self.state)
        self.last_auxiliary = float(auxiliary)
        return float(total)

    def save_checkpoint(self, path: Path, step: int) -> None:
        path.mkdir(parents=True, exist_ok=True)
        mx.save_safetensors(str(path / "weights.safetensors"), dict(tree_flatten(self.model.parameters())))
        mx.save_safetensors(str(path / "optimizer.safetensors"), dict(tree_flatten(self.optimizer.state)))
        (path / "step.json").write_text(json.dumps({"step": step}))

    def load_checkpoint(self, path: Path) -> int:
        self.model.load_weights(str(path / "weights.safetensors"))
        state = mx.load(str(path / "optimizer.safetensors"))
        assert isinstance(state, dict)  # a .safetensors file loads as {name: array}
        self.optimizer.state = tree_unflatten(list(state.items()))
        return json.loads((path / "step.json").read_text())["step"]

    def save_fp16(self, out: Path) -> None:
        parameters = tree_flatten(self.model.parameters())
        assert isinstance(parameters, list)  # without a destination, tree_flatten returns [(path, leaf), ...]
        weights = {k: v.astype(mx.float16) for k, v in parameters}
        mx.save_safetensors(str(out / "model.safetensors"), weights, metadata={"format": "mlx"})


def log_step(step: int, length: int, losses: list[float], lr: float, train_start: float, **means: list[float]) -> dict:
    """One history record (mean loss, and of each `means` series, since the last one), also printed as a JSON event."""
    record = {
        "step": step,
        "context": length,
        "loss": round(float(np.mean(losses)), 4),
        **{name: round(float(np.mean(values)), 4) for name, values in means.items()},
        "lr": round(lr, 6),
        "elapsed_min": round((time.time() - train_start) / 60, 2),
    }
    print(json.dumps({"event": "step_logged", **record}), flush=True)
    return record


def seconds_per_token(
    trainer: Trainer, stream: TrainingStream, batch_tokens: int, phases: list[tuple[float, int, bool]]
) -> dict[int, float]:
    """Time two steps per context length (after one warm-up step) on a throwaway trainer."""
    timing = {}
    for _, length, _ in phases:
        tokens, mask = stream.batch(max(1, batch_tokens // length), length)
        trainer.run_step(tokens, mask, 0.0)
        start = time.perf_counter()
        for _ in range(2):
            trainer.run_step(tokens, mask, 0.0)
        timing[length] = (time.perf_counter() - start) / 2 / batch_tokens
    return timing


def planned_steps(
    timing: dict[int, float], seconds: float, batch_tokens: int, phases: list[tuple[float, int, bool]]
) -> int:
    """Steps that fit `seconds` under the curriculum, given measured seconds per token."""
    bounds = [start for start, _, _ in phases] + [1.0]
    per_step = sum(
        (bounds[i + 1] - bounds[i]) * timing[length] * batch_tokens for i, (_, length, _) in enumerate(phases)
    )
    return max(1, int(seconds / per_step))


def finish(out: Path, summary: dict, history: list[dict], step: int, since: tuple[float, float]) -> int:
    """Write out/training.json: the run's own `summary`, then what every run records (minutes of
    training and in all since `since`, machine, BLAS preload, MLX version, loss history); announce the end."""
    train_start, started = since
    record = {
        **summary,
        "train_minutes": round((time.time() - train_start) / 60, 2),
        "total_minutes": round((time.time() - started) / 60, 2),
        "machine": f"{platform.machine()} {platform.system()}, {os.cpu_count()} cores (shared)",
        "blas_preload": os.environ.get("LD_PRELOAD", ""),
        "mlx": mlx_version(),
        "history": history,
    }
    (out / "training.json").write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps({"event": "training_finished", "steps": step, "minutes": record["total_minutes"]}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.time()
    deadline = started + args.minutes * 60
    split = documents()
    tokenizer = train_tokenizer(args.out, split["train"], args.vocab)
    corpus: TokenizedCorpus = tokenize(tokenizer, split["train"])
    print(
        json.dumps(
            {
                "event": "corpus_tokenized",
                "train_tokens": corpus.total,
                "docs": len(corpus.docs),
                "seconds": round(time.time() - started, 1),
            }
        ),
        flush=True,
    )
    config = model_config(args)
    passkey = PassKey(tokenizer)

    timing_stream = TrainingStream(corpus, passkey, args.vocab, seed=args.seed + 1000)
    phases = curriculum(args.induction_warmup)
    timing = seconds_per_token(Trainer(args, config), timing_stream, args.batch_tokens, phases)
    print(
        json.dumps({"event": "step_timed", "ms_per_1k_tokens": {k: round(v * 1e6, 1) for k, v in timing.items()}}),
        flush=True,
    )
    if args.measure:
        return 0
    # 8 % margin: the cores are shared and the final save/eval needs time.
    total = args.steps or planned_steps(timing, (deadline - time.time()) * 0.92, args.batch_tokens, phases)
    print(json.dumps({"event": "training_planned", "steps": total}), flush=True)

    trainer = Trainer(args, config)
    stream = TrainingStream(corpus, passkey, args.vocab, seed=args.seed)
    checkpoint_dir = Path(".cache/train_tiny_checkpoint")
    history: list[dict] = []
    last_checkpoint = time.time()
    step = 0
    if args.resume and (checkpoint_dir / "step.json").exists():
        step = trainer.load_checkpoint(checkpoint_dir)  # data order after a resume differs from a clean run
    window: list[float] = []
    train_start = time.time()
    budget = (deadline - train_start) * 0.92
    while step < total and time.time() < deadline:
        # Without --steps the schedule follows wall-clock time, so shared cores that slow down
        # mid-run shorten the run instead of cutting off the long-context phase and the LR decay.
        progress = step / total if args.steps else max(step / total, (time.time() - train_start) / budget)
        if progress >= 1.0:
            break
        _, length, induction = phase_at(phases, progress)
        tokens, mask = stream.batch(max(1, args.batch_tokens // length), length, induction)
        lr = learning_rate(step, progress, args)
        window.append(trainer.run_step(tokens, mask, lr))
        step += 1
        if step % 20 == 0 or step == total:
            history.append(log_step(step, length, window, lr, train_start))
            window = []
        if time.time() - last_checkpoint > args.checkpoint_minutes * 60:
            trainer.save_checkpoint(checkpoint_dir, step)
            # A usable fp16 model exists from the first checkpoint on, so benchmarks can start early.
            trainer.save_fp16(args.out)
            (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
            last_checkpoint = time.time()

    trainer.save_fp16(args.out)
    (args.out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    summary = {
        "seed": args.seed,
        "steps_planned": total,
        "steps_done": step,
        "stopped_by": "steps" if step >= total else "deadline",
        "batch_tokens": args.batch_tokens,
        "tokens_seen": step * args.batch_tokens,
        "curriculum": phases,
        "induction_warmup": args.induction_warmup,
        "train_tokens_in_corpus": corpus.total,
        "lr": args.lr,
        "warmup": args.warmup,
    }
    return finish(args.out, summary, history, step, (train_start, started))


if __name__ == "__main__":
    raise SystemExit(main())
