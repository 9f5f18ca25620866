"""A blocking side channel that lets follower ranks sleep while the group is idle.

mlx_lm keeps the ranks in lockstep by ending every poll of rank 0's request queue in an
`all_sum` (10 per second while idle). MLX's ring backend waits for a collective by spinning on
a non-blocking socket, so an idle follower rank burns a whole core. With the doorbell, rank 0
first sends each follower one byte per poll (1: a request follows, share it; 0: nothing) and
only enters the collective when there is something to share; followers block in `recv`.
Set up once after loading (`connect_group`), over TCP to rank 0's own ring address, each follower
proving itself with a token that went through an `all_sum` (a stranger cannot take a slot).
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import struct
import time
from collections.abc import Callable

ACCEPT_S = 60.0
WORDS = 3  # port, token high, token low (int32 each: they travel in an all_sum)


class Doorbell:
    """Rank 0 holds one socket per follower; a follower holds one socket to rank 0."""

    def __init__(self, sockets: list[socket.socket], leader: bool) -> None:
        self._sockets = sockets
        self.leader = leader

    def ring(self, busy: bool) -> None:
        """Rank 0: tell every follower whether this poll shares a request."""
        byte = b"\x01" if busy else b"\x00"
        for sock in self._sockets:
            sock.sendall(byte)

    def wait(self) -> bool:
        """A follower: block until rank 0 polls; True when a request is shared next."""
        data = self._sockets[0].recv(1)
        if not data:
            raise ConnectionError("rank 0 closed the doorbell (it stopped)")
        return data == b"\x01"

    def close(self) -> None:
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()


def connect_group(
    rank: int,
    size: int,
    leader_ip: str | None,
    exchange: Callable[[list[int]], list[int]],
    vote: Callable[[bool], bool],
) -> Doorbell | None:
    """Set up the doorbell on every rank at once (same calls in the same order on each).

    `exchange(words)` sums int32 words over the ranks (rank 0 contributes port and token);
    `vote(ok)` is True only if every rank says ok. None when any rank could not take part:
    then every rank falls back to mlx_lm's plain polling together.
    """
    listener = None
    words = [0] * WORDS
    if rank == 0 and leader_ip is not None:
        with contextlib.suppress(OSError):
            listener = socket.create_server((leader_ip, 0), family=_family(leader_ip), backlog=size)
            words = [listener.getsockname()[1], secrets.randbits(31), secrets.randbits(31)]
    port, *token = exchange(words)
    proof = struct.pack("!ii", *token)
    sockets: list[socket.socket] = []
    try:
        if port and leader_ip is not None:
            if listener is not None:
                sockets = _accept(listener, size - 1, proof)
            else:
                sock = socket.create_connection((leader_ip, port), timeout=ACCEPT_S)
                sock.sendall(proof)
                sock.settimeout(None)
                sockets = [sock]
    except OSError:
        sockets = []
    finally:
        if listener is not None:
            listener.close()
    for sock in sockets:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    bell = Doorbell(sockets, rank == 0)
    if vote(bool(port) and len(sockets) == (size - 1 if rank == 0 else 1)):
        return bell
    bell.close()
    return None


def _accept(listener: socket.socket, count: int, proof: bytes) -> list[socket.socket]:
    deadline = time.monotonic() + ACCEPT_S
    accepted: list[socket.socket] = []
    while len(accepted) < count:
        listener.settimeout(max(0.1, deadline - time.monotonic()))
        sock, _ = listener.accept()  # socket.timeout (an OSError) after the deadline
        sock.settimeout(5.0)
        try:
            ok = _read_exactly(sock, len(proof)) == proof
        except OSError:
            ok = False
        if ok:
            sock.settimeout(None)
            accepted.append(sock)
        else:
            sock.close()  # not one of ours
    return accepted


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _family(ip: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in ip else socket.AF_INET
