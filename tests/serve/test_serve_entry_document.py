"""The worker's one document (--entry-json): every setting of an entry reaches the worker through
it, it means what the same flags typed by hand mean, and a bad one is refused naming the key.

No model is loaded: ServeOptions is what `veloxd serve` validates before it imports mlx.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.serve.document_support import hand_flags, worker_options
from tests.support import free_port, run_veloxd
from veloxd import protocol
from veloxd.cli import build_parser
from veloxd.config.codec import WORKER_KEYS
from veloxd.config.model import ServerEntry
from veloxd.config.sections import Distributed, Limits, PromptCache, Sampling
from veloxd.kv import registry
from veloxd.kv.config import OWN_KEYS, KVCacheConfig
from veloxd.serve.options import PARALLELISMS, ServeOptions, UsageError

SHIPPED = Path(__file__).resolve().parents[2] / "veloxd" / "assets" / "tiny-llama"
PORT = free_port()  # claimed for this process: build_options checks that the port is free
KEY_ENV = "VELOXD_TEST_ENTRY_DOCUMENT_KEY"
# ServeOptions fields that no entry setting gives: the daemon's pipe, and what validation adds.
NOT_SETTINGS = {"lifeline_fd", "warnings"}
# An entry's restart keys that reach the worker another way than its document: its environment
# (the process's env), and the group's launch (veloxd.distributed.command: MLX's launcher flags).
ELSEWHERE = {"env.A", "distributed.hosts", "distributed.hostfile", "distributed.backend", "distributed.port"}
ELSEWHERE |= {"distributed.python", "distributed.cwd", "distributed.env"}


def every_setting_entry(**changes: Any) -> ServerEntry:
    """An entry whose every worker setting differs from veloxd serve's default."""
    fields: dict[str, Any] = {
        "name": "coder",
        "model": str(SHIPPED),
        "port": PORT,
        "host": "0.0.0.0",
        "kv": KVCacheConfig("kivi", bits=2, kivi_group_size=64),
        "sampling": Sampling(temp=0.7, top_p=0.9, max_tokens=33),
        "prompt_cache": PromptCache(size=3, bytes=2 * 10**9),
        "limits": Limits(max_tokens=44, max_prompt_tokens=55, request_body_timeout_s=7.5, max_body_bytes=2**20),
        "env": {"A": "a"},
        "adapter_path": str(SHIPPED),  # any directory: nothing is loaded
        "api_key_env": KEY_ENV,
    }
    return ServerEntry(**{**fields, **changes})


def test_every_serve_option_is_reachable_from_the_document(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails when a ServeOptions field gains no document key (it would keep its default here)."""
    monkeypatch.setenv(KEY_ENV, "token")
    single = worker_options(*every_setting_entry().serve_argv())
    group = worker_options(
        *every_setting_entry(adapter_path=None, distributed=Distributed(parallelism="pipeline")).serve_argv()
    )
    default = ServeOptions(model="", kv=KVCacheConfig("affine"))
    settable = {f.name for f in dataclasses.fields(ServeOptions)} - NOT_SETTINGS
    reached = {
        name for name in settable if any(getattr(got, name) != getattr(default, name) for got in (single, group))
    }
    assert reached == settable
    assert single == ServeOptions(
        model=str(SHIPPED),
        kv=KVCacheConfig("kivi", bits=2, kivi_group_size=64),
        host="0.0.0.0",
        port=PORT,
        adapter_path=str(SHIPPED),
        max_tokens=33,
        temp=0.7,
        top_p=0.9,
        prompt_cache_size=3,
        prompt_cache_bytes=2 * 10**9,
        api_key_env=KEY_ENV,
        limits=single.limits,
        served_names=("coder",),
        warnings=single.warnings,
    )
    assert dataclasses.astuple(single.limits) == (44, 55, 7.5, 2**20)
    assert (group.distributed, group.adapter_path) == ("pipeline", None)


def test_every_restart_key_of_an_entry_reaches_the_worker() -> None:
    """Fails when a ServerEntry setting that needs a restart is neither in the document nor in ELSEWHERE."""
    entry = every_setting_entry(distributed=Distributed(hosts=("127.0.0.1", "127.0.0.1"), env={"B": "b"}))
    keys = set(entry.process_key())
    kv_keys = {key for key in keys if key == "method" or key in OWN_KEYS or key.startswith("overrides.")}  # all in kv
    unreached = keys - set(WORKER_KEYS.values()) - kv_keys
    assert unreached == ELSEWHERE
    assert set(WORKER_KEYS) | {"kv", "served_name"} == set(protocol.ENTRY_KEYS)


def test_an_entry_document_may_be_a_file(tmp_path: Path) -> None:
    path = tmp_path / "entry.json"
    path.write_text(
        json.dumps({"version": 1, "model": str(SHIPPED), "kv": {"method": "kivi", "bits": 2}, "port": PORT})
    )
    options = worker_options(protocol.ENTRY_JSON_FLAG, str(path))
    assert (options.kv, options.port, options.host) == (KVCacheConfig("kivi", bits=2), PORT, "127.0.0.1")


GOOD = {"version": 1, "model": str(SHIPPED), "kv": {"method": "affine"}, "port": PORT}


@pytest.mark.parametrize(
    ("document", "expected"),
    [
        ({**GOOD, "prot": 1}, "--entry-json: unknown key 'prot'; did you mean 'port'?"),
        ({**GOOD, "colour": 1}, "--entry-json: unknown key 'colour' (keys: version, model, kv, host"),
        ({k: v for k, v in GOOD.items() if k != "model"}, "--entry-json: missing key 'model'"),
        ({k: v for k, v in GOOD.items() if k != "kv"}, "--entry-json: missing key 'kv'"),
        ({k: v for k, v in GOOD.items() if k != "version"}, "--entry-json: missing key 'version'"),
        ({**GOOD, "version": 2}, "--entry-json: version 2; this veloxd reads 1"),
        ({**GOOD, "port": "8080"}, '--entry-json: port must be integer or null, not "8080"'),
        ({**GOOD, "port": True}, "--entry-json: port must be integer or null, not true"),
        ({**GOOD, "temp": "hot"}, '--entry-json: temp must be number or null, not "hot"'),
        ({**GOOD, "served_name": "coder"}, '--entry-json: served_name must be array or null, not "coder"'),
        ({**GOOD, "served_name": [1]}, "--entry-json: served_name must be an array of strings, not [1]"),
        ({**GOOD, "port": 70000}, "--entry-json port 70000: must be between 1 and 65535"),
        ({**GOOD, "top_p": 1.5}, "--entry-json top_p 1.5: must be between 0 and 1"),
        ({**GOOD, "temp": 2.5}, "--entry-json temp 2.5: must be between 0 and 2"),
        ({**GOOD, "prompt_cache_size": 0}, "--entry-json prompt_cache_size 0: must be between 1 and 100000"),
        ({**GOOD, "max_body_bytes": "lots"}, "--entry-json max_body_bytes 'lots': expected"),
        ({**GOOD, "host": "bad host!"}, "--entry-json host 'bad host!' is not a host name"),
        ({**GOOD, "distributed": "data"}, "--entry-json distributed 'data': choose one of tensor, pipeline"),
        ({**GOOD, "kv": {"method": "kivi", "bits": 3}}, "--entry-json kv: bits: bits=3 is not valid for method kivi"),
        ({**GOOD, "model": "/nonexistent/model"}, "--entry-json model: model path /nonexistent/model does not exist"),
        ({**GOOD, "api_key_env": "VELOXD_TEST_UNSET_KEY"}, "--entry-json api_key_env VELOXD_TEST_UNSET_KEY: that"),
        (
            {**GOOD, "adapter_path": str(SHIPPED), "distributed": "tensor"},
            "--entry-json adapter_path: mlx_lm loads no LoRA adapter on a sharded model",
        ),
    ],
)
def test_a_bad_document_names_the_key(document: dict[str, Any], expected: str) -> None:
    with pytest.raises(UsageError) as caught:
        worker_options(protocol.ENTRY_JSON_FLAG, json.dumps(document))
    assert expected in str(caught.value)


def test_the_document_takes_no_other_setting_flag() -> None:
    for flags, named in (
        (["--port", "8080"], "--port"),
        (["--bits", "2", "--served-name", "x"], "--served-name, --bits"),
    ):
        with pytest.raises(UsageError) as caught:
            worker_options(protocol.ENTRY_JSON_FLAG, json.dumps(GOOD), *flags)
        assert str(caught.value) == f"--entry-json holds every setting: drop {named}"


def test_a_bad_document_exits_2_before_anything_loads() -> None:
    done = run_veloxd("serve", protocol.ENTRY_JSON_FLAG, json.dumps({**GOOD, "prot": 1}))
    assert done.returncode == protocol.ExitCode.INVALID and done.stdout == "", done.stderr
    assert "veloxd serve: error: --entry-json: unknown key 'prot'; did you mean 'port'?" in done.stderr
    assert "Traceback" not in done.stderr


def test_every_document_key_is_a_flag_of_veloxd_serve() -> None:
    """The document's keys are the flags' dests: one vocabulary for the daemon and for people."""
    dests = vars(build_parser().parse_args(["serve"]))
    assert set(protocol.ENTRY_KEYS) - {"kv"} <= set(dests) and "kv_json" in dests
    assert all(value is None for key, value in dests.items() if key in protocol.ENTRY_KEYS)  # given: not None


def test_serve_help_describes_the_document() -> None:
    done = run_veloxd("serve", "--help")
    text = " ".join(done.stdout.split())
    assert done.returncode == 0 and protocol.ENTRY_JSON_FLAG in text
    assert all(f"{key} (" in text for key in protocol.ENTRY_KEYS), text


def optional(values: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.none() | values


SIZES = st.integers(1, 1 << 40) | st.sampled_from(["2G", "512Mi", "1.5GiB", "4096"])
SETTINGS = st.fixed_dictionaries(
    {
        "model": st.just(str(SHIPPED)),
        "kv": st.sampled_from(registry.names()).map(lambda method: KVCacheConfig(method).to_dict()),
        "host": optional(st.sampled_from(["127.0.0.1", "0.0.0.0"])),
        "port": optional(st.just(PORT)),
        "adapter_path": optional(st.just(str(SHIPPED))),
        "max_tokens": optional(st.integers(1, 1 << 20)),
        "temp": optional(st.floats(0, 2)),
        "top_p": optional(st.floats(0, 1)),
        "prompt_cache_size": optional(st.integers(1, 1000)),
        "prompt_cache_bytes": optional(SIZES),
        "limit_max_tokens": optional(st.integers(1, 1 << 24)),
        "limit_max_prompt_tokens": optional(st.integers(1, 1 << 24)),
        "request_body_timeout": optional(st.floats(0.001, 3600)),
        "max_body_bytes": optional(SIZES),
        "api_key_env": optional(st.just(KEY_ENV)),
        "served_name": optional(st.lists(st.from_regex(r"\A[a-z0-9][a-z0-9_.-]{0,20}\Z"), max_size=3)),
        "distributed": optional(st.sampled_from(PARALLELISMS)),
    }
).filter(lambda s: not (s["distributed"] and s["adapter_path"]))  # refused on either road


@settings(max_examples=40, deadline=None)  # no deadline: a wall clock under load
@given(SETTINGS)
def test_the_document_and_the_flags_mean_the_same(chosen: dict[str, Any]) -> None:
    """Render, read back unchanged; the worker's options equal those of the same flags typed by hand."""
    text = protocol.entry_document(chosen)
    read = protocol.read_entry_document(text)
    assert read == chosen
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(KEY_ENV, "token")
        assert worker_options(protocol.ENTRY_JSON_FLAG, text) == worker_options(*hand_flags(read))
