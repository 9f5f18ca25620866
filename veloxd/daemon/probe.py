"""Network checks around a worker: is its port free before spawning, and does /health answer.

Ready means the READY line arrived AND `GET /health` returned 200 (mlx_lm's /health alone
answers before the model is loaded; the worker's answers once its generation thread lives).
"""

from __future__ import annotations

import errno
import http.client
import shutil
import socket
import subprocess
import threading
import time

import psutil

WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def probe_host(host: str) -> str:
    """Where to connect to reach a server bound to `host` (wildcards mean loopback)."""
    return WILDCARDS.get(host, host)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def port_in_use(host: str, port: int) -> bool:
    """True if something already listens on host:port (or the address cannot be bound).

    Two checks, because each misses a case: a connect finds a listener on a wildcard address
    (which macOS would let us bind next to), a bind finds one the connect cannot reach.
    Both tolerate TIME_WAIT leftovers of our own previous worker (SO_REUSEADDR, as servers use).
    """
    target = probe_host(host)
    with socket.socket(_family(target), socket.SOCK_STREAM) as conn:
        conn.settimeout(0.5)
        if conn.connect_ex((target, port)) == 0:
            return True
    with socket.socket(_family(host or "0.0.0.0"), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as err:
            return err.errno in (errno.EADDRINUSE, errno.EACCES)
    return False


def port_holder(port: int) -> str | None:
    """'python3 (pid 123)' for the process listening on `port`, when the OS will tell.

    psutil sees every socket on Linux; macOS refuses it a system-wide view without root, and
    there lsof (always installed) still names the holder when it is the user's own process.
    """
    return _holder_by_psutil(port) or _holder_by_lsof(port)


def _holder_by_psutil(port: int) -> str | None:
    try:
        connections = psutil.net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return None
    for conn in connections:
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            try:
                name = psutil.Process(conn.pid).name()
            except psutil.Error:
                name = "unknown"
            return f"{name} (pid {conn.pid})"
    return None


def _holder_by_lsof(port: int) -> str | None:
    lsof = shutil.which("lsof")
    if lsof is None:
        return None
    try:
        out = subprocess.run(
            [lsof, "-nP", f"-iTCP:{port}", "-sTCP:LISTEN", "-Fpc"],
            capture_output=True,
            text=True,
            timeout=3,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    pid = command = None
    for line in out.stdout.splitlines():
        if line.startswith("p") and pid is None:
            pid = line[1:]
        elif line.startswith("c") and command is None:
            command = line[1:]
    if pid is None:
        return None
    return f"{command or 'unknown'} (pid {pid})"


def health_ok(host: str, port: int, timeout: float = 1.0) -> bool:
    """One `GET /health`; True on HTTP 200."""
    return health_error(host, port, timeout) is None


def health_error(host: str, port: int, timeout: float) -> str | None:
    """One `GET /health`: None on HTTP 200, else what went wrong (a refused connection, a timeout, a status)."""
    conn = http.client.HTTPConnection(probe_host(host), port, timeout=timeout)
    try:
        conn.request("GET", "/health")
        response = conn.getresponse()
        response.read()
        return None if response.status == 200 else f"HTTP {response.status}"
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except (OSError, http.client.HTTPException) as err:
        return f"{type(err).__name__}: {err}"
    finally:
        conn.close()


def wait_healthy(host: str, port: int, deadline: float, cancel: threading.Event, interval: float = 0.1) -> bool:
    """Poll /health until 200 (True), `deadline` (monotonic) passes or `cancel` is set (False)."""
    while not cancel.is_set():
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        if health_ok(host, port, timeout=min(1.0, max(remaining, 0.05))):
            return True
        cancel.wait(min(interval, max(deadline - time.monotonic(), 0)))
    return False
