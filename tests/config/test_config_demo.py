"""`make run`'s demo: configs/veloxd.yaml under a real daemon, driven exactly as veloxd/demo.py prints.

The daemon runs the demo's own config file (ports moved to free ones, the relative model path
resolved) with real `veloxd serve` workers on the shipped tiny model. The printed curl lines and
the printed openai snippet are taken from demo.ready_text and executed as they are; every reply,
stream chunk and model list names the entry, through the gateway and on a worker's own port.
"""

from __future__ import annotations

import json
import shlex
import urllib.request
from pathlib import Path
from typing import Any

import openai  # the test extra (`make run` alone does not install it)
import pytest
import yaml

from tests.fixtures.daemon_harness import DaemonHarness
from tests.support import REPO, free_port, wait_until
from veloxd import demo

DEMO = REPO / "configs" / "veloxd.yaml"
LOAD_S = 300  # three model loads on two busy CPU cores


def test_demo_config_has_a_gateway_two_running_entries_and_an_on_demand_one() -> None:
    doc = yaml.safe_load(DEMO.read_text())
    assert doc["gateway"]["port"] and "api_key_env" not in doc["gateway"]  # the printed snippet carries no token
    starts = {name: body.get("start", "always") for name, body in doc["servers"].items()}
    assert sorted(starts.values()) == ["always", "always", "on_demand"]


def printed_snippet(text: str) -> str:
    """The Python lines the demo prints, from its comment line to the blank line after them."""
    lines = text.splitlines()
    first = lines.index("# Python (pip install openai):") + 1
    last = lines.index("", first + 2)  # after the blank line that follows the import
    return "\n".join(lines[first:last]) + "\n"


def run_curl(line: str) -> dict[str, Any]:
    """A printed `curl -s URL -H ... -d BODY` line, sent as curl would send it."""
    argv = shlex.split(line)
    assert argv[:2] == ["curl", "-s"] and argv[3] == "-H" and argv[5] == "-d", line
    headers = dict([argv[4].split(": ", 1)])
    request = urllib.request.Request(argv[2], data=argv[6].encode(), headers=headers)
    with urllib.request.urlopen(request, timeout=LOAD_S) as response:
        return json.loads(response.read())


@pytest.mark.slow
def test_the_demo_answers_by_entry_name_exactly_as_printed(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    doc = yaml.safe_load(DEMO.read_text())
    doc["gateway"]["port"] = free_port()
    for body in doc["servers"].values():
        body["port"] = free_port()
        body["model"] = str((DEMO.parent / body["model"]).resolve())
    h = DaemonHarness(tmp_path, real_worker=True)
    h.write(yaml.safe_dump(doc, sort_keys=False))
    try:
        h.start()

        def up() -> dict[str, Any] | None:
            h.check_alive()
            state = h.state()
            return state if demo.settled(state) else None

        state = wait_until(up, LOAD_S, interval=0.2, what="the demo's gateway and always servers ready")
        assert {n: s["state"] for n, s in state["servers"].items()} == {
            "@gateway": "ready",
            "tiny-kivi": "ready",
            "tiny-affine": "ready",
            "tiny-snapkv": "stopped",
        }
        text = demo.ready_text(state, h.state_dir)

        # The openai snippet, executed as printed: the first running entry by name, then the model list.
        snippet = printed_snippet(text)
        assert len([line for line in snippet.splitlines() if line]) == 5
        assert snippet.startswith("from openai import OpenAI\n\n")
        capsys.readouterr()
        exec(compile(snippet, "<printed by make run>", "exec"), {})
        printed = capsys.readouterr().out.splitlines()  # the reply's content may span lines
        reply_line, models_line = printed[0], printed[-1]
        assert reply_line.startswith("tiny-affine -> ") and len(reply_line) > len("tiny-affine -> ")
        assert models_line == "['tiny-kivi', 'tiny-affine', 'tiny-snapkv']"  # the config's order

        # Every printed curl line, the on-demand entry's included (it starts on this request).
        curls = [line for line in text.splitlines() if line.startswith("curl ")]
        assert len(curls) == 3 and all('"model": "' in line for line in curls)
        for line in curls:
            name = json.loads(shlex.split(line)[6])["model"]
            assert run_curl(line)["model"] == name

        # Stream chunks through the gateway, and a worker's own port, name the entry too.
        client = openai.OpenAI(base_url=demo.base_url(state), api_key="unused")
        chunks = list(
            client.chat.completions.create(
                model="tiny-kivi", messages=[{"role": "user", "content": "hi"}], max_tokens=4, stream=True
            )
        )
        assert chunks and {c.model for c in chunks} == {"tiny-kivi"}
        direct = openai.OpenAI(base_url=demo.base_url(state, "tiny-kivi"), api_key="unused")
        assert [m.id for m in direct.models.list()] == ["tiny-kivi"]
        reply = direct.chat.completions.create(
            model="tiny-kivi", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
        assert reply.model == "tiny-kivi"
        body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
        request = urllib.request.Request(
            demo.base_url(state, "tiny-kivi") + "/chat/completions",
            data=body,
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=LOAD_S) as response:  # no "model": still the entry's name
            assert json.loads(response.read())["model"] == "tiny-kivi"
        assert h.stop(timeout=120) == 0
    finally:
        h.cleanup()


def test_readme_shows_the_snippet_the_demo_prints() -> None:
    """The README's quick start is what `make run` prints for the demo config (gateway on 8080, the
    first running entry by name)."""
    doc = yaml.safe_load(DEMO.read_text())
    state = {
        "servers": {
            "@gateway": {"host": "127.0.0.1", "port": doc["gateway"]["port"], "state": "ready"},
            **{
                name: {"host": "127.0.0.1", "port": body["port"], "method": body["method"], "state": "ready"}
                | {"start": body.get("start", "always")}
                for name, body in sorted(doc["servers"].items())
            },
        }
    }
    snippet = printed_snippet(demo.ready_text(state, Path(".cache/state")))
    assert f"```python\n{snippet}```" in (REPO / "README.md").read_text()
