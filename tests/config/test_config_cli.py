"""`veloxd check`, `schema` and `plan` as real processes: exit codes, output lines, speed, no mlx."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.config_support import FIELD_CASES, VALID, entry, model_dir, write_config
from tests.support import REPO, free_port, run_reporting_imports
from veloxd.config import config_to_dict, load_config

LINE = re.compile(r"^(?P<file>.+):(?P<line>\d+):(?P<col>\d+): (?P<message>.+) \(at (?P<path>\$\S*)\)$")


def veloxd(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "veloxd", *args], capture_output=True, text=True, timeout=120, cwd=REPO, env=env
    )


BROKEN = {
    "field": dict((c[0], c[1]) for c in FIELD_CASES)["field-of-another-method"],
    "syntax": "version: 1\nservers:\n  coder: [1, 2\n",
    "tab": "version: 1\nservers:\n\tcoder: {}\n",
    "duplicate": VALID + "  coder: {model: ./model, port: 9, method: fp16}\n",
    "semantic": VALID.replace("method: kivi", "method: kivi\n    restart: {backoff_initial_s: 90}"),
    "empty": "",
}


@pytest.mark.parametrize("case", BROKEN)
def test_check_broken_file_exits_1_with_located_lines_without_loading_mlx(tmp_path: Path, case: str) -> None:
    path = write_config(tmp_path, BROKEN[case], dedent=False)
    done, heavy = run_reporting_imports("check", str(path))
    assert done.returncode == 1, done.stderr
    assert heavy == [], f"`veloxd check` imported {heavy}: it must stay light"
    assert done.stdout == "" and "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    assert lines and all(LINE.match(line) and line.startswith(f"{path}:") for line in lines), lines


def test_check_valid_file_prints_one_summary_line(tmp_path: Path) -> None:
    path = write_config(tmp_path, VALID)
    done = veloxd("check", str(path), env={**os.environ, "HF_HOME": str(tmp_path / "hf")})
    assert done.returncode == 0
    assert done.stdout == (
        f"{path}: valid; 2 servers: coder (kivi 2-bit on 127.0.0.1:8081), chat (h2o on 127.0.0.1:8082)\n"
    )
    # A model not yet in the Hugging Face cache is a warning (the daemon downloads it), not an error.
    # Located like every other line: FILE:LINE:COL of the entry's model value.
    assert done.stderr == (
        f"{path}:12:12: warning: model mlx-community/Qwen2.5-0.5B-Instruct-4bit is not "
        f"downloaded yet (cache {tmp_path / 'hf' / 'hub'}); the daemon fetches it before the "
        "first start, or run `veloxd pull chat` now (at $.servers.chat.model)\n"
    )
    assert LINE.match(done.stderr.strip())


def test_check_json_output(tmp_path: Path) -> None:
    path = write_config(tmp_path, VALID.replace("port: 8082", "port: 0"))
    done = veloxd("check", "--json", str(path))
    assert done.returncode == 1
    assert json.loads(done.stdout) == {
        "valid": False,
        "warnings": [],
        "errors": [
            {
                "file": str(path),
                "line": 13,
                "column": 11,
                "path": "$.servers.chat.port",
                "message": "port=0: must be >= 1",
            },
        ],
    }
    done = veloxd("check", "--json", str(write_config(tmp_path, VALID)))
    answer = json.loads(done.stdout)
    assert done.returncode == 0 and answer["valid"] is True and answer["errors"] == []
    assert [w.rsplit(" (at ", 1)[1] for w in answer["warnings"]] == ["$.servers.chat.model)"]


def test_check_reports_conditions_of_the_world_as_warnings_exit_0_unless_strict(tmp_path: Path) -> None:
    """A model directory that does not exist yet makes that entry wait in the daemon: the file is valid,
    `check` says so with a located warning and exits 0; --strict exits 1; --json lists it."""
    path = write_config(tmp_path, VALID.replace("./model", "./not-downloaded-yet"))
    done = veloxd("check", str(path))
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"{path}: valid; 2 servers")
    [line] = [line for line in done.stderr.splitlines() if "$.servers.chat" not in line]  # chat: not downloaded
    match = LINE.match(line)
    assert match and match["path"] == "$.servers.coder.model" and (match["line"], match["col"]) == ("4", "12")
    assert match["message"].startswith(f"warning: model path {tmp_path}/not-downloaded-yet does not exist (yet)")
    strict = veloxd("check", "--strict", str(path))
    assert strict.returncode == 1
    assert strict.stderr.splitlines()[-1] == (  # why it failed although the file is valid
        f"{path}: --strict: failing on 2 warnings (above); without --strict the file is valid "
        "and the daemon makes only those servers wait"
    )
    report = json.loads(veloxd("check", "--json", str(path)).stdout)
    assert report["valid"] and report["errors"] == [] and report["warnings"][0] == line


def test_check_warns_of_a_host_this_machine_cannot_listen_on(tmp_path: Path) -> None:
    """A name that does not resolve (.invalid never does) once passed `check` silently and then
    crashed the daemon; it is a condition of the world: a located warning on the entry's host."""
    model_dir(tmp_path, "model")
    text = VALID.replace("    port: 8081\n", "    port: 8081\n    host: studio.invalid\n    api_key_env: KEY\n")
    path = write_config(tmp_path, text)
    done = veloxd("check", str(path), env={**os.environ, "KEY": "k"})
    assert done.returncode == 0, done.stderr
    [line] = [line for line in done.stderr.splitlines() if "$.servers.coder" in line]
    match = LINE.match(line)
    assert match and match["path"] == "$.servers.coder.host", line
    assert match["message"].startswith("warning: host studio.invalid does not resolve"), line


def test_check_reports_errors_and_warnings_together(tmp_path: Path) -> None:
    """One run shows every mistake: an invalid entry's error and a valid entry's warning (a model
    directory misspelled: the sibling is suggested), each located, exit 1; --json has both."""
    model_dir(tmp_path, "tiny-llama")
    text = VALID.replace("./model", "./tiny-lama").replace("port: 8082", "port: 0")
    path = write_config(tmp_path, text)
    done = veloxd("check", str(path), env={**os.environ, "HF_HOME": str(tmp_path / "hf")})
    assert done.returncode == 1 and done.stdout == ""
    lines = done.stderr.splitlines()
    assert all(LINE.match(line) for line in lines), lines
    assert [m["path"] for line in lines if (m := LINE.match(line))] == ["$.servers.chat.port", "$.servers.coder.model"]
    assert lines[1].endswith(
        f"warning: model path {tmp_path}/tiny-lama does not exist (yet); did you mean '{tmp_path}/tiny-llama'?; "
        "the daemon keeps this server waiting until that changes (at $.servers.coder.model)"
    )
    report = json.loads(veloxd("check", "--json", str(path)).stdout)
    assert not report["valid"] and len(report["errors"]) == 1 and report["warnings"] == lines[1:]


def test_check_unreadable_and_usage_errors_exit_2(tmp_path: Path) -> None:
    done = veloxd("check", str(tmp_path / "absent.yaml"))
    assert (done.returncode, done.stderr) == (2, f"{tmp_path}/absent.yaml:1:1: no such file (at $)\n")
    done = veloxd("check", str(tmp_path))
    assert done.returncode == 2 and "is a directory" in done.stderr
    done = veloxd("check", "--no-such-flag")
    assert done.returncode == 2 and "usage:" in done.stderr


def test_check_default_path_comes_from_the_environment(tmp_path: Path) -> None:
    path = write_config(tmp_path, VALID)
    done = veloxd("check", env={**os.environ, "VELOXD_CONFIG": str(path)})
    assert done.returncode == 0 and done.stdout.startswith(f"{path}: valid;")
    done = veloxd("check", env={**os.environ, "VELOXD_CONFIG": "", "HOME": str(tmp_path / "nohome")})
    assert done.returncode == 2
    assert done.stderr.startswith(f"{tmp_path}/nohome/.config/veloxd/veloxd.yaml:1:1: no such file")


def test_check_does_not_import_mlx(tmp_path: Path) -> None:
    done, heavy = run_reporting_imports("check", str(write_config(tmp_path, VALID)))
    assert (done.returncode, heavy) == (0, []), done.stdout + done.stderr


def test_check_effective_prints_a_loadable_resolved_config(tmp_path: Path) -> None:
    done = veloxd("check", "--effective", str(write_config(tmp_path, VALID)))
    assert done.returncode == 0 and "kivi_group_size: 64" in done.stdout and "max_tokens: 512" in done.stdout
    other = tmp_path / "other"
    other.mkdir()
    again = write_config(other, done.stdout, dedent=False)
    assert load_config(again).servers == load_config(tmp_path / "veloxd.yaml").servers


def test_schema_command_prints_the_checked_in_schema_and_docs() -> None:
    done = veloxd("schema")
    assert done.returncode == 0
    assert done.stdout == (REPO / "schemas" / "veloxd.schema.json").read_text(encoding="utf-8")
    done = veloxd("schema", "--docs")
    assert done.returncode == 0 and "## KV-cache methods" in done.stdout and "| `kivi` |" in done.stdout


def _on_free_ports(text: str) -> tuple[str, int, int]:
    """VALID's servers moved to ports free right now (8081 and 8082 may be taken on a shared machine)."""
    coder, chat = free_port(), free_port()
    return text.replace("port: 8081", f"port: {coder}").replace("port: 8082", f"port: {chat}"), coder, chat


def test_plan_without_a_daemon(tmp_path: Path) -> None:
    text, coder, chat = _on_free_ports(VALID)
    path = write_config(tmp_path, text)
    done = veloxd("plan", str(path), "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"plan for {path}: no running daemon found; planning against an empty state",
        f"  + coder                start    (kivi 2-bit on 127.0.0.1:{coder})",
        f"  + chat                 start    (h2o on 127.0.0.1:{chat})",
        "2 to start, 0 to restart, 0 to update, 0 to stop, 0 unchanged",
    ]


def test_plan_names_what_will_wait_or_hold_a_restart(tmp_path: Path) -> None:
    """A server to start on a port another process holds waits; a ready server moved onto one keeps running."""
    text, coder, _ = _on_free_ports(VALID)
    applied = write_config(tmp_path, text, name="applied.yaml")
    _write_daemon_state(tmp_path / "state", applied, alive=True, servers={"coder": "ready", "chat": "ready"})
    taken = free_port()
    edited = text.replace(f"port: {coder}", f"port: {taken}") + (
        f"  extra:\n    model: {tmp_path / 'not-yet'}\n    port: {free_port()}\n    method: fp16\n"
    )
    path = write_config(tmp_path, edited, dedent=False)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        done = veloxd("plan", str(path), "--state-dir", str(tmp_path / "state"))
        as_json = veloxd("plan", str(path), "--state-dir", str(tmp_path / "state"), "--json")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    added, missing = lines[1:3]
    assert added.startswith("  + extra ") and missing == (
        f"      waits while: model path {tmp_path / 'not-yet'} does not exist (yet)"
    ), lines
    changed, held = lines[3:5]
    assert changed == "  ~ coder                restart  (port)", lines
    assert held.startswith(
        f"      restart held (it keeps serving as it runs) while: port {taken} on 127.0.0.1 is already in use"
    ), lines
    assert lines[-1] == "1 to start, 1 to restart, 0 to update, 0 to stop, 1 unchanged; 2 will wait", lines
    report = json.loads(as_json.stdout)["conditions"]
    assert {name: (c["outcome"], [k["kind"] for k in c["conditions"]]) for name, c in report.items()} == {
        "coder": ("held", ["port"]),
        "extra": ("waits", ["model_path"]),
    }


def _write_daemon_state(state_dir: Path, config_path: Path, alive: bool, servers: dict[str, str] | None = None) -> None:
    """The state file as the daemon writes it (its own writer and process identity)."""
    from veloxd.daemon.process import process_start_time
    from veloxd.daemon.statefile import write_state

    state_dir.mkdir()
    applied = load_config(config_path)
    write_state(
        state_dir,
        {
            "daemon": {"running": alive, "pid": os.getpid(), "start_time": process_start_time(os.getpid())},
            "config_path": str(config_path),
            "config": config_to_dict(applied),
            "servers": {name: {"state": state} for name, state in (servers or {}).items()},
        },
    )


def test_plan_against_the_running_daemons_config(tmp_path: Path) -> None:
    applied = write_config(tmp_path, VALID, name="applied.yaml")
    _write_daemon_state(tmp_path / "state", applied, alive=True)
    edited = write_config(
        tmp_path,
        VALID.replace("kivi_group_size: 64", "kivi_group_size: 32").replace(
            "method: h2o", "method: h2o\n    description: chat"
        ),
    )
    done = veloxd("plan", str(edited), "--state-dir", str(tmp_path / "state"), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["against"] == f"against the config the running daemon applied ({applied})"
    assert report["changed"] == {"coder": ["overrides.kivi_group_size"]}
    assert report["updated"] == {"chat": ["description"]} and report["added"] == report["removed"] == []


def test_plan_ignores_the_state_of_a_stopped_daemon(tmp_path: Path) -> None:
    applied = write_config(tmp_path, VALID, name="applied.yaml")
    _write_daemon_state(tmp_path / "state", applied, alive=False)
    done = veloxd("plan", str(applied), "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 0 and "no running daemon found" in done.stdout.splitlines()[0]


def test_plan_of_an_invalid_file_exits_1(tmp_path: Path) -> None:
    path = write_config(tmp_path, VALID.replace("method: h2o", "method: h3o"))
    done = veloxd("plan", str(path), "--state-dir", str(tmp_path / "state"))
    assert done.returncode == 1 and done.stdout == ""
    assert LINE.match(done.stderr.splitlines()[0]) and "did you mean 'h2o'?" in done.stderr


HYBRID_MISTAKES = {
    # a pair the registry does not implement: the field, and why (registry.unknown_method)
    "method: snapkv_kivi": (
        "$.servers.coder.method",
        "unknown method 'snapkv_kivi': snapkv over kivi storage is not implemented: KIVI quantizes keys per channel",
        "(implemented: snapkv_affine)",
    ),
    # a setting of neither part (snapkv, affine)
    "method: snapkv_affine\noverrides: {h2o_budget: 64}": (
        "$.servers.coder.overrides.h2o_budget",
        "h2o_budget applies to method",
        "not snapkv_affine",
    ),
}


@pytest.mark.parametrize("body", HYBRID_MISTAKES, ids=["unimplemented-pair", "field-of-neither-part"])
def test_check_refuses_a_bad_hybrid_entry_by_field_and_reason_without_loading_mlx(tmp_path: Path, body: str) -> None:
    path = write_config(tmp_path, entry(f"model: ./model\nport: 8081\n{body}"), dedent=False)
    done, heavy = run_reporting_imports("check", str(path))
    assert done.returncode == 1 and heavy == [], (done.stderr, heavy)
    (line,) = done.stderr.splitlines()
    found = LINE.match(line)
    assert found, line
    where, *reasons = HYBRID_MISTAKES[body]
    assert found["path"] == where and all(reason in found["message"] for reason in reasons), line
