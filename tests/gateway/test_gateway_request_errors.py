"""What the gateway answers when a request's `model` cannot be routed: a model two entries serve
(ambiguous, naming them), a `model` that is not a string, a body that is not a JSON object.
One daemon and its gateway in front of stand-in workers (tests/fixtures/fake_worker.py)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fixtures.daemon_harness import DaemonHarness
from tests.gateway.support import GATEWAY, fake_entry, gateway_yaml, model_dir, post
from tests.support import free_port, http_json


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`one` and `two` serve the same model directory, `solo` another one."""
    root = tmp_path_factory.mktemp("gateway-errors")
    shared, other = model_dir(root, "shared-model"), model_dir(root, "solo-model")
    h = DaemonHarness(root)
    port = free_port()
    servers = {"one": fake_entry(shared), "two": fake_entry(shared), "solo": fake_entry(other, aliases=["lone"])}
    h.write(gateway_yaml({"port": port}, servers))
    try:
        h.start()
        h.wait_states({GATEWAY: "ready", "one": "ready", "two": "ready", "solo": "ready"})
        yield {"base": f"http://127.0.0.1:{port}", "shared": shared, "other": other}
    finally:
        h.cleanup()


@pytest.mark.parametrize("which", ["path", "directory name"])
def test_a_model_several_entries_serve_is_ambiguous_naming_them(gateway: dict[str, Any], which: str) -> None:
    model = str(gateway["shared"]) if which == "path" else "shared-model"
    status, body = post(gateway["base"], "/v1/chat/completions", {"model": model, "messages": []})
    error = body["error"]
    assert status == 404 and error["code"] == "model_ambiguous", body
    assert error["message"] == f"model {model!r} is served by several entries: one, two; name one of them"
    assert error["served_by"] == ["one", "two"] and error["param"] == "model"
    assert error["type"] == "invalid_request_error"


def test_get_model_of_an_ambiguous_model_says_so_too(gateway: dict[str, Any]) -> None:
    status, body = http_json(gateway["base"] + "/v1/models/shared-model")
    assert status == 404 and body["error"]["code"] == "model_ambiguous", body
    assert body["error"]["served_by"] == ["one", "two"]


def test_a_model_one_entry_serves_is_still_routed(gateway: dict[str, Any]) -> None:
    for model in ("solo-model", str(gateway["other"]), "lone", "one"):
        status, body = post(gateway["base"], "/v1/completions", {"model": model, "prompt": "x"})
        assert status == 200 and body["model"] == ("one" if model == "one" else "solo"), (model, body)


def test_an_unknown_model_is_still_not_found(gateway: dict[str, Any]) -> None:
    status, body = post(gateway["base"], "/v1/completions", {"model": "gpt-5", "prompt": "x"})
    assert status == 404 and body["error"]["code"] == "model_not_found"
    assert body["error"]["message"] == "model 'gpt-5' not found; valid models: one, two, solo (aliases: lone)"


@pytest.mark.parametrize(
    ("model", "shown"),
    [(5, "5"), (None, "null"), (True, "true"), (["one"], '["one"]'), ({"name": "one"}, '{"name": "one"}')],
)
def test_a_model_that_is_not_a_string_is_named_as_such(gateway: dict[str, Any], model: Any, shown: str) -> None:
    status, body = post(gateway["base"], "/v1/completions", {"model": model, "prompt": "x"})
    assert status == 400 and body["error"]["code"] == "invalid_model", body
    assert body["error"]["message"] == f"'model' must be a string (got {shown})"
    assert body["error"]["param"] == "model"


def test_a_huge_non_string_model_is_shown_shortened(gateway: dict[str, Any]) -> None:
    status, body = post(gateway["base"], "/v1/completions", {"model": list(range(1000)), "prompt": "x"})
    message = body["error"]["message"]
    assert status == 400 and message.startswith("'model' must be a string (got [0, 1, 2, "), message
    assert len(message) < 120 and message.endswith("...)")


@pytest.mark.parametrize(
    ("body", "kind"),
    [
        (b"[]", "array"),
        (b'[{"model": "one"}]', "array"),
        (b'"one"', "string"),
        (b"5", "integer"),  # JSON Schema's names, as veloxd's other messages about JSON use
        (b"5.5", "number"),
        (b"true", "boolean"),
        (b"null", "null"),
    ],
)
def test_a_body_that_is_not_an_object_is_named_as_such(gateway: dict[str, Any], body: bytes, kind: str) -> None:
    status, answer = post(gateway["base"], "/v1/completions", body)
    assert status == 400 and answer["error"]["code"] == "invalid_body", answer
    assert answer["error"]["message"] == f"the request body must be a JSON object (got a JSON {kind})"


def test_a_body_without_model_still_lists_the_valid_names(gateway: dict[str, Any]) -> None:
    status, body = post(gateway["base"], "/v1/completions", {"prompt": "x"})
    assert status == 400 and body["error"]["code"] == "model_required"
    assert body["error"]["message"] == "request has no 'model'; valid models: one, two, solo"


def test_an_unknown_path_and_a_wrong_method_answer_in_the_openai_error_shape(gateway: dict[str, Any]) -> None:
    """aiohttp's own 404 and 405 are text/plain; a client reading error.message gets them as JSON."""
    status, body = http_json(gateway["base"] + "/v1/nothing-here")
    assert status == 404 and body["error"]["message"] == "Not Found: GET /v1/nothing-here", body
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["code"] == "not_found"
    request = urllib.request.Request(gateway["base"] + "/v1/chat/completions", data=b"{}", method="PUT")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=60)
    assert refused.value.code == 405 and refused.value.headers["Allow"] == "POST"
    error = json.loads(refused.value.read())["error"]
    assert error["message"] == "Method Not Allowed: PUT /v1/chat/completions" and error["code"] == "method_not_allowed"
