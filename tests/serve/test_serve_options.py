"""`veloxd serve` refuses bad flags with exit 2, naming the culprit, before any model loads."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tests.support import run_reporting_imports, run_veloxd


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (["--method", "kivv"], "unknown method 'kivv'; did you mean 'kivi'?"),
        (["--method", "kivi", "--set", "kivi_group_sise=64"], "did you mean 'kivi_group_size'?"),
        (["--method", "h2o", "--set", "kivi_group_size=64"], "kivi_group_size applies to method kivi, not h2o"),
        (
            ["--method", "snapkv", "--set", "affine_group_size=64"],
            "not snapkv; to keep snapkv's tokens as affine codes use method snapkv_affine",
        ),
        (["--method", "kivi", "--set", "bits=2"], "--set bits=...: use the --bits flag instead"),
        (["--method", "kivi", "--set", "seed=1"], "use the --seed flag instead"),
        (["--method", "kivi", "--set", "kivi_group_size=abc"], "kivi_group_size must be int, not 'abc'"),
        (
            ["--method", "kivi", "--set", "kivi_group_size=48"],
            "kivi_group_size=48 for method kivi: choose one of [32, 64, 128]",
        ),
        (["--method", "kivi", "--set", "kivi_residual_length=100"], "must be a multiple of kivi_group_size=32"),
        (["--method", "kivi", "--bits", "3"], "bits=3 is not valid for method kivi; choose one of [2, 4]"),
        (["--method", "fp16", "--bits", "4"], "bits does not apply to method fp16 (only to: affine, kivi"),
        (["--method", "kivi", "--seed", "3"], "seed does not apply to method kivi (only to: affine, turboquant_mse"),
        (["--method", "snapkv", "--seed", "3"], "to keep snapkv's tokens as affine codes use method snapkv_affine"),
        (["--method", "kivi", "--set", "nonsense"], "expected FIELD=VALUE"),
        (["--method", "affine", "--top-p", "1.5"], "--top-p 1.5: must be between 0 and 1"),
        (["--method", "affine", "--port", "70000"], "--port 70000: must be between 1 and 65535"),
        (
            ["--method", "affine", "--api-key-env", "VELOXD_TEST_UNSET_KEY"],
            "VELOXD_TEST_UNSET_KEY: that environment variable is not set",
        ),
        (
            ["--method", "affine", "--prompt-cache-bytes", "lots"],
            "--prompt-cache-bytes 'lots': expected an integer number of bytes or a string like '512M' or '2G'",
        ),
        (["--max-body-bytes", "0"], "--max-body-bytes '0': expected"),
        (["--limit-max-prompt-tokens", "0"], "--limit-max-prompt-tokens 0: must be between 1 and 16777216"),
        (["--limit-max-tokens", "16777217"], "--limit-max-tokens 16777217: must be between 1 and 16777216"),
        (["--request-body-timeout", "0"], "--request-body-timeout 0.0: must be > 0 and <= 3600"),
        (["--request-body-timeout", "3601"], "--request-body-timeout 3601.0: must be > 0 and <= 3600"),
        # the bounds of veloxd.yaml's schema (sampling.*, prompt_cache.size), not looser ones
        (["--temp", "2.5"], "--temp 2.5: must be between 0 and 2"),
        (["--temp", "-1"], "--temp -1.0: must be between 0 and 2"),
        (["--prompt-cache-size", "0"], "--prompt-cache-size 0: must be between 1 and 100000"),
        (["--max-tokens", "1048577"], "--max-tokens 1048577: must be between 1 and 1048576"),
        (["--host", "bad host!"], "--host 'bad host!' is not a host name or IP address"),
        (
            ["--kv-json", '{"method": "kivi", "kivi_group_size": 48}'],
            "--kv-json: kivi_group_size: kivi_group_size=48 for method kivi",
        ),
        (
            ["--kv-json", '{"method": "kivi", "kivi_group_sise": 64}'],
            "--kv-json: kivi_group_sise: unknown field 'kivi_group_sise'; did you mean 'kivi_group_size'?",
        ),
        (["--kv-json", '{"method": "kivi"}', "--bits", "2"], "--kv-json holds every KV setting: drop --bits"),
        (["--kv-json", "[1, 2]"], "--kv-json: expected a JSON object of KV-cache settings, not list"),
        (["--kv-json", "{method: kivi}"], "--kv-json: not JSON"),
        (["--kv-json", "/nonexistent/kv.json"], "--kv-json /nonexistent/kv.json: cannot read"),
    ],
)
def test_bad_flags_exit_2_naming_the_culprit(tiny_model: Path, flags: list[str], expected: str) -> None:
    """Each mistake exits 2 with one clear line, and nothing heavy is imported."""
    result = run_veloxd("serve", "--model", str(tiny_model), "--port", "1", *flags)
    assert result.returncode == 2, result.stderr
    assert expected in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


def test_missing_model_directory_is_refused_before_load(tmp_path: Path) -> None:
    result = run_veloxd("serve", "--model", str(tmp_path / "nope"), "--method", "affine")
    assert result.returncode == 2
    assert f"model path {tmp_path / 'nope'} does not exist" in result.stderr


def test_malformed_hugging_face_id_is_refused() -> None:
    result = run_veloxd("serve", "--model", "not a repo id", "--method", "affine")
    assert result.returncode == 2
    assert "is neither an existing directory" in result.stderr and "nor a Hugging Face id" in result.stderr


def test_port_in_use_exits_4_naming_the_port(tiny_model: Path) -> None:
    """Not a mistake in the flags but a condition of the world: its own code, so the daemon waits."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = run_veloxd("serve", "--model", str(tiny_model), "--method", "fp16", "--port", str(port))
    assert result.returncode == 4
    assert f"port {port} on 127.0.0.1 is already in use" in result.stderr


def test_a_host_this_machine_cannot_listen_on_exits_4_naming_it(tiny_model: Path) -> None:
    """A name that does not resolve (RFC 6761: .invalid never does) is a condition of the world too:
    exit 4 and the daemon waits, where a malformed host (999.1.1.1) is a mistake: exit 2."""
    base = ("serve", "--model", str(tiny_model), "--method", "fp16")
    result = run_veloxd(*base, "--host", "studio.invalid")
    assert result.returncode == 4 and "host studio.invalid does not resolve" in result.stderr, result.stderr
    malformed = run_veloxd(*base, "--host", "999.1.1.1")
    assert malformed.returncode == 2 and "'999.1.1.1' is not a valid IP address" in malformed.stderr, malformed.stderr


def test_invalid_flags_are_refused_before_mlx_is_imported(tiny_model: Path) -> None:
    """Rejection needs no model and no MLX: the worker exits 2 having imported neither."""
    done, heavy = run_reporting_imports(
        "serve", "--model", str(tiny_model), "--method", "kivi", "--set", "kivi_group_size=48"
    )
    assert done.returncode == 2 and "kivi_group_size" in done.stderr, done.stderr
    assert heavy == [], f"refusing bad flags imported {heavy}"


def test_serve_help_lists_every_method_and_its_fields() -> None:
    result = run_veloxd("serve", "--help")
    assert result.returncode == 0
    from veloxd.kv import registry

    for name in registry.names():
        assert name in result.stdout
    assert "kivi_residual_length" in result.stdout


def test_methods_json_is_the_registry() -> None:
    import json

    from veloxd.kv import registry

    result, heavy = run_reporting_imports("methods", "--json")
    assert heavy == []
    assert result.returncode == 0
    data = json.loads(result.stdout)
    assert [m["name"] for m in data["methods"]] == list(registry.names())
    kivi = next(m for m in data["methods"] if m["name"] == "kivi")
    assert kivi["bits_choices"] == [2, 4]
    assert {f["name"] for f in kivi["fields"]} == {"bits", "kivi_group_size", "kivi_residual_length"}
