"""Does a worker's /health answer (port checks: veloxd.endpoints).

Ready means the READY line arrived AND `GET /health` returned 200 (mlx_lm's /health alone
answers before the model is loaded; the worker's answers once its generation thread lives).
"""

from __future__ import annotations

import http.client
import threading
import time

from veloxd.endpoints import connect_host


def health_ok(host: str, port: int, timeout: float = 1.0) -> bool:
    """One `GET /health`; True on HTTP 200."""
    return health_error(host, port, timeout) is None


def health_error(host: str, port: int, timeout: float) -> str | None:
    """One `GET /health`: None on HTTP 200, else what went wrong (a refused connection, a timeout, a status)."""
    conn = http.client.HTTPConnection(connect_host(host), port, timeout=timeout)
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
