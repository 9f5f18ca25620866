"""A stand-in rank for the launcher tests: no model, but the real worker's stop and lifeline code.

fake_rank.py RANK CODE DIR: rank RANK waits until every other rank said "waiting" (a file per
rank in DIR), writes one line in two pieces, then exits with CODE; every other rank says
"waiting" and runs until SIGTERM or EOF on stdin (`--lifeline-fd 0`).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

from veloxd.serve.lifeline import Stopper, start_watch

rank, (leaving, code), marks = int(os.environ["MLX_RANK"]), map(int, sys.argv[1:3]), Path(sys.argv[3])
print(f"pid {os.getpid()}", flush=True)
if rank == leaving:
    while len(list(marks.iterdir())) < 1:  # the one other rank of the tests' pair
        time.sleep(0.05)
    sys.stdout.write("hello ")
    sys.stdout.flush()
    time.sleep(0.3)
    sys.stdout.write("world\n")
    sys.stdout.flush()
    sys.exit(code)
stopper = Stopper()
signal.signal(signal.SIGTERM, lambda *_: stopper.stop(0))
start_watch(0, stopper)
print("waiting", flush=True)
(marks / str(rank)).touch()
stopper.stopped.wait()
os._exit(stopper.code or 0)
