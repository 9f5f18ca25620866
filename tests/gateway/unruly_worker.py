"""The stand-in worker (tests/fixtures/fake_worker.py) with misbehaviour chosen by a request's prompt,
for the gateway's failure paths. Every completion request is logged, one line `<pid> <prompt>`, to
the file UNRULY_LOG names (in the entry's env), before the worker acts on it:
  "die"       the first one ever (over every process of this entry) kills the worker (SIGKILL) without
              a byte of answer, as a worker dying mid-generation; later ones are answered normally
  "garbage"   answered with a line that is not HTTP, then the connection is closed
  "endless"   streamed (with "stream": true) without end, ENDLESS_CHUNK_BYTES a chunk, until a write
              fails; then `<pid> stopped` is logged: the worker stopped generating
  "big"       answered, not streamed, with BIG_ANSWER_BYTES of JSON
Any other prompt gets the stand-in's usual answer.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
from pathlib import Path

# Run as a script (the daemon's worker command): the repository root is not on sys.path by itself.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tests.fixtures import fake_worker

ENDLESS_CHUNK_BYTES = 16_384
BIG_ANSWER_BYTES = 8_000_000  # far more than loopback's socket buffers hold


def log(line: str) -> None:
    with open(os.environ["UNRULY_LOG"], "a") as out:
        out.write(f"{os.getpid()} {line}\n")


def logged() -> list[str]:
    path = Path(os.environ["UNRULY_LOG"])
    return path.read_text().splitlines() if path.exists() else []


def endless(handler: fake_worker.Health) -> None:
    handler.send_response(200)
    handler.send_header("Content-Type", "text/event-stream")
    handler.end_headers()
    event = {"id": "cmpl-endless", "choices": [{"index": 0, "text": "x" * ENDLESS_CHUNK_BYTES}]}
    chunk = b"data: " + json.dumps(event).encode() + b"\n\n"
    try:
        while True:
            handler.wfile.write(chunk)
            handler.wfile.flush()
    except OSError:  # the gateway closed the connection
        log("stopped")


def big(handler: fake_worker.Health) -> None:
    body = json.dumps({"id": "cmpl-big", "choices": [{"index": 0, "text": "x" * BIG_ANSWER_BYTES}]}).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    try:
        handler.wfile.write(body)
    except OSError:
        log("big not sent")


def do_post(self: fake_worker.Health) -> None:
    length = int(self.headers.get("Content-Length", "0"))
    raw = self.rfile.read(length)
    prompt = str(json.loads(raw or b"{}").get("prompt", ""))
    earlier = [line.split(" ", 1)[1] for line in logged()]
    log(prompt)
    if prompt == "die" and "die" not in earlier:
        os.kill(os.getpid(), signal.SIGKILL)
    elif prompt == "garbage":
        self.wfile.write(b"this is not HTTP\r\n\r\n")
        self.close_connection = True
    elif prompt == "endless":
        endless(self)
    elif prompt == "big":
        big(self)
    else:
        self.rfile = io.BytesIO(raw)  # the body again, for the stand-in's own do_POST
        plain_post(self)


plain_post = fake_worker.Health.do_POST

if __name__ == "__main__":
    fake_worker.Health.do_POST = do_post  # type: ignore[method-assign]  # deliberately, in this process only
    raise SystemExit(fake_worker.main())
