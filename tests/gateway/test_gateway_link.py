"""The gateway's line to its daemon: the view as a long poll, and the one async client.

The held-reply book (veloxd/daemon/longpoll.py) with a fake clock and real Reply slots; then a
real daemon answering held view requests on a change, at their deadline, and dropping them when
their client goes; then the gateway waiting for a slow on-demand start without polling.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.daemon_harness import DaemonHarness, entry, to_yaml
from tests.gateway.support import GATEWAY, fake_entry, gateway_yaml, model_dir, post
from tests.support import free_port, wait_until
from veloxd.daemon.client import DaemonClient
from veloxd.daemon.control import DaemonUnreachable, request
from veloxd.daemon.longpoll import MAX_WAIT_S, ViewWaits
from veloxd.daemon.messages import Reply


class Views:
    """A view that a test changes, counting how often the book computes it."""

    def __init__(self) -> None:
        self.view: dict[str, Any] = {"servers": {"a": {"state": "ready"}}}
        self.computed = 0

    def __call__(self) -> dict[str, Any]:
        self.computed += 1
        return json.loads(json.dumps(self.view))


def answered(reply: Reply) -> dict[str, Any] | None:
    return reply.wait(0)


def held(book: ViewWaits, views: Views, wait_s: float = 10.0, now: float = 0.0) -> Reply:
    """A request that knows the current view: held."""
    etag, _ = book.current()
    reply = Reply()
    book.ask(reply, etag, wait_s, now)
    assert answered(reply) is None
    return reply


def test_a_request_without_the_current_view_is_answered_at_once() -> None:
    views = Views()
    book = ViewWaits(views)
    first, second = Reply(), Reply()
    book.ask(first, None, 10.0, now=0.0)
    book.ask(second, "an-old-etag", 10.0, now=0.0)
    one, two = answered(first), answered(second)
    assert one is not None and two is not None
    assert one["servers"] == {"a": {"state": "ready"}} and one["etag"] == two["etag"]
    assert (one["long_poll"], two["long_poll"]) == ({"answered": 1, "held": 0}, {"answered": 2, "held": 0})
    etag = one["etag"]
    now_reply = Reply()
    book.ask(now_reply, etag, 0.0, now=0.0)  # no wait: answered at once although nothing changed
    assert (answered(now_reply) or {}).get("etag") == etag
    assert ViewWaits(Views()).current()[0] == etag  # named by content: a new daemon, the same name


def test_a_held_request_is_answered_when_the_view_changes_and_not_before() -> None:
    views = Views()
    book = ViewWaits(views)
    old = book.current()[0]
    reply = held(book, views)
    book.settle(now=1.0)
    assert answered(reply) is None and book.held == 1
    views.view["servers"]["a"]["state"] = "stopping"
    book.settle(now=2.0)
    answer = answered(reply)
    assert answer is not None and answer["servers"]["a"]["state"] == "stopping" and answer["etag"] != old
    assert book.held == 0 and book.next_deadline() is None


def test_a_held_request_is_answered_at_its_deadline_with_the_same_view() -> None:
    views = Views()
    book = ViewWaits(views)
    etag = book.current()[0]
    reply = held(book, views, wait_s=5.0, now=100.0)
    later = held(book, views, wait_s=2 * MAX_WAIT_S, now=100.0)  # a longer wait is cut to MAX_WAIT_S
    assert book.next_deadline() == 105.0
    book.settle(now=104.999)
    assert answered(reply) is None
    book.settle(now=105.0)
    assert (answered(reply) or {}).get("etag") == etag and book.next_deadline() == 100.0 + MAX_WAIT_S
    book.settle(now=100.0 + MAX_WAIT_S)
    assert (answered(later) or {}).get("etag") == etag and book.held == 0


def test_the_view_is_computed_only_while_a_request_waits_and_abandoned_ones_are_dropped() -> None:
    views = Views()
    book = ViewWaits(views)
    book.settle(now=0.0)
    assert views.computed == 0
    reply = held(book, views)
    computed = views.computed
    book.settle(now=1.0)
    assert views.computed == computed + 1
    reply.abandon()  # its client closed the connection
    views.view["servers"]["a"]["state"] = "stopped"
    book.settle(now=2.0)
    assert answered(reply) is None and book.held == 0 and views.computed == computed + 1


def test_past_the_cap_a_waiting_request_is_refused_naming_it() -> None:
    views = Views()
    book = ViewWaits(views, cap=2)
    first, second = held(book, views), held(book, views)
    third = Reply()
    book.ask(third, book.current()[0], 10.0, now=0.0)
    assert answered(third) == {"ok": False, "error": "gateway_view: 2 requests wait already; ask again later"}
    assert answered(first) is None and answered(second) is None and book.held == 2


# ---- a real daemon ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonHarness]:
    """One stand-in server and no gateway: the only requests held are the test's own."""
    h = DaemonHarness(tmp_path_factory.mktemp("link"))
    h.write(to_yaml({"alpha": entry(free_port())}))
    h.start()
    try:
        h.wait_states({"alpha": "ready"})
        yield h
    finally:
        h.cleanup()


@pytest.fixture(autouse=True)
def alpha_ready(request: pytest.FixtureRequest) -> None:
    """Whatever an earlier test restarted is ready again (asked of the daemon: the state file may lag)."""
    if "daemon" in request.fixturenames:
        h = request.getfixturevalue("daemon")
        wait_until(lambda: view(h)["servers"]["alpha"]["state"] == "ready", 120, what="alpha ready")


def view(h: DaemonHarness, **fields: Any) -> dict[str, Any]:
    answer = request(h.state_dir, {"command": "gateway_view", **fields})
    assert answer["ok"], answer
    return answer


def ask_async(h: DaemonHarness, known: str | None, wait_s: float) -> concurrent.futures.Future[dict[str, Any]]:
    """The gateway's client asking from another thread (the test goes on meanwhile)."""
    pool = concurrent.futures.ThreadPoolExecutor(1)
    future = pool.submit(asyncio.run, DaemonClient(h.state_dir).view(known, wait_s))
    pool.shutdown(wait=False)
    return future


def test_a_held_view_wakes_on_the_change_that_ends_it(daemon: DaemonHarness) -> None:
    h = daemon
    etag = view(h)["etag"]
    waiting = ask_async(h, etag, MAX_WAIT_S)
    wait_until(lambda: view(h)["long_poll"]["held"] == 1, 60, what="the request held")
    assert request(h.state_dir, {"command": "restart", "name": "alpha"})["ok"]
    answer = waiting.result(timeout=120)
    # Answered in the loop turn that began the restart (a deadline answer would show it ready again).
    assert answer["etag"] != etag and answer["servers"]["alpha"]["state"] == "stopping"


def test_a_held_view_returns_at_its_deadline_when_nothing_changed(daemon: DaemonHarness) -> None:
    h = daemon
    before = view(h)
    waiting = ask_async(h, before["etag"], 8.0)  # long enough to see it held on a loaded machine
    wait_until(lambda: view(h)["long_poll"]["held"] == 1, 60, what="the request held")
    answer = waiting.result(timeout=120)
    assert answer["etag"] == before["etag"] and answer["servers"] == before["servers"]
    assert answer["long_poll"]["held"] == 0


def test_a_held_view_whose_client_went_is_dropped(daemon: DaemonHarness) -> None:
    h = daemon
    etag = view(h)["etag"]
    path = DaemonClient(h.state_dir).path()
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect(str(path))
        client.sendall(json.dumps({"command": "gateway_view", "known": etag, "wait_s": MAX_WAIT_S}).encode() + b"\n")
        wait_until(lambda: view(h)["long_poll"]["held"] == 1, 60, what="the request held")
    own = [view(h)["long_poll"]["answered"]]  # the test's own answers from here on, each counting itself

    def dropped() -> bool:
        answer = view(h)["long_poll"]
        own.append(answer["answered"])
        return answer["held"] == 0

    wait_until(dropped, 60, what="the request dropped")
    assert own[-1] - own[0] == len(own) - 1  # nothing but the test's own requests was answered
    assert view(h)["etag"] == etag  # the view did not change: no change answered it either


def test_malformed_view_requests_are_refused_naming_the_fields(daemon: DaemonHarness) -> None:
    for fields in ({"wait_s": -1}, {"wait_s": MAX_WAIT_S + 1}, {"wait_s": "5"}, {"known": 7}):
        answer = request(daemon.state_dir, {"command": "gateway_view", **fields})
        assert answer == {
            "ok": False,
            "error": f"gateway_view: known is the etag of a view (a string), wait_s seconds from 0 to {MAX_WAIT_S:g}",
        }, fields


def test_the_client_names_the_socket_when_no_daemon_listens_or_answers(tmp_path: Path) -> None:
    missing = tmp_path / "control.sock"
    with pytest.raises(DaemonUnreachable, match=f"no veloxd daemon is listening on {missing}"):
        asyncio.run(DaemonClient(socket=missing).ask({"command": "status"}))
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(str(tmp_path / "silent.sock"))
    silent.listen()
    try:  # accepts (the kernel does), never answers: the read times out
        client = DaemonClient(socket=tmp_path / "silent.sock", answer_timeout_s=0.2)
        with pytest.raises(DaemonUnreachable, match=r"did not answer 'status' \(timed out\)"):
            asyncio.run(client.ask({"command": "status"}))
    finally:
        silent.close()


# ---- the gateway ------------------------------------------------------------------------


def test_a_request_waiting_for_a_slow_start_wakes_on_the_change_not_by_polling(tmp_path: Path) -> None:
    """While one request waits for a stand-in that takes 3 s to load, the daemon answers the
    gateway's view requests once per change of its view (stopped, starting, ready), plus one per
    MAX_WAIT_S of waiting: not once per 50 ms."""
    h = DaemonHarness(tmp_path)
    try:
        gateway = {"port": free_port()}
        slow = fake_entry(model_dir(tmp_path, "m"), start="on_demand", env={"FAKE_START_DELAY_S": "3"})
        h.write(gateway_yaml(gateway, {"slow": slow}))
        h.start()
        h.wait_states({GATEWAY: "ready", "slow": "stopped"})
        before = view(h)["long_poll"]["answered"]
        started = time.monotonic()
        status, body = post(f"http://127.0.0.1:{gateway['port']}", "/v1/completions", {"model": "slow", "prompt": "x"})
        waited = time.monotonic() - started
        after = view(h)["long_poll"]["answered"]
        assert status == 200 and body["model"] == "slow", body
        views = after - before - 1  # the gateway's: the count of the second request includes itself
        changes = 4  # starting, ready, the measured need, one spare
        assert 2 <= views <= changes + 1 + int(waited / MAX_WAIT_S), (views, waited)
    finally:
        h.cleanup()
