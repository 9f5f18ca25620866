"""Loopback ports for tests and benchmarks that no other test process can be handed at once.

Binding port 0 and releasing it (the usual trick) races: under pytest-xdist another worker, or
an outgoing connection, can take the port before the server under test binds it. Here a port is
claimed with an exclusive `flock` on a per-port file, held until the claiming process exits (the
kernel drops the lock when it dies, so stale files claim nothing), and only ports that bind are
handed out. The range lies below every OS's ephemeral range (Linux 32768+, macOS 49152+), so
outgoing connections never take one, and below the daemon's own assigned ports (28100-28999).
"""

from __future__ import annotations

import fcntl
import os
import random
import socket
import tempfile
from pathlib import Path

PORT_RANGE = range(20000, 28000)
_claimed: dict[int, int] = {}  # port -> the open descriptor holding its lock (kept for the process lifetime)


def _lock_dir() -> Path:
    path = Path(tempfile.gettempdir()) / "veloxd-test-ports"
    path.mkdir(exist_ok=True)
    return path


def _bindable(port: int) -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers under test bind
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _claim(port: int) -> bool:
    fd = os.open(_lock_dir() / f"{port}.lock", os.O_CREAT | os.O_RDWR, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return False
    _claimed[port] = fd
    return True


def free_port() -> int:
    """A loopback TCP port that binds now and that no other caller of this function is given."""
    start = random.randrange(len(PORT_RANGE))
    for i in range(len(PORT_RANGE)):
        port = PORT_RANGE[(start + i) % len(PORT_RANGE)]
        # A claimed port that does not bind is taken by something outside the tests: the claim
        # stays, so it is not tried again.
        if port not in _claimed and _claim(port) and _bindable(port):
            return port
    raise RuntimeError(f"no free loopback port left in {PORT_RANGE.start}-{PORT_RANGE.stop - 1}")


def consecutive_ports(count: int) -> int:
    """The first of `count` consecutive claimed, bindable ports (MLX's ring: rank r listens on base + r)."""
    for _ in range(len(PORT_RANGE)):
        base = free_port()
        rest = range(base + 1, base + count)
        if all(port in PORT_RANGE and port not in _claimed and _claim(port) and _bindable(port) for port in rest):
            return base
    raise RuntimeError(f"no {count} consecutive free loopback ports left in {PORT_RANGE.start}-{PORT_RANGE.stop - 1}")
