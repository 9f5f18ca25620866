"""A 2-rank tensor-parallel group on loopback (ring backend) against the single-process server.

Same model, same method, same greedy requests: the group must answer exactly as one process does
(each rank computes half of every layer's heads, mlx_lm sums the halves), and each rank's
measured KV bytes must be about half of the single process's (it holds half the KV heads).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.distributed.support import ASSET_MODEL, Group
from tests.support import Worker, free_port

PROMPTS = [
    "The history of the house begins with",
    "Write a short story about a lighthouse keeper who finds a message in a bottle. The message says that "
    "the keeper must leave the island before the winter storms arrive, but the keeper has never",
]
CASES = {
    "fp16": ["--method", "fp16"],
    "affine-4bit": ["--method", "affine", "--bits", "4"],
    "snapkv-evicting": ["--method", "snapkv", "--set", "snapkv_budget=16", "--set", "snapkv_window=8"],
}


def completions(base_url: str, model: str) -> list[str]:
    from openai import OpenAI

    client = OpenAI(base_url=base_url, api_key="unused", timeout=120, max_retries=0)
    return [
        client.completions.create(model=model, prompt=p, max_tokens=24, temperature=0).choices[0].text for p in PROMPTS
    ]


# Known regression from the kv reorganisation (blockwise attention), open in the issue tracker: the
# sharded affine output drifts from one process after a few tokens. strict: a fix makes this test
# fail until the mark is removed.
KNOWN_REGRESSIONS = {
    "affine-4bit": "sharded affine-4 greedy output differs from one process since the blockwise kv attention",
}


@pytest.mark.slow
@pytest.mark.parametrize(
    "case",
    [
        pytest.param(c, marks=pytest.mark.xfail(reason=KNOWN_REGRESSIONS[c], strict=True))
        if c in KNOWN_REGRESSIONS
        else c
        for c in CASES
    ],
)
def test_group_answers_like_one_process_with_half_the_kv_per_rank(case: str) -> None:
    args = [*CASES[case], "--model", str(ASSET_MODEL)]
    single = Worker(*args, "--port", str(port := free_port()))
    try:
        alone = single.ready(timeout=240)
        expected = completions(f"http://127.0.0.1:{port}/v1", alone["model"])
    finally:
        single.stop()
    group = Group(*args, "--port", str(port := free_port()))
    try:
        ready = group.ready()
        got = completions(ready["endpoints"]["openai_base_url"], ready["model"])
        assert got == expected
        assert all(text.strip() for text in got)
        ranks = ready["distributed"]["ranks"]
        assert [r["rank"] for r in ranks] == [0, 1] and ranks[0]["pid"] == ready["pid"] != ranks[1]["pid"]
        for rank in ranks:
            for kind in ("method", "fp16"):
                half = alone["kv_bytes_per_token"][kind] / 2
                assert abs(rank["kv_bytes_per_token"][kind] - half) <= 0.05 * half, (kind, rank, alone)
            assert rank["layer_caches"] == sum(alone["layer_caches"].values())
        assert ready["kv_bytes_per_token"]["ratio"] == pytest.approx(alone["kv_bytes_per_token"]["ratio"], rel=0.05)
        assert ready["distributed"]["idle"] == "doorbell"
    finally:
        assert group.stop() == 0


@pytest.mark.slow
def test_group_streams_chat_and_batches_concurrent_requests_in_lockstep() -> None:
    """Streaming chat through the openai client, then three requests at once (one batch on every
    rank); afterwards the group still answers a greedy request as before."""
    from openai import OpenAI

    group = Group("--method", "kivi", "--bits", "4", "--model", str(ASSET_MODEL), "--port", str(free_port()))
    try:
        ready = group.ready()
        client = OpenAI(base_url=ready["endpoints"]["openai_base_url"], api_key="unused", timeout=120, max_retries=0)
        first = client.completions.create(model=ready["model"], prompt=PROMPTS[0], max_tokens=16, temperature=0)
        stream = client.chat.completions.create(
            model=ready["model"],
            max_tokens=16,
            stream=True,
            messages=[{"role": "user", "content": "Tell me about rivers."}],
        )
        pieces = [chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices]
        assert "".join(pieces).strip()
        answers: dict[int, str] = {}

        def ask(i: int) -> None:
            answer = client.completions.create(model=ready["model"], prompt=f"{PROMPTS[1]} {i}", max_tokens=12)
            answers[i] = answer.choices[0].text

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(180)
        assert sorted(answers) == [0, 1, 2] and all(a.strip() for a in answers.values())
        again = client.completions.create(model=ready["model"], prompt=PROMPTS[0], max_tokens=16, temperature=0)
        assert again.choices[0].text == first.choices[0].text
    finally:
        assert group.stop() == 0


@pytest.fixture(scope="module")
def pipeline_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from testkit.tinypipeline import write_tiny_pipeline_model

    return write_tiny_pipeline_model(tmp_path_factory.mktemp("models") / "tiny-qwen2")


@pytest.mark.slow
def test_pipeline_group_answers_like_one_process_with_half_the_layers_per_rank(pipeline_model: Path) -> None:
    """Pipeline parallelism (fp16: see docs/distributed.md): each rank holds 2 of the 4 layers and their KV."""
    args = ["--method", "fp16", "--model", str(pipeline_model)]
    single = Worker(*args, "--port", str(port := free_port()))
    try:
        alone = single.ready(timeout=240)
        expected = completions(f"http://127.0.0.1:{port}/v1", alone["model"])
    finally:
        single.stop()
    group = Group(*args, "--port", str(free_port()), parallelism="pipeline")
    try:
        ready = group.ready()
        assert completions(ready["endpoints"]["openai_base_url"], ready["model"]) == expected
        for rank in ready["distributed"]["ranks"]:
            assert rank["layer_caches"] == 2
            half = alone["kv_bytes_per_token"]["fp16"] / 2
            assert abs(rank["kv_bytes_per_token"]["fp16"] - half) <= 0.05 * half, (rank, alone)
    finally:
        assert group.stop() == 0
