"""Properties (hypothesis): a server entry survives entry -> data -> entry (veloxd/config/codec.py),
for generated valid entries of every registered method, as the state file and the worker's document carry it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

from tests.config.strategies import entry
from veloxd.config.model import ServerEntry
from veloxd.kv import registry

PROPERTY = settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])


@pytest.mark.parametrize("method", registry.names())
def test_entry_to_data_and_back_is_the_same_entry(method: str) -> None:
    @PROPERTY
    @given(data=entry(8081, method))
    def round_trip(data: dict[str, Any]) -> None:
        first = ServerEntry.from_dict("s", data)
        plain = json.loads(json.dumps(first.to_dict()))  # plain data: as JSON carries it
        again = ServerEntry.from_dict("s", plain)
        assert again == first
        assert again.to_dict() == plain  # the data form is a fixed point
        assert (again.process_key(), again.live_key()) == (first.process_key(), first.live_key())
        # What was written is what the entry holds: the method, its bits and every override given.
        assert plain["method"] == method and again.kv.method == method
        if "bits" in data:
            assert again.kv.bits == data["bits"]
        for name, value in data["overrides"].items():
            assert getattr(again.kv, name) == value, name

    round_trip()
