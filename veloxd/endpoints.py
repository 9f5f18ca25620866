"""Addresses and ports on this machine: where to connect to reach a server bound to a host (a
wildcard bind is reached on loopback), whether a port is taken, and by which process.

Shared by the config's world checks, the daemon, the gateway and the dashboard (one mapping of
wildcards, one port test).
"""

from __future__ import annotations

import errno
import shutil
import socket
import subprocess

import psutil

WILDCARDS = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}


def connect_host(host: str) -> str:
    """Where to connect to reach a server bound to `host` (wildcards mean loopback)."""
    return WILDCARDS.get(host, host)


def cannot_listen_on(host: str) -> str | None:
    """Why this machine cannot listen on `host` at all, None when it can: a name that does not
    resolve, or an address that is not one of this machine's. Both can clear (a network coming
    up, DHCP, mDNS), so callers treat them as conditions of the world, not as errors of the file."""
    try:
        family, _, _, _, address = socket.getaddrinfo(
            host or None, 0, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except (socket.gaierror, UnicodeError) as err:
        return f"host {host} does not resolve ({getattr(err, 'strerror', None) or err})"
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(address)  # port 0: any free port, so only the address is tested
        except OSError as err:
            if err.errno == errno.EADDRNOTAVAIL:
                named = host if address[0] == host else f"{host} ({address[0]})"
                return f"host {named} is not an address of this machine"
            if err.errno not in (errno.EADDRINUSE, errno.EACCES):
                return f"host {host}: cannot listen there ({err.strerror})"
    return None


def _resolved(host: str, port: int, flags: int = 0) -> tuple[socket.AddressFamily, tuple] | None:
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=flags)[0]
    except (socket.gaierror, UnicodeError):
        return None
    return family, address


def port_in_use(host: str, port: int) -> bool:
    """True if something already listens on host:port (or the port cannot be bound there).

    Two checks, because each misses a case: a connect finds a listener on a wildcard address
    (which macOS would let us bind next to), a bind finds one the connect cannot reach.
    Both tolerate TIME_WAIT leftovers of our own previous worker (SO_REUSEADDR, as servers use).
    A host this machine cannot listen on is not a port in use: cannot_listen_on says what it is.
    """
    if cannot_listen_on(host) is not None:
        return False
    target = _resolved(connect_host(host), port)
    listen = _resolved(host or "0.0.0.0", port, socket.AI_PASSIVE)
    if target is None or listen is None:  # it stopped resolving since cannot_listen_on looked
        return False
    with socket.socket(target[0], socket.SOCK_STREAM) as conn:
        conn.settimeout(0.5)
        if conn.connect_ex(target[1]) == 0:
            return True
    with socket.socket(listen[0], socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(listen[1])
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
