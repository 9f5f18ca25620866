"""How `veloxd reload`, `restart NAME` and `status` reach the running daemon: a unix socket.

The socket lives in the state directory (mode 0600, directory 0700: only the user can talk
to the daemon). When that path is too long for a unix socket, it lives in a fresh 0700
directory of our own with an unpredictable name (mkdtemp), recorded in the state file: no
other user can create or hold that name first. One JSON line in, one JSON line out. The accepting thread only enqueues a
request and waits for the loop thread's answer; it never touches the daemon's state. A request
may wait for its answer (`gateway_view` with `wait_s`: veloxd/daemon/longpoll.py); when its client
closes the connection meanwhile, the thread marks the reply abandoned and the loop drops it.
A request read after its client gave up (it waited in the listen backlog while the daemon was busy
or stopped) is dropped before it reaches the loop: `request_at` sends an absolute `expires_at` (wall
clock, same machine), and a request past it, or whose client already closed its end, is logged as
`control_request_dropped` and never carried out (a request without `expires_at` is served).
The async client of this socket is veloxd/daemon/client.py; `request` below is the CLI's.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import select
import shutil
import socket
import stat
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from veloxd.daemon import messages as m
from veloxd.daemon.logs import RECENT, get_logger
from veloxd.daemon.longpoll import MAX_WAIT_S
from veloxd.daemon.statefile import StartupError, read_state

SOCKET_NAME = "control.sock"
PRIVATE_PREFIX = "veloxd-"
MAX_UNIX_PATH = 100  # sun_path is 104 bytes on macOS, 108 on Linux
REQUEST_TIMEOUT_S = 30.0
MAX_ANSWER_BYTES = 64 << 20  # a status or an events page; requests themselves stay under 64 KiB
CLIENT_CHECK_S = 1.0  # while an answer waits: how often to look whether its client is still there
ANSWER_CHECK_S = 2.0  # connecting to a socket to learn whether a daemon listens there
_log = get_logger("veloxd.daemon")


class DaemonUnreachable(RuntimeError):
    """No daemon answers on the control socket."""


def socket_path(state_dir: Path) -> Path | None:
    """`<state_dir>/control.sock`, or None when that path is too long for a unix socket."""
    path = Path(state_dir).resolve() / SOCKET_NAME
    return path if len(os.fsencode(path)) < MAX_UNIX_PATH else None


def private_socket_path() -> Path:
    """A socket path in a new 0700 directory with a random name (the state dir's is too long)."""
    return Path(tempfile.mkdtemp(prefix=f"{PRIVATE_PREFIX}{os.getuid()}-")) / SOCKET_NAME


def remove_private_dir(path: Path) -> None:
    """Remove a private socket directory of an earlier daemon (only ours: our prefix, our uid)."""
    parent = path.parent
    if not parent.name.startswith(f"{PRIVATE_PREFIX}{os.getuid()}-") or parent.parent != Path(tempfile.gettempdir()):
        return
    with contextlib.suppress(OSError):
        if parent.lstat().st_uid == os.getuid():
            shutil.rmtree(parent)


def _to_message(request: dict[str, Any], reply: m.Reply) -> m.Message | str | None:
    """The loop's message for `request`; a string says what is wrong with it; None: unknown."""
    command = request.get("command")
    expires_at = request.get("expires_at")
    if expires_at is not None and (not isinstance(expires_at, (int, float)) or isinstance(expires_at, bool)):
        return "expires_at is a time in seconds since the epoch (a number)"
    if command == "reload":
        return m.ReloadRequested(source="control", reply=reply)
    if command == "restart" and isinstance(request.get("name"), str):
        return m.RestartRequested(name=request["name"], reply=reply)
    if command == "status":
        return m.StatusRequested(reply=reply)
    if command == "gateway_view":
        known, wait_s = request.get("known"), request.get("wait_s", 0)
        if not (known is None or isinstance(known, str)) or not _seconds(wait_s):
            return f"gateway_view: known is the etag of a view (a string), wait_s seconds from 0 to {MAX_WAIT_S:g}"
        return m.GatewayViewRequested(reply=reply, known=known, wait_s=float(wait_s))
    name = request.get("name")
    if command == "start" and isinstance(name, str):
        unload = request.get("unload") or []
        if isinstance(unload, list) and all(isinstance(n, str) for n in unload):
            return m.StartRequested(name=name, unload=tuple(unload), reply=reply)
    if command == "unload" and isinstance(name, str) and request.get("reason") in ("idle", "admission", "manual"):
        return m.UnloadRequested(name=name, reason=request["reason"], reply=reply)
    return None


def _seconds(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= MAX_WAIT_S


class ControlServer:
    """Accepts requests on the unix socket and hands them to the loop as messages."""

    def __init__(self, state_dir: Path, inbox: queue.SimpleQueue[Any]) -> None:
        """Bind the socket; StartupError naming the path and what to do when that is impossible."""
        preferred = socket_path(state_dir)
        self.private = preferred is None
        self.path = preferred or private_socket_path()
        self._inbox = inbox
        _clear_stale(self.path)
        self._sock = _listen(self.path)
        self._bound = _identity(self.path)  # (device, inode) of our socket file: never remove another's
        self._thread = threading.Thread(target=self._accept, args=(self._sock,), name="control", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def rebind(self) -> bool:
        """Listen again at `path` when its file vanished (its directory was removed while we ran), so
        the CLI and a second daemon find us there; True if it did. Nothing when something else holds
        the path (another daemon's socket). StartupError naming the path when binding fails."""
        if os.path.lexists(self.path):
            return False
        if self.private:
            _private_parent(self.path.parent)
        sock = _listen(self.path)
        old, self._sock, self._bound = self._sock, sock, _identity(self.path)
        _shut(old)  # its accept thread returns; nobody can reach it any more
        self._thread = threading.Thread(target=self._accept, args=(sock,), name="control", daemon=True)
        self._thread.start()
        return True

    def close(self) -> None:
        _shut(self._sock)
        with contextlib.suppress(OSError):
            if _identity(self.path) == self._bound:
                self.path.unlink()
        if self.private:
            remove_private_dir(self.path)

    def _accept(self, sock: socket.socket) -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return  # closed: the daemon is stopping, or listens on a new socket
            threading.Thread(target=self._serve, args=(conn,), name="control-conn", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(5)
            try:
                request = json.loads(_read_line(conn))
            except (OSError, ValueError):
                return
            reply = m.Reply()
            message = _to_message(request, reply) if isinstance(request, dict) else None
            answer: dict[str, Any] | None
            if isinstance(request, dict) and request.get("command") == "events":
                answer = _events(request)  # the log ring has its own lock: no trip through the loop
            elif message is None:
                answer = {"ok": False, "error": f"unknown request: {request!r}"}
            elif isinstance(message, str):
                answer = {"ok": False, "error": message}
            elif (dropped := _dropped(conn, request)) is not None:
                _log.warning("control_request_dropped", command=request.get("command"), reason=dropped)
                if dropped == "client_gone":
                    return
                answer = {"ok": False, "error": "the request expired before the daemon read it; nothing was done"}
            else:
                self._inbox.put(message)
                waits = message.wait_s if isinstance(message, m.GatewayViewRequested) else 0.0
                answer = _await_answer(conn, reply, waits + REQUEST_TIMEOUT_S)
                if answer is None and reply.abandoned:
                    return  # its client went: nobody to answer
            answer = answer or {"ok": False, "error": "the daemon did not answer in time"}
            with contextlib.suppress(OSError):
                conn.sendall(json.dumps(answer, default=str).encode() + b"\n")


def _dropped(conn: socket.socket, request: dict[str, Any]) -> str | None:
    """Why a request read from the backlog must not be carried out: "expired" (past its client's
    `expires_at`) or "client_gone" (its client closed its end: it timed out, or was interrupted)."""
    expires_at = request.get("expires_at")
    if expires_at is not None and time.time() >= expires_at:
        return "expired"
    return "client_gone" if _client_gone(conn) else None


def _await_answer(conn: socket.socket, reply: m.Reply, timeout: float) -> dict[str, Any] | None:
    """The loop's answer within `timeout`; None if none came, or if the client closed the connection
    meanwhile (the reply is then marked abandoned: the loop drops it instead of answering)."""
    deadline = time.monotonic() + timeout
    while (remaining := deadline - time.monotonic()) > 0:
        answer = reply.wait(min(CLIENT_CHECK_S, remaining))
        if answer is not None:
            return answer
        if _client_gone(conn):
            reply.abandon()
            return None
    return None


def _client_gone(conn: socket.socket) -> bool:
    """The client closed (or reset) its end: readable with nothing to read (a client sends its one
    line, then only reads). poll, not select: a descriptor above FD_SETSIZE is no error to it."""
    poller = select.poll()
    poller.register(conn, select.POLLIN)
    if not poller.poll(0):
        return False
    try:
        return not conn.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return False
    except OSError:
        return True


def _events(request: dict[str, Any]) -> dict[str, Any]:
    """`{"command": "events", "after": N, "limit": L, "server": NAME}`: recent log events numbered above N."""
    after, limit, server = request.get("after", 0), request.get("limit", 500), request.get("server")
    if not isinstance(after, int) or not isinstance(limit, int) or not (server is None or isinstance(server, str)):
        return {"ok": False, "error": "events: after and limit are integers, server a name"}
    return {"ok": True, **RECENT.since(after, limit, server)}


def _clear_stale(path: Path) -> None:
    """Remove a dead daemon's socket (the state-dir lock is ours); refuse anything else in the way,
    and a socket a live daemon still listens on (its lock file was removed: the lock says nothing)."""
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    except OSError as err:
        raise StartupError(f"cannot use {path} for the control socket: {err.strerror or err}") from None
    if not stat.S_ISSOCK(mode):
        kind = "a directory" if stat.S_ISDIR(mode) else "a symlink" if stat.S_ISLNK(mode) else "a file"
        raise StartupError(
            f"cannot create the control socket {path}: {kind} is in the way; "
            "remove it (it is not veloxd's), or use another --state-dir"
        )
    live, pid = answering(path)
    if live:
        who = f"another veloxd daemon (pid {pid})" if pid is not None else "another veloxd daemon"
        raise StartupError(
            f"{who} still listens on the control socket {path} (its lock file was removed); stop it first, "
            "or use another --state-dir"
        )
    try:
        path.unlink()
    except OSError as err:
        raise StartupError(f"cannot remove the old control socket {path}: {err.strerror or err}") from None


def _listen(path: Path) -> socket.socket:
    """A unix socket listening at `path`, its file 0600; StartupError naming the path on failure."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old_umask = os.umask(0o177)  # the socket file is created 0600
    try:
        sock.bind(str(path))
        sock.listen(8)
    except OSError as err:
        sock.close()
        raise StartupError(
            f"cannot create the control socket {path}: {err.strerror or err}; "
            "check that directory's permissions, or use another --state-dir"
        ) from None
    finally:
        os.umask(old_umask)
    return sock


def _shut(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked in accept()
    sock.close()


def _identity(path: Path) -> tuple[int, int] | None:
    try:
        info = path.lstat()
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _private_parent(parent: Path) -> None:
    """Make the vanished private socket directory again, exclusively: a directory of that name that
    somebody else made first (it is under the shared temp dir) is refused, never used."""
    try:
        parent.mkdir(mode=0o700)
        return
    except FileExistsError:
        pass
    except OSError as err:
        raise StartupError(f"cannot create {parent} for the control socket: {err.strerror or err}") from None
    info = parent.lstat()
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise StartupError(f"cannot use {parent} for the control socket: it is not a private directory of ours")


def answering(path: Path) -> tuple[bool, int | None]:
    """Whether a process listens on the unix socket at `path` (a connection is accepted or queued: a
    busy or stopped daemon counts), and that process's pid where the OS names it."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(ANSWER_CHECK_S)
        try:
            sock.connect(str(path))
        except (TimeoutError, BlockingIOError):
            return True, None  # listening, its backlog full
        except OSError:
            return False, None  # nothing there, or nobody listening (a dead daemon's socket)
        return True, _peer_pid(sock)


def _peer_pid(sock: socket.socket) -> int | None:
    """The pid of the process listening at the other end of a connected unix socket (Linux:
    SO_PEERCRED; macOS: LOCAL_PEERPID), or None where the OS does not say."""
    try:
        if hasattr(socket, "SO_PEERCRED"):
            creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            pid = struct.unpack("3i", creds)[0]
        elif sys.platform == "darwin":
            pid = struct.unpack("i", sock.getsockopt(0, 2, 4))[0]  # SOL_LOCAL, LOCAL_PEERPID
        else:
            return None
    except OSError:
        return None
    return pid if pid > 0 else None


def _read_line(conn: socket.socket, limit: int = 65536) -> bytes:
    data = bytearray()
    while not data.endswith(b"\n") and len(data) < limit:
        chunk = conn.recv(65536)
        if not chunk:
            break
        data += chunk
    return bytes(data)


def request(state_dir: Path, payload: dict[str, Any], timeout: float = REQUEST_TIMEOUT_S + 5) -> dict[str, Any]:
    """Send one request to the daemon owning `state_dir` and return its answer.

    Raises DaemonUnreachable when no daemon listens there.
    """
    path = socket_path_of(state_dir)
    if path is None:
        raise DaemonUnreachable(f"no veloxd daemon found: {state_dir} has no state file naming its control socket")
    return request_at(path, payload, timeout)


def socket_path_of(state_dir: Path) -> Path | None:
    """The control socket the daemon of `state_dir` recorded in its state file (else the default place;
    None when that is too long for a socket and no state file names the private one)."""
    state = read_state(state_dir) or {}
    recorded = (state.get("daemon") or {}).get("control_socket")
    return Path(recorded) if recorded else socket_path(state_dir)


def request_at(path: Path, payload: dict[str, Any], timeout: float = REQUEST_TIMEOUT_S + 5) -> dict[str, Any]:
    """Send one request to the control socket at `path` and return the answer.

    The request carries `expires_at` (now + timeout, wall clock): a daemon that reads it only after
    this client gave up drops it instead of carrying it out. Raises DaemonUnreachable when no
    daemon listens there.
    """
    payload = {**payload, "expires_at": time.time() + timeout}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
        except OSError as err:
            raise DaemonUnreachable(f"no veloxd daemon is listening on {path} ({err.strerror or err})") from None
        try:
            sock.sendall(json.dumps(payload).encode() + b"\n")
            line = _read_line(sock, MAX_ANSWER_BYTES)
        except OSError as err:
            raise DaemonUnreachable(f"the daemon on {path} did not answer ({err})") from None
    if not line:
        raise DaemonUnreachable(f"the daemon closed {path} without answering")
    return json.loads(line)
