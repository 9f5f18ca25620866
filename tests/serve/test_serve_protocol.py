"""One rule per value, one document per worker: what the daemon writes is what the worker reads.

The daemon gives a worker its veloxd.yaml entry as one JSON document (`ServerEntry.serve_argv`:
--entry-json); the worker reads it through the same validation as the hand-typed flags
(`build_options`). These tests parse the daemon's argv exactly as `veloxd serve` does and compare
what each side ends up with. No model is loaded. (The entry document's own tests:
test_serve_entry_document.py.)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.config_support import entry, write_config
from tests.serve.document_support import worker_options
from veloxd import protocol
from veloxd.checks import parse_size
from veloxd.config import load_config
from veloxd.kv import registry
from veloxd.kv.config import KVCacheConfig, field_named, override_fields_for

SHIPPED = Path(__file__).resolve().parents[2] / "veloxd" / "assets" / "tiny-llama"


def test_2G_means_the_same_bytes_in_veloxd_yaml_and_on_the_worker_command_line(tmp_path: Path) -> None:
    text = entry(
        f"model: {SHIPPED}\nport: 1\nmethod: fp16\nprompt_cache: {{bytes: 2G}}\nlimits: {{max_body_bytes: 2Gi}}"
    )
    server = load_config(write_config(tmp_path, text, dedent=False)).servers["coder"]
    by_hand = worker_options(
        "--model", str(SHIPPED), "--port", "1", "--prompt-cache-bytes", "2G", "--max-body-bytes", "2Gi"
    )
    from_daemon = worker_options(*server.serve_argv())
    assert server.prompt_cache.bytes == by_hand.prompt_cache_bytes == from_daemon.prompt_cache_bytes == 2 * 10**9
    assert (
        server.limits.max_body_bytes == by_hand.limits.max_body_bytes == from_daemon.limits.max_body_bytes == 2 * 2**30
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512", 512),
        ("1k", 1000),
        ("1K", 1000),
        ("1KB", 1000),
        ("1Ki", 1024),
        ("1KiB", 1024),
        ("1.5G", 1_500_000_000),
        ("1.5GiB", 1_610_612_736),
        ("2M", 2_000_000),
        ("2Mi", 2_097_152),
        ("1T", 10**12),
    ],
)
def test_the_one_unit_rule(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("method", registry.names())
def test_the_worker_runs_exactly_the_kv_config_of_the_entry(tmp_path: Path, method: str) -> None:
    """Every method with non-default settings: the document's kv carries them all, nothing is re-derived."""
    overrides: dict[str, object] = {}
    for name in override_fields_for(method):  # a non-default value for every setting with choices
        f = field_named(name)
        if f.metadata["kind"] is bool:
            overrides[name] = not f.default
        elif f.metadata["choices"]:
            overrides[name] = next(c for c in f.metadata["choices"] if c != f.default)
    bits = registry.get(method).bits_choices
    text = entry(
        f"model: {SHIPPED}\nport: 1\nmethod: {method}\n"
        + (f"bits: {bits[0]}\n" if bits else "")
        + f"overrides: {json.dumps(overrides)}\nlimits: {{max_tokens: 77, max_prompt_tokens: 99}}"
    )
    server = load_config(write_config(tmp_path, text, dedent=False)).servers["coder"]
    assert server.kv.overrides() == overrides
    options = worker_options(*server.serve_argv())
    assert options.kv == server.kv and options.kv.to_dict() == server.kv.to_dict()
    assert (options.limits.max_tokens, options.limits.max_prompt_tokens) == (77, 99)
    assert options.limits.body_timeout_s == server.limits.request_body_timeout_s
    assert protocol.config_mismatch(server.kv.to_dict(), options.kv.to_dict()) is None


def test_kv_json_also_reads_a_file(tmp_path: Path) -> None:
    document = tmp_path / "kv.json"
    document.write_text(json.dumps(KVCacheConfig("kivi", bits=2).to_dict()))
    options = worker_options("--model", str(SHIPPED), "--port", "1", "--kv-json", str(document))
    assert options.kv == KVCacheConfig("kivi", bits=2)


def test_ready_line_round_trip_and_refusals() -> None:
    asked = KVCacheConfig("kivi", bits=2).to_dict()
    payload: protocol.ReadyPayload = {
        "schema_version": 1,
        "model": "m",
        "method": "kivi",
        "config": asked,
        "host": "127.0.0.1",
        "port": 1,
        "pid": 2,
    }
    line = protocol.format_ready(payload)
    assert "\n" not in line and protocol.parse_ready(line) == payload
    assert protocol.config_mismatch(asked, {**asked, "bits": 4}) == (
        "the worker runs a different KV config than asked (bits: asked 2, got 4)"
    )
    assert protocol.config_mismatch(asked, None) == "the READY line has no config object"
    for bad, why in [
        ("VELOXD_READY {", "not JSON"),
        ("VELOXD_READY []", "not a JSON object"),
        ("VELOXD_READY {}", "lacks schema_version"),
        (protocol.format_ready({**payload, "schema_version": 9}), "schema_version 9"),
    ]:
        with pytest.raises(protocol.ProtocolError, match=why):
            protocol.parse_ready(bad)


def test_limits_default_to_the_context_length_the_model_states() -> None:
    from veloxd.serve.limits import RequestLimits, context_length

    assert context_length({"max_position_embeddings": 4096}) == 4096
    assert context_length({"text_config": {"max_position_embeddings": 2048}}) == 2048  # a VLM's text model
    assert context_length({}, tokenizer_max_length=1024) == 1024
    assert context_length({}, tokenizer_max_length=int(1e30)) is None  # transformers' "unbounded" sentinel
    resolved = RequestLimits(max_tokens=100).resolve(4096)
    assert (resolved.max_tokens, resolved.max_prompt_tokens, resolved.context_length) == (100, 4096, 4096)
