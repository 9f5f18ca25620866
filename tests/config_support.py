"""Helpers for the config tests: write real config files (mode 0644) next to a model directory."""

from __future__ import annotations

import textwrap
from pathlib import Path

from veloxd.config import inspect_config

VALID = """\
version: 1
servers:
  coder:
    model: ./model
    port: 8081
    method: kivi
    bits: 2
    overrides:
      kivi_group_size: 64
      kivi_residual_length: 128
  chat:
    model: mlx-community/Qwen2.5-0.5B-Instruct-4bit
    port: 8082
    method: h2o
"""


def model_dir(directory: Path, name: str = "model") -> Path:
    """A directory shaped like an MLX model as far as `check` looks (it never loads weights)."""
    path = directory / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"model_type": "llama"}\n')
    return path


def write_config(directory: Path, text: str, name: str = "veloxd.yaml", *, dedent: bool = True) -> Path:
    model_dir(directory)
    path = directory / name
    path.write_text(textwrap.dedent(text) if dedent else text, encoding="utf-8")
    path.chmod(0o644)
    return path


def issues(path: Path) -> list[tuple[int, int, str, str]]:
    """(line, column, json path, message) of every issue, in report order."""
    result = inspect_config(path)
    assert result.config is None, "expected the config to be invalid"
    return [(i.line, i.column, i.path, i.message) for i in result.issues]


def only_issue(path: Path) -> tuple[int, int, str, str]:
    found = issues(path)
    assert len(found) == 1, found
    return found[0]


def entry(body: str, name: str = "coder") -> str:
    """A config with one server whose entry lines are `body` (indented by the caller's dedent)."""
    lines = textwrap.dedent(body).strip("\n").splitlines()
    return "version: 1\nservers:\n" + f"  {name}:\n" + "".join(f"    {line}\n" for line in lines)


# Field-level mistakes: the checked-in schema alone (any editor) must flag exactly these places.
# (case id, file text, expected issues as (line, column, json path, message))
FIELD_CASES = [
    (
        "unknown-key",
        entry("model: ./model\nprot: 8081\nmethod: kivi"),
        [
            (
                3,
                3,
                "$.servers.coder.port",
                "server 'coder' is missing required key 'port' (or add a gateway: block: servers behind it get a port assigned)",
            ),
            (5, 5, "$.servers.coder.prot", "unknown key 'prot' in server 'coder'; did you mean 'port'?"),
        ],
    ),
    (
        "misspelled-method",
        entry("model: ./model\nport: 8081\nmethod: kivy"),
        [
            (
                6,
                13,
                "$.servers.coder.method",
                "unknown method 'kivy'; did you mean 'kivi'? (valid: fp16, affine, kivi, "
                "turboquant_mse, turboquant_prod, qjl, streaming_llm, knorm, snapkv, tova, h2o, "
                "streaming_llm_affine, knorm_affine, snapkv_affine, tova_affine, h2o_affine)",
            ),
        ],
    ),
    (
        "field-of-another-method",
        entry("model: ./model\nport: 8081\nmethod: h2o\noverrides:\n  kivi_group_size: 32"),
        [
            (8, 7, "$.servers.coder.overrides.kivi_group_size", "kivi_group_size applies to method kivi, not h2o"),
        ],
    ),
    (
        "misspelled-override",
        entry("model: ./model\nport: 8081\nmethod: kivi\noverrides: {kivi_grup_size: 32}"),
        [
            (
                7,
                17,
                "$.servers.coder.overrides.kivi_grup_size",
                "unknown override 'kivi_grup_size' for method kivi; did you mean 'kivi_group_size'?",
            ),
        ],
    ),
    (
        "bits-without-bit-width",
        entry("model: ./model\nport: 8081\nmethod: h2o\nbits: 4"),
        [
            (
                7,
                11,
                "$.servers.coder.bits",
                "bits does not apply to method h2o (only to: affine, kivi, turboquant_mse, turboquant_prod, qjl, "
                "and the hybrids streaming_llm_affine, knorm_affine, snapkv_affine, tova_affine, h2o_affine); "
                "to keep h2o's tokens as 4-bit codes use method h2o_affine",
            ),
        ],
    ),
    (
        "bits-not-offered",
        entry("model: ./model\nport: 8081\nmethod: kivi\nbits: 3"),
        [
            (7, 11, "$.servers.coder.bits", "bits=3 is not valid for method kivi; choose one of [2, 4]"),
        ],
    ),
    (
        "seed-not-used",
        entry("model: ./model\nport: 8081\nmethod: kivi\nseed: 3"),
        [
            (
                7,
                11,
                "$.servers.coder.seed",
                "seed does not apply to method kivi (only to: affine, turboquant_mse, turboquant_prod, qjl, "
                "and the hybrids streaming_llm_affine, knorm_affine, snapkv_affine, tova_affine, h2o_affine)",
            ),
        ],
    ),
    (
        "out-of-range",
        entry("model: ./model\nport: 70000\nmethod: kivi\noverrides:\n  kivi_residual_length: 9000"),
        [
            (5, 11, "$.servers.coder.port", "port=70000: must be <= 65535"),
            (
                8,
                29,
                "$.servers.coder.overrides.kivi_residual_length",
                "kivi_residual_length=9000 for method kivi: must be <= 8192",
            ),
        ],
    ),
    (
        "wrong-types",
        entry("model: ./model\nport: '8081'\nmethod: kivi\nsampling: {temp: hot}"),
        [
            (5, 11, "$.servers.coder.port", "port must be an integer, not the string '8081'"),
            (7, 22, "$.servers.coder.sampling.temp", "sampling.temp must be a number, not the string 'hot'"),
        ],
    ),
    (
        "choice",
        entry("model: ./model\nport: 8081\nmethod: kivi\noverrides: {kivi_group_size: 48}"),
        [
            (
                7,
                34,
                "$.servers.coder.overrides.kivi_group_size",
                "kivi_group_size=48 for method kivi: choose one of [32, 64, 128]",
            ),
        ],
    ),
    (
        "bad-server-name",
        entry("model: ./model\nport: 8081\nmethod: fp16", name="Coder"),
        [
            (
                3,
                3,
                "$.servers.Coder",
                "server name 'Coder' is not valid: use lowercase letters, digits, '-' and '_', "
                "starting with a letter or digit",
            ),
        ],
    ),
    (
        "env",
        entry("model: ./model\nport: 8081\nmethod: fp16\nenv:\n  DEBUG: 1\n  2FA: x"),
        [
            (8, 14, "$.servers.coder.env.DEBUG", 'env.DEBUG must be a string, not the number 1 (quote it: "1")'),
            (
                9,
                7,
                "$.servers.coder.env.2FA",
                "'2FA' is not an environment variable name (letters, digits and '_', not starting with a digit)",
            ),
        ],
    ),
    (
        "top-level-typo",
        "version: 1\nserver:\n  coder: {model: ./model, port: 8081, method: fp16}\n",
        [
            (1, 1, "$.servers", "missing required key 'servers'"),
            (
                2,
                1,
                "$.server",
                "unknown top-level key 'server'; did you mean 'servers'? (valid: version, servers, dashboard, gateway, x-*)",
            ),
        ],
    ),
    (
        "setting-outside-overrides",
        entry("model: ./model\nport: 8081\nmethod: kivi\nkivi_group_size: 64"),
        [
            (7, 5, "$.servers.coder.kivi_group_size", "kivi_group_size is a KV-cache setting: put it under overrides"),
        ],
    ),
    (
        "bits-inside-overrides",
        entry("model: ./model\nport: 8081\nmethod: kivi\noverrides: {bits: 2}"),
        [
            (7, 17, "$.servers.coder.overrides.bits", "bits is a key of the server entry, not an override"),
        ],
    ),
    (
        "size-and-token-names",
        entry("model: ./model\nport: 8081\nmethod: fp16\nprompt_cache: {bytes: lots}\napi_key_env: my-token"),
        [
            (
                7,
                27,
                "$.servers.coder.prompt_cache.bytes",
                "prompt_cache.bytes='lots' is not a size; use an integer "
                "number of bytes or a string like '512M' or '2G' (decimal) or '1.5GiB' (binary)",
            ),
            (
                8,
                18,
                "$.servers.coder.api_key_env",
                "api_key_env='my-token' is not an environment variable name (letters, digits and '_')",
            ),
        ],
    ),
    (
        "section-typo",
        entry("model: ./model\nport: 8081\nmethod: fp16\nsampling: {temperature: 0.2}"),
        [
            (
                7,
                16,
                "$.servers.coder.sampling.temperature",
                "unknown key 'temperature' in sampling (valid: temp, top_p, max_tokens)",
            ),
        ],
    ),
    (
        "empty-entry",
        "version: 1\nservers:\n  coder:\n",
        [
            (3, 9, "$.servers.coder", "server 'coder' must be a mapping, not empty (null)"),
        ],
    ),
    (
        "servers-list",
        "version: 1\nservers:\n  - coder\n",
        [
            (2, 1, "$.servers", "servers must be a mapping, not a list"),
        ],
    ),
]
