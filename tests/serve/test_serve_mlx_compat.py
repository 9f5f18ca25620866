"""Contract tests for veloxd/serve/mlx_compat/: the mlx_lm.server internals it relies on.

An mlx_lm upgrade that moves any of these breaks here, loudly, in one place.
"""

from __future__ import annotations

import argparse
import inspect
import re
from pathlib import Path
from typing import Any, NoReturn

import pytest
from mlx_lm import server as mlx_server

import veloxd
from tests.serve.private_names import private_mlx_lm_uses, scan_source
from veloxd.serve.mlx_compat import models, provider


def upstream_parser() -> argparse.ArgumentParser:
    """mlx_lm.server.main()'s parser, captured when main() asks it to parse (test-only trick)."""
    captured: dict[str, argparse.ArgumentParser] = {}

    class Captured(Exception):
        pass

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> NoReturn:
        captured["parser"] = self
        raise Captured

    with pytest.MonkeyPatch.context() as patch:  # parse_args is restored on the way out
        patch.setattr(argparse.ArgumentParser, "parse_args", capture)
        with pytest.raises(Captured):
            mlx_server.main()
    return captured["parser"]


def test_installed_mlx_lm_is_in_the_tested_range() -> None:
    models.check_version()


def test_upstream_defaults_match_mlx_lm_server_main() -> None:
    defaults = vars(upstream_parser().parse_args([]))
    assert defaults == provider.UPSTREAM_DEFAULTS


def test_every_cli_arg_mlx_lm_server_reads_is_provided() -> None:
    source = inspect.getsource(mlx_server)
    read = set(re.findall(r"cli_args\.([a-z_]+)", source))
    missing = read - set(provider.UPSTREAM_DEFAULTS)
    assert not missing, f"mlx_lm.server now reads {missing}"


def test_model_provider_load_hook_signature() -> None:
    params = list(inspect.signature(mlx_server.ModelProvider._load).parameters)
    assert params == ["self", "model_path", "adapter_path", "draft_model_path"]
    for attribute in ("_model_map", "_adapter_map", "is_batchable"):
        assert attribute in inspect.getsource(mlx_server.ModelProvider.__init__)


def test_api_handler_hooks_exist() -> None:
    for name in ("do_GET", "do_POST", "handle_completion", "_set_completion_headers"):
        assert callable(getattr(mlx_server.APIHandler, name))
    init = inspect.signature(mlx_server.APIHandler.__init__).parameters
    assert "system_fingerprint" in init
    assert "requested_model" in inspect.getsource(mlx_server.APIHandler.do_POST)


def test_response_generator_internals_used_for_stop_and_health() -> None:
    source = inspect.getsource(mlx_server.ResponseGenerator)
    for needle in ("self._stop", "self._generation_thread", "def is_healthy"):
        assert needle in source


def test_generation_hooks_used_to_bound_requests() -> None:
    """StoppableGenerator overrides _tokenize and _await_response; both of mlx_lm's paths honour ctx.stop()."""
    generator = mlx_server.ResponseGenerator
    assert list(inspect.signature(generator._tokenize).parameters) == ["self", "tokenizer", "request", "args"]
    assert set(re.findall(r"\bargs\.([a-z_]+)", inspect.getsource(generator._tokenize))) == {"chat_template_kwargs"}
    assert list(inspect.signature(generator._await_response).parameters) == ["self", "response_queue"]
    generate = inspect.getsource(generator.generate)
    assert generate.count("self._await_response(response_queue)") == 2  # the context, then every item
    assert "self._tokenize(" in inspect.getsource(generator._serve_single)
    assert "self._tokenize(" in inspect.getsource(generator._generate)
    assert "ctx._should_stop" in inspect.getsource(generator._serve_single)
    assert inspect.getsource(generator._generate).count('["ctx"]._should_stop') == 2  # prefill and decode
    assert callable(mlx_server.GenerationContext.stop) and inspect.isclass(mlx_server.Response)


def test_request_hooks_used_for_limits() -> None:
    """The handler reads the body once with rfile.read, then reads self.max_tokens and chat_template_kwargs."""
    do_post = inspect.getsource(mlx_server.APIHandler.do_POST)
    assert "self.rfile.read(content_length)" in do_post
    assert "self.max_tokens" in do_post and "self.chat_template_kwargs" in do_post
    assert "max_tokens=self.max_tokens" in inspect.getsource(mlx_server.APIHandler.handle_completion)
    assert "finally:\n            ctx.stop()" in inspect.getsource(mlx_server.APIHandler.handle_completion)


def test_server_args_keeps_upstream_defaults_and_applies_overrides() -> None:
    args = provider.server_args(model="m", max_tokens=7, temp=None)
    assert args.model == "m" and args.max_tokens == 7 and args.temp == 0.0
    assert args.kv_bits is None  # mlx_lm's own KV quantization stays off: veloxd owns the cache


def test_private_names_the_compat_module_uses_exist() -> None:
    """Each private mlx_lm name veloxd relies on, pinned by a plain import or attribute read."""
    from mlx_lm.models.cache import _BaseCache
    from mlx_lm.utils import _get_classes

    assert models.BaseCache is _BaseCache
    assert callable(_get_classes)
    generator = mlx_server.ResponseGenerator
    for method in ("_next_request", "_share_request", "_tokenize", "_await_response", "_serve_single", "_generate"):
        assert callable(getattr(generator, method)), method
    source = inspect.getsource(generator)
    for attribute in ("self._is_distributed", "self._rank", "self._stop", "self._generation_thread"):
        assert attribute in source, attribute
    assert list(inspect.signature(generator._next_request).parameters) == ["self", "timeout"]
    assert list(inspect.signature(generator._share_request).parameters) == ["self", "request"]


def test_model_classes_resolves_remapped_model_types() -> None:
    from mlx_lm.models import llama, mistral3

    assert models.model_classes({"model_type": "llama"})[0] is llama.Model
    assert models.model_classes({"model_type": "mistral3"})[0] is mistral3.Model
    with pytest.raises(ValueError):
        models.model_classes({"model_type": "no-such-architecture"})


def test_no_other_module_names_a_private_mlx_lm_attribute() -> None:
    """The one door: private mlx_lm names appear only in veloxd/serve/mlx_compat/."""
    offenders = private_mlx_lm_uses(Path(veloxd.__file__).parent, exclude={"serve/mlx_compat/"})
    assert offenders == []


def test_the_private_name_scan_finds_a_use() -> None:
    """The scan above would see an offender (it can fail)."""
    source = (
        "from mlx_lm.utils import _get_classes\nimport mlx_lm.models.cache as c\nc._BaseCache\nx._generation_thread\n"
    )
    assert [name for _, name in scan_source(source)] == ["_get_classes", "_BaseCache", "_generation_thread"]
