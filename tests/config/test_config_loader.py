"""The loader: schema and semantic mistakes at their exact line and column, and what a valid file becomes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.config_support import FIELD_CASES, VALID, entry, issues, model_dir, only_issue, write_config
from veloxd import protocol
from veloxd.config import ConfigError, ServerEntry, inspect_config, load_config
from veloxd.kv.config import KVCacheConfig


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in FIELD_CASES], ids=[c[0] for c in FIELD_CASES])
def test_field_level_mistakes(tmp_path: Path, text: str, expected: list) -> None:
    assert issues(write_config(tmp_path, text, dedent=False)) == expected


WORLD_CASES = [
    (
        "missing-local-model",
        entry("model: ./nope\nport: 8081\nmethod: fp16"),
        [(4, 12, "$.servers.coder.model", "model path {d}/nope does not exist (yet)")],
    ),
    (
        "model-is-a-file",
        entry("model: veloxd.yaml\nport: 8081\nmethod: fp16"),
        [(4, 12, "$.servers.coder.model", "model path {d}/veloxd.yaml is a file; expected an MLX model directory")],
    ),
    (
        "model-dir-without-config",
        entry("model: empty\nport: 8081\nmethod: fp16"),
        [
            (
                4,
                12,
                "$.servers.coder.model",
                "model directory {d}/empty has no config.json (not an MLX model directory, or still being copied)",
            )
        ],
    ),
    (
        "missing-adapter",
        entry("model: ./model\nport: 8081\nmethod: fp16\nadapter_path: adapters"),
        [(7, 19, "$.servers.coder.adapter_path", "adapter path {d}/adapters does not exist (yet)")],
    ),
    (
        "unset-api-key-env",
        entry("model: ./model\nport: 8081\nmethod: fp16\napi_key_env: VELOXD_TEST_UNSET_VAR"),
        [
            (
                7,
                18,
                "$.servers.coder.api_key_env",
                "api_key_env VELOXD_TEST_UNSET_VAR is not set (or empty) in the "
                "environment or the entry's env (the server would refuse every client)",
            )
        ],
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in WORLD_CASES], ids=[c[0] for c in WORLD_CASES])
def test_conditions_of_the_world_are_located_warnings_not_errors(tmp_path: Path, text: str, expected: list) -> None:
    """The file is valid (every entry is built); what the world lacks right now is a warning."""
    (tmp_path / "empty").mkdir()
    result = inspect_config(write_config(tmp_path, text, dedent=False))
    assert result.config is not None and not result.issues and list(result.config.servers) == ["coder"]
    found = [(w.line, w.column, w.path, w.message) for w in result.warnings]
    assert found == [(line, col, path, message.format(d=tmp_path)) for line, col, path, message in expected]


SEMANTIC_CASES = [
    (
        "neither-path-nor-hf-id",
        entry("model: just-a-name\nport: 8081\nmethod: fp16"),
        [
            (
                4,
                12,
                "$.servers.coder.model",
                "model 'just-a-name' is neither an existing directory ({d}/just-a-name) "
                "nor a Hugging Face id like 'mlx-community/Qwen2.5-7B-Instruct-4bit'",
            )
        ],
    ),
    (
        "exposed-without-token",
        entry("model: ./model\nport: 8081\nhost: 0.0.0.0\nmethod: fp16"),
        [
            (
                6,
                11,
                "$.servers.coder.host",
                "host 0.0.0.0 exposes the server beyond this machine: set api_key_env "
                "(clients then need a bearer token) or, deliberately, allow_unauthenticated: true",
            )
        ],
    ),
    (
        "not-a-host-name",
        entry("model: ./model\nport: 8081\nhost: -mac.local\nmethod: fp16"),
        [(6, 11, "$.servers.coder.host", "host='-mac.local' is not a host name or IP address")],
    ),
    (
        "cross-field-rule",
        entry("model: ./model\nport: 8081\nmethod: kivi\noverrides:\n  kivi_residual_length: 100"),
        [
            (
                8,
                29,
                "$.servers.coder.overrides.kivi_residual_length",
                "kivi_residual_length=100 for method kivi: must be a multiple of kivi_group_size=32",
            )
        ],
    ),
    (
        "cross-field-rule-on-defaults",
        entry("model: ./model\nport: 8081\nmethod: snapkv\noverrides:\n  snapkv_budget: 16"),
        [(7, 5, "$.servers.coder.overrides", "snapkv_window=32 for method snapkv: must not exceed snapkv_budget=16")],
    ),
    (
        "default-above-cap",
        entry("model: ./model\nport: 8081\nmethod: fp16\nsampling: {max_tokens: 1024}\nlimits: {max_tokens: 256}"),
        [
            (
                7,
                28,
                "$.servers.coder.sampling.max_tokens",
                "sampling.max_tokens (1024) exceeds limits.max_tokens (256): no request could get it",
            )
        ],
    ),
    (
        "body-size-not-a-size",
        entry("model: ./model\nport: 8081\nmethod: fp16\nlimits: {max_body_bytes: lots}"),
        [
            (
                7,
                30,
                "$.servers.coder.limits.max_body_bytes",
                "limits.max_body_bytes='lots' is not a size; use an "
                "integer number of bytes or a string like '512M' or '2G' (decimal) or '1.5GiB' (binary)",
            )
        ],
    ),
    (
        "backoff-order",
        entry("model: ./model\nport: 8081\nmethod: fp16\nrestart: {backoff_initial_s: 90}"),
        [
            (
                7,
                34,
                "$.servers.coder.restart.backoff_initial_s",
                "restart.backoff_max_s (60.0) must be at least backoff_initial_s (90)",
            )
        ],
    ),
]


@pytest.mark.parametrize(("text", "expected"), [c[1:] for c in SEMANTIC_CASES], ids=[c[0] for c in SEMANTIC_CASES])
def test_semantic_mistakes(tmp_path: Path, text: str, expected: list) -> None:
    (tmp_path / "empty").mkdir()
    found = issues(write_config(tmp_path, text, dedent=False))
    assert found == [(line, col, path, message.format(d=tmp_path)) for line, col, path, message in expected]


@pytest.mark.parametrize(
    ("first", "second", "clash"),
    [
        ("127.0.0.1", "127.0.0.1", "127.0.0.1:8081 is already used by server 'a'"),
        ("localhost", "127.0.0.1", "127.0.0.1:8081 is already used by server 'a' (localhost:8081)"),
        ("0.0.0.0", "127.0.0.1", "127.0.0.1:8081 is already used by server 'a' (0.0.0.0:8081)"),
        ("127.0.0.1", "127.0.0.2", None),
        ("::1", "127.0.0.1", None),
    ],
)
def test_host_port_pairs_are_unique(tmp_path: Path, first: str, second: str, clash: str | None) -> None:
    text = f"""\
        version: 1
        servers:
          a: {{model: ./model, port: 8081, host: "{first}", method: fp16, allow_unauthenticated: true}}
          b: {{model: ./model, port: 8081, host: "{second}", method: fp16}}
        """
    path = write_config(tmp_path, text)
    if clash is None:
        assert [e.host for e in load_config(path).servers.values()] == [first, second]
    else:
        assert issues(path) == [(4, 29, "$.servers.b.port", clash)]


@pytest.mark.parametrize("extra", ["api_key_env: VELOXD_TOKEN", "allow_unauthenticated: true"])
def test_exposure_is_allowed_when_deliberate(tmp_path: Path, extra: str) -> None:
    text = entry(f"model: ./model\nport: 8081\nhost: 0.0.0.0\nmethod: fp16\n{extra}")
    assert load_config(write_config(tmp_path, text, dedent=False)).servers["coder"].host == "0.0.0.0"


def test_all_errors_at_once_sorted_by_line(tmp_path: Path) -> None:
    text = """\
        version: 1
        servers:
          b:
            model: ./missing
            port: 8081
            method: h2o
            overrides: {kivi_group_size: 32}
          a:
            model: ./model
            port: 8081
            method: kivy
        """
    found = issues(write_config(tmp_path, text))
    assert [(line, path) for line, _, path, _ in found] == [
        (7, "$.servers.b.overrides.kivi_group_size"),
        (10, "$.servers.a.port"),
        (11, "$.servers.a.method"),
    ]
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "veloxd.yaml")
    assert [i.line for i in caught.value.issues] == [7, 10, 11] and not caught.value.unreadable
    assert str(caught.value).splitlines()[1] == (
        f"{tmp_path}/veloxd.yaml:10:11: 127.0.0.1:8081 is already used by server 'b' (at $.servers.a.port)"
    )


def test_valid_file_defaults_and_resolution(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    model_dir(tmp_path / "home", "models/tiny")
    text = (
        VALID + "    prompt_cache: {bytes: 1.5GiB}\n  home:\n    model: ~/models/tiny\n    port: 8083\n"
        "    method: affine\n    overrides: {affine_rotate: true}\n    sampling: {temp: 1}\n"
    )
    config = load_config(write_config(tmp_path, text, dedent=False))
    coder, chat, home = config.servers.values()
    assert list(config.servers) == ["coder", "chat", "home"] and config.version == 1
    assert config.source == str(tmp_path / "veloxd.yaml")
    assert coder.model == str(tmp_path / "model") and home.model == str(tmp_path / "home/models/tiny")
    assert chat.model == "mlx-community/Qwen2.5-0.5B-Instruct-4bit"
    assert coder.kv == KVCacheConfig(method="kivi", bits=2, kivi_group_size=64, kivi_residual_length=128)
    assert chat.kv.bits is None and home.kv.bits == 4  # the method's default bit width
    assert chat.prompt_cache.bytes == 1_610_612_736 and chat.prompt_cache.size == 10
    assert home.sampling.temp == 1.0 and isinstance(home.sampling.temp, float)
    assert (coder.host, coder.sampling.max_tokens, coder.restart.max_failures, coder.ready_timeout_s) == (
        "127.0.0.1",
        512,
        5,
        600.0,
    )
    assert coder.env == {} and coder.adapter_path is None and coder.description == ""


def test_merge_keys_share_settings(tmp_path: Path) -> None:
    text = """\
        version: 1
        x-common: &common {model: ./model, method: kivi, sampling: {temp: 0.3}}
        servers:
          a: {<<: *common, port: 8081}
          b:
            <<: *common
            port: 8082
            method: fp16
        """
    a, b = load_config(write_config(tmp_path, text)).servers.values()
    assert (a.method, b.method, a.sampling.temp, b.sampling.temp) == ("kivi", "fp16", 0.3, 0.3)


def test_a_second_merge_key_in_one_mapping_is_a_duplicate_key(tmp_path: Path) -> None:
    """PyYAML lets the second `<<` silently win or lose; one `<<: [*a, *b]` says what is meant."""
    text = """\
        version: 1
        x-a: &a {model: ./model, method: kivi}
        x-b: &b {port: 8081}
        servers:
          a:
            <<: *a
            <<: *b
        """
    assert only_issue(write_config(tmp_path, text)) == (
        7,
        5,
        "$.servers.a",
        "duplicate key '<<' (first written at line 6): merge several mappings with one '<<: [*a, *b]'",
    )


def test_serve_argv_and_restart_keys(tmp_path: Path) -> None:
    text = entry(
        "model: ./model\nport: 8081\nmethod: affine\nbits: 8\nseed: 9\noverrides: {affine_rotate: false}\n"
        "sampling: {temp: 0.2}\nprompt_cache: {bytes: 2G}\napi_key_env: TOKEN\nadapter_path: model\n"
        "env: {A: b}\ndescription: demo"
    )
    coder: ServerEntry = load_config(write_config(tmp_path, text, dedent=False)).servers["coder"]
    model = str(tmp_path / "model")
    argv = coder.serve_argv()
    assert argv[0] == protocol.ENTRY_JSON_FLAG and len(argv) == 2
    assert json.loads(argv[1]) == {
        "version": 1,
        "model": model,
        "kv": coder.kv.to_dict(),
        "host": "127.0.0.1",
        "port": 8081,
        "adapter_path": model,
        "max_tokens": 512,
        "temp": 0.2,
        "top_p": 1.0,
        "prompt_cache_size": 10,
        "prompt_cache_bytes": 2_000_000_000,
        "limit_max_tokens": None,
        "limit_max_prompt_tokens": None,
        "request_body_timeout": 30.0,
        "max_body_bytes": 32 * 2**20,
        "api_key_env": "TOKEN",
        "served_name": ["coder"],
        "distributed": None,
    }
    assert json.loads(argv[1])["kv"]["bits"] == 8 and json.loads(argv[1])["kv"]["affine_rotate"] is False
    key = coder.process_key()
    assert key["overrides.affine_rotate"] is False and key["env.A"] == "b" and key["port"] == 8081
    assert "description" not in key and "restart.max_failures" not in key
    assert coder.live_key() == {
        "allow_unauthenticated": False,
        "description": "demo",
        "ready_timeout_s": 600.0,
        "stop_timeout_s": 30.0,
        "restart.max_failures": 5,
        "restart.window_s": 300.0,
        "restart.backoff_initial_s": 1.0,
        "restart.backoff_max_s": 60.0,
        "health.interval_s": 10.0,
        "health.timeout_s": 5.0,
        "health.failures": 3,
        "aliases": (),
        "start": "always",
        "idle_unload_s": None,
        "concurrency": 4,
    }


def test_the_worker_gets_one_json_document_never_set_text(tmp_path: Path) -> None:
    text = entry(
        "model: ./model\nport: 8081\nmethod: h2o\noverrides: {h2o_budget: 512}\n"
        "limits: {max_tokens: 4096, max_prompt_tokens: 2048, max_body_bytes: 2M}"
    )
    entry_ = load_config(write_config(tmp_path, text, dedent=False)).servers["coder"]
    argv = entry_.serve_argv()
    assert not {"--set", "--method", "--bits", "--seed", "--kv-json"} & set(argv)
    document = protocol.read_entry_document(argv[argv.index(protocol.ENTRY_JSON_FLAG) + 1])
    assert document["kv"] == entry_.kv.to_dict() and document["kv"]["h2o_budget"] == 512
    assert KVCacheConfig.from_dict(document["kv"]) == entry_.kv
    assert (document["limit_max_tokens"], document["limit_max_prompt_tokens"]) == (4096, 2048)
    assert document["max_body_bytes"] == 2_000_000
