"""One OpenAI error body for the worker, mlx_lm's reshaped answers and the gateway (veloxd/openai_errors.py)."""

from __future__ import annotations

import json

import pytest

from veloxd.gateway.proxy import error_response
from veloxd.openai_errors import json_kind, openai_error
from veloxd.serve.mlx_compat.errors import reshape


@pytest.mark.parametrize(
    ("status", "kind"),
    [(400, "invalid_request_error"), (404, "invalid_request_error"), (499, "invalid_request_error")]
    + [(500, "server_error"), (502, "server_error"), (503, "server_error"), (504, "server_error")],
)
def test_the_type_follows_the_status(status: int, kind: str) -> None:
    body = openai_error(status, "why", "a_code", param="model")
    assert body == {"error": {"message": "why", "type": kind, "code": "a_code", "param": "model"}}
    answer = error_response(status, "why", "a_code", param="model")  # the gateway's
    assert answer.status == status and answer.text is not None and json.loads(answer.text) == body
    reshaped = json.loads(reshape(json.dumps({"error": "why"}).encode(), status))  # mlx_lm's, reshaped
    assert reshaped == {"error": {"message": "why", "type": kind, "code": kind}}


def test_without_a_code_it_is_null() -> None:
    assert openai_error(503, "the model failed to load")["error"]["code"] is None


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ("null", "null"),
        ("true", "boolean"),
        ("5", "integer"),
        ("5.0", "number"),
        ('"x"', "string"),
        ("[]", "array"),
        ("{}", "object"),
    ],
)
def test_json_kinds_are_json_schemas_type_names(text: str, kind: str) -> None:
    assert json_kind(json.loads(text)) == kind
