"""Pure decisions of the daemon: the transition table, backoff, the failure window, debounce."""

from __future__ import annotations

import itertools

import pytest

from veloxd.config import RestartPolicy
from veloxd.daemon.state import (
    TRANSITIONS,
    GiveUp,
    IllegalTransition,
    Retry,
    ServerState,
    after_failure,
    backoff_delay,
    failures_in_window,
    transition,
)
from veloxd.daemon.watch import Debounce

S = ServerState
LEGAL = {
    (S.STOPPED, S.STARTING),
    (S.STOPPED, S.DOWNLOADING),
    (S.DOWNLOADING, S.STARTING),
    (S.DOWNLOADING, S.BACKOFF),
    (S.DOWNLOADING, S.FATAL),
    (S.DOWNLOADING, S.STOPPING),
    (S.STOPPED, S.WAITING),
    (S.WAITING, S.STARTING),
    (S.WAITING, S.STOPPING),
    (S.BACKOFF, S.WAITING),
    (S.DOWNLOADING, S.WAITING),
    (S.WAITING, S.DOWNLOADING),
    (S.STARTING, S.READY),
    (S.STARTING, S.BACKOFF),
    (S.STARTING, S.FATAL),
    (S.STARTING, S.WAITING),
    (S.STARTING, S.STOPPING),
    (S.READY, S.BACKOFF),
    (S.READY, S.FATAL),
    (S.READY, S.STOPPING),
    (S.READY, S.UNRESPONSIVE),  # health.failures probes in a row failed
    (S.UNRESPONSIVE, S.BACKOFF),  # killed: restarted like a crash
    (S.UNRESPONSIVE, S.FATAL),
    (S.UNRESPONSIVE, S.STOPPING),
    (S.BACKOFF, S.STARTING),
    (S.BACKOFF, S.DOWNLOADING),
    (S.BACKOFF, S.STOPPING),
    (S.FATAL, S.STOPPING),
    (S.STOPPING, S.STOPPED),
}


# Sorted here, not in the decorator: there mypy would infer the pairs from parametrize's parameter type (object).
EVERY_PAIR = sorted(itertools.product(S, S), key=lambda p: (p[0].value, p[1].value))


@pytest.mark.parametrize("old,new", EVERY_PAIR)
def test_transition_allows_exactly_the_documented_edges(old: ServerState, new: ServerState) -> None:
    """Every pair of states is either a documented edge (returned) or raises IllegalTransition."""
    if (old, new) in LEGAL:
        assert transition(old, new) is new
    else:
        with pytest.raises(IllegalTransition, match=f"{old.value} -> {new.value}"):
            transition(old, new)


def test_every_state_can_be_stopped_and_fatal_only_leaves_through_a_stop() -> None:
    """any -> STOPPING -> STOPPED; FATAL stays until something stops (and restarts) it."""
    for state in S:
        if state not in (S.STOPPING, S.STOPPED):
            assert S.STOPPING in TRANSITIONS[state]
    assert TRANSITIONS[S.FATAL] == {S.STOPPING}
    assert TRANSITIONS[S.STOPPING] == {S.STOPPED}


def test_backoff_doubles_from_initial_up_to_the_cap() -> None:
    """1, 2, 4, ... 32, then 60 forever (the defaults)."""
    delays = [backoff_delay(n, 1.0, 60.0) for n in range(1, 10)]
    assert delays == [1, 2, 4, 8, 16, 32, 60, 60, 60]
    assert backoff_delay(3, 0.1, 0.3) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="failures must be >= 1"):
        backoff_delay(0, 1.0, 60.0)


def test_failure_window_keeps_only_recent_failures() -> None:
    assert failures_in_window([0.0, 50.0, 99.0, 100.0], now=100.0, window_s=50.0) == [50.0, 99.0, 100.0]
    assert failures_in_window([], now=5.0, window_s=1.0) == []


def test_after_failure_backs_off_then_gives_up_at_the_limit() -> None:
    """With max_failures=3: the 1st and 2nd failure retry with growing delays, the 3rd is FATAL."""
    policy = RestartPolicy(max_failures=3, window_s=60.0, backoff_initial_s=1.0, backoff_max_s=60.0)
    assert after_failure([], 10.0, policy) == Retry(delay_s=1.0, failures=1)
    assert after_failure([10.0], 12.0, policy) == Retry(delay_s=2.0, failures=2)
    decision = after_failure([10.0, 12.0], 15.0, policy)
    assert isinstance(decision, GiveUp) and decision.failures == 3
    assert "3 failures within 60s" in decision.reason


def test_old_failures_outside_the_window_do_not_count() -> None:
    """A server that crashed long ago starts over with the initial delay."""
    policy = RestartPolicy(max_failures=3, window_s=60.0, backoff_initial_s=1.0, backoff_max_s=60.0)
    assert after_failure([0.0, 1.0], 500.0, policy) == Retry(delay_s=1.0, failures=1)


def test_unfixable_failure_is_fatal_at_once() -> None:
    """Exit code 2 (invalid input) never retries, even on the first failure."""
    policy = RestartPolicy(max_failures=5)
    decision = after_failure([], 1.0, policy, unfixable="cannot serve plamo2 with method affine")
    assert decision == GiveUp(reason="cannot serve plamo2 with method affine", failures=1)


def test_debounce_waits_for_quiet_but_not_forever() -> None:
    """Fires quiet_s after the last poke, or max_wait_s after the first one, whichever is first."""
    d = Debounce(quiet_s=0.2, max_wait_s=1.0)
    assert d.deadline() is None and not d.due(100.0)  # nothing poked: never due
    d.poke(0.0)
    d.poke(0.1)
    assert d.deadline() == pytest.approx(0.3)
    assert not d.due(0.25) and d.due(0.31)
    for t in (0.3, 0.5, 0.7, 0.9):  # a steady stream of events
        d.poke(t)
    assert d.deadline() == pytest.approx(1.0)
    assert d.clear() == 6  # the burst merged into one round
    assert d.deadline() is None and not d.due(5.0)  # and the next round waits for a poke
