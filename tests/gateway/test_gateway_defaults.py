"""A bound the daemon's view does not carry takes the `gateway:` block's declared default.

Before the first view (and in any view lacking a key) the gateway's settings are empty; each bound
is then the default declared in veloxd.config.gateway, not a cap of aiohttp's (2 GiB for a body).
The gateway's real application on a real socket; no daemon is needed to refuse a body.
"""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

from aiohttp import ClientSession
from aiohttp.test_utils import TestServer

from veloxd.config.gateway import Gateway
from veloxd.daemon.client import DaemonClient
from veloxd.gateway.app import build_app
from veloxd.gateway.fleet import Fleet


def test_a_body_just_over_the_default_limit_gets_413_when_the_view_has_no_setting(tmp_path: Path) -> None:
    limit = Gateway.max_body_bytes
    fleet = Fleet(DaemonClient(socket=tmp_path / "no-daemon"))  # no view yet: no settings at all
    assert fleet.settings == {}

    async def scenario() -> tuple[int, dict]:
        server = TestServer(build_app(fleet, host="127.0.0.1", port=0), host="127.0.0.1")
        await server.start_server()
        try:
            async with ClientSession() as session:
                # Valid JSON naming a model: read in full (2 GiB cap), it would get 404 model_not_found.
                head, tail = b'{"model": "m", "pad": "', b'"}'
                body = head + b"x" * (limit + 1 - len(head) - len(tail)) + tail
                assert len(body) == limit + 1
                async with session.post(server.make_url("/v1/completions"), data=io.BytesIO(body)) as answer:
                    return answer.status, await answer.json()
        finally:
            await server.close()

    status, answer = asyncio.run(scenario())
    assert status == 413, answer
    error = answer["error"]
    assert error["code"] == "request_too_large" and error["type"] == "invalid_request_error"
    assert error["message"] == f"request body larger than gateway.max_body_bytes ({limit} bytes)"


def test_the_start_timeout_without_a_setting_is_the_declared_default(tmp_path: Path) -> None:
    fleet = Fleet(DaemonClient(socket=tmp_path / "no-daemon"))
    assert fleet.start_timeout_s() == Gateway.start_timeout_s
    fleet.view = {"servers": {}, "gateway": {"start_timeout_s": 7.5}, "budget": None}
    assert fleet.start_timeout_s() == 7.5
