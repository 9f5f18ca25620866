"""The gateway's view as a long poll: a request names the view it holds and is answered when the
daemon's differs, or when its wait ends.

Runs on the daemon's loop thread only. A view is named by its etag (a hash of its content: a
daemon that restarted cannot hand out an old name for a new view). `ask` answers at once when the
asker's view is not the current one (or it does not wait), else holds the reply; `settle`, called
once per loop turn, recomputes the view only while replies are held and answers those whose view
changed or whose deadline passed, and drops those whose client went (the control thread marks
them). Bounded: at most `cap` replies are held, each for at most MAX_WAIT_S; past the cap a
request that would wait is refused (an error naming the cap: its client asks again later).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from veloxd.daemon.messages import Reply

MAX_HELD = 32  # the gateway holds one; the rest is room for dashboards and tools
MAX_WAIT_S = 25.0  # how long one request may hold a control thread and its connection


@dataclass(frozen=True)
class Held:
    reply: Reply
    known: str
    deadline: float  # monotonic seconds


class ViewWaits:
    """The current view, its etag, and the replies waiting for it to change."""

    def __init__(self, compute: Callable[[], dict[str, Any]], cap: int = MAX_HELD) -> None:
        self._compute = compute
        self._cap = cap
        self._view: dict[str, Any] | None = None
        self._etag = ""
        self._held: list[Held] = []
        self.answered = 0  # answers sent since the daemon started (the gateway's round trips)

    @property
    def held(self) -> int:
        return len(self._held)

    def current(self) -> tuple[str, dict[str, Any]]:
        """The view now and its etag (hashed again only when the view differs from the last one)."""
        view = self._compute()
        if view != self._view:
            self._view = view
            text = json.dumps(view, sort_keys=True, default=str)
            self._etag = hashlib.sha256(text.encode()).hexdigest()[:16]
        return self._etag, view

    def ask(self, reply: Reply, known: str | None, wait_s: float, now: float) -> None:
        etag, view = self.current()
        if known != etag or wait_s <= 0:
            self._answer(reply, etag, view)
        elif len(self._held) >= self._cap:
            reply.send({"ok": False, "error": f"gateway_view: {self._cap} requests wait already; ask again later"})
        else:
            self._held.append(Held(reply, known, now + min(wait_s, MAX_WAIT_S)))

    def settle(self, now: float) -> None:
        """Answer the held replies whose view changed or whose wait ended; drop those nobody reads."""
        self._held = [h for h in self._held if not h.reply.abandoned]
        if not self._held:
            return  # nobody waits: the view is not computed
        etag, view = self.current()
        due = [h for h in self._held if h.known != etag or now >= h.deadline]
        self._held = [h for h in self._held if h not in due]
        for held in due:
            self._answer(held.reply, etag, view)

    def next_deadline(self) -> float | None:
        """When the loop must wake to answer a held reply whose view did not change."""
        return min((h.deadline for h in self._held), default=None)

    def _answer(self, reply: Reply, etag: str, view: dict[str, Any]) -> None:
        self.answered += 1
        reply.send({"ok": True, "etag": etag, **view, "long_poll": {"answered": self.answered, "held": self.held}})
