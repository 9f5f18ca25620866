"""A model path through two symlinks is followed through both.

`models/current -> ../links/v -> ../store/v1`: swapping the inner link `v` to `v2` changes what
`current` names without any event in `models/`. The daemon watches each inner link's directory
(and its 2 s poll sees a path that names another directory), so the server restarts on the new
directory as it does when `current` itself is swapped. Real daemon, stand-in worker.
"""

from __future__ import annotations

import os
from pathlib import Path

from tests.fixtures.daemon_harness import DaemonHarness, entry
from tests.gateway.support import model_dir
from tests.support import free_port
from veloxd.daemon.watch import link_chain


def swap_link(link: Path, target: str) -> None:
    """`ln -sfn target link`, atomically: a new link renamed over the old one."""
    staging = link.with_name(f".{link.name}.new")
    os.symlink(target, staging)
    os.replace(staging, link)


def test_link_chain_lists_each_link_in_order(tmp_path: Path) -> None:
    store = model_dir(tmp_path / "store", "v1")
    (tmp_path / "links").mkdir()
    (tmp_path / "models").mkdir()
    os.symlink(store, tmp_path / "links" / "v")
    os.symlink("../links/v", tmp_path / "models" / "current")
    assert link_chain(tmp_path / "models" / "current") == [tmp_path / "models" / "current", tmp_path / "links" / "v"]
    assert link_chain(store) == []
    assert link_chain(tmp_path / "missing") == []


def test_swapping_the_inner_link_restarts_the_server_on_the_new_directory(tmp_path: Path) -> None:
    v1, v2 = model_dir(tmp_path / "store", "v1"), model_dir(tmp_path / "store", "v2", weights_bytes=2000)
    (tmp_path / "links").mkdir()
    (tmp_path / "models").mkdir()
    os.symlink(v1, tmp_path / "links" / "v")
    current = tmp_path / "models" / "current"
    os.symlink("../links/v", current)
    h = DaemonHarness(tmp_path / "d")
    h.write({"alpha": entry(free_port(), model=str(current))})
    try:
        h.start()
        h.wait_states({"alpha": "ready"})
        pid = h.server("alpha")["pid"]
        mark = h.mark()
        swap_link(tmp_path / "links" / "v", str(v2))
        changed = h.wait_event("model_changed", after=mark, timeout=60)
        assert changed["directory"] == str(current) and changed["present"] is True
        assert changed["restarted"] == ["alpha"]
        h.wait_event("server_ready", after=mark, server="alpha")
        assert h.server("alpha")["pid"] != pid
        assert h.server("alpha")["model"] == str(current)  # the path, not what it resolved to

        mark = h.mark()  # and once more: the watch follows the chain as it is now
        swap_link(tmp_path / "links" / "v", str(v1))
        assert h.wait_event("model_changed", after=mark, timeout=60)["restarted"] == ["alpha"]
    finally:
        h.cleanup()
