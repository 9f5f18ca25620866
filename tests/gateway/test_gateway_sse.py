"""The gateway's SSE reader and event throttle: pure, fed by hand, a fake clock."""

from __future__ import annotations

import json

from veloxd.gateway.limits import Throttle
from veloxd.gateway.sse import SseReader

USAGE = {"prompt_tokens": 5, "completion_tokens": 7}
STREAM = (
    b'data: {"choices": [{"text": "a"}]}\n\n'
    + b"data: "
    + json.dumps({"padding": "x" * 100, "choices": [], "usage": USAGE}).encode()
    + b"\r\n\r\n: keepalive\n\ndata: [DONE]\n\n"
)


def test_usage_and_done_are_found_however_the_stream_is_cut() -> None:
    for cut in range(1, len(STREAM)):
        for second in (cut, (cut + len(STREAM)) // 2):
            reader = SseReader()
            for piece in (STREAM[:cut], STREAM[cut:second], STREAM[second:]):
                reader.feed(piece)
            assert (reader.usage, reader.done) == (USAGE, True), (cut, second)


def test_byte_by_byte_and_without_done() -> None:
    reader = SseReader()
    for byte in STREAM[: STREAM.index(b"data: [DONE]")]:
        reader.feed(bytes([byte]))
    assert (reader.usage, reader.done) == (USAGE, False)


def test_malformed_and_oversized_lines_are_ignored() -> None:
    reader = SseReader()
    reader.feed(b'data: {"usage": \n\ndata: [1, 2] "usage"\n\n')
    reader.feed(b"data: " + b"y" * (2 << 20))  # no newline: not buffered without bound
    assert len(reader._partial) <= 1 << 20
    reader.feed(b'\ndata: {"usage": {"prompt_tokens": 1}}\n')
    assert reader.usage == {"prompt_tokens": 1} and not reader.done


def test_throttle_reports_the_first_at_once_then_sums_per_period() -> None:
    now = [100.0]
    throttle = Throttle(10.0, lambda: now[0])
    assert throttle.note() == 1
    assert [throttle.note() for _ in range(500)] == [None] * 500
    now[0] += 9.9
    assert throttle.note() is None
    now[0] += 0.1
    assert throttle.note() == 502
    now[0] += 10.0
    assert throttle.note(3) == 3
    assert throttle.total == 506
