"""The stand-in worker (tests/fixtures/fake_worker.py) whose streams, with SPLIT_USAGE=1 in its env,
send the `usage` event in two writes, split inside the word "usage", far more than 64 bytes into
the event, and `data: [DONE]` in a third: the gateway must still count the tokens."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

# Run as a script (the daemon's worker command): the repository root is not on sys.path by itself.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.fixtures import fake_worker

PROMPT_TOKENS, COMPLETION_TOKENS = 17, 29
PAUSE_S = 0.2  # between the pieces, so that they arrive in separate reads


def split_stream(self: fake_worker.Health) -> None:
    length = int(self.headers.get("Content-Length", "0"))
    body = json.loads(self.rfile.read(length) or b"{}")
    self.send_response(200)
    self.send_header("Content-Type", "text/event-stream")
    self.end_headers()
    chunk = {"id": "cmpl-split", "model": body.get("model"), "choices": [{"index": 0, "text": "hi"}]}
    self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
    usage = {"prompt_tokens": PROMPT_TOKENS, "completion_tokens": COMPLETION_TOKENS, "total_tokens": 46}
    event = b"data: " + json.dumps({"id": "cmpl-split", "padding": "p" * 120, "choices": [], "usage": usage}).encode()
    cut = event.index(b'"usage"') + 4  # inside the word
    for piece in (event[:cut], event[cut:] + b"\n\n", b"data: [DONE]\n\n"):
        self.wfile.write(piece)
        self.wfile.flush()
        time.sleep(PAUSE_S)


if __name__ == "__main__":
    if os.environ.get("SPLIT_USAGE"):
        plain_post = fake_worker.Health.do_POST

        def do_post(self: fake_worker.Health) -> None:
            if self.path in ("/v1/completions", "/v1/chat/completions"):
                split_stream(self)
            else:
                plain_post(self)

        fake_worker.Health.do_POST = do_post  # type: ignore[method-assign]  # deliberately, in this process only
    raise SystemExit(fake_worker.main())
