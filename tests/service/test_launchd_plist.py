"""The generated LaunchAgent: every key, every path absolute and existing, the venv interpreter kept,
the command launchd will run really imports veloxd, and the checked-in template matches the code."""

from __future__ import annotations

import os
import plistlib
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.launchd_harness import LABEL, LaunchdHarness
from tests.support import REPO
from veloxd.service.plist import TEMPLATE_PATH, render_plist, template_spec, template_text
from veloxd.service.spec import AgentSpec

EXPECTED_KEYS = {
    "Label", "ProgramArguments", "EnvironmentVariables", "WorkingDirectory", "RunAtLoad", "KeepAlive",
    "ProcessType", "ThrottleInterval", "ExitTimeOut", "StandardOutPath", "StandardErrorPath",
    "SoftResourceLimits", "HardResourceLimits",
}  # fmt: skip


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[LaunchdHarness, dict, subprocess.CompletedProcess]:
    """One real install (stub launchctl) shared by the assertions below."""
    h = LaunchdHarness(tmp_path_factory.mktemp("plist"))
    hf = h.root / "hf-cache"
    done = h.install(HF_HOME=str(hf), HF_HUB_CACHE="~/hub")
    assert done.returncode == 0, done.stderr
    return h, h.loaded_plist(), done


def test_every_key_and_value(installed: tuple[LaunchdHarness, dict, subprocess.CompletedProcess]) -> None:
    h, plist, done = installed
    assert set(plist) == EXPECTED_KEYS
    assert plist["Label"] == LABEL
    assert plist["RunAtLoad"] is True
    assert plist["KeepAlive"] == {"SuccessfulExit": False}
    assert plist["ProcessType"] == "Interactive"
    assert plist["ThrottleInterval"] == 10
    # launchd's default of 256 open files is below what 300 clients of the gateway need
    assert plist["SoftResourceLimits"] == plist["HardResourceLimits"] == {"NumberOfFiles": 8192}
    assert plist["ExitTimeOut"] == 40  # no servers, so the 30 s default stop_timeout_s + 10 s margin
    assert "assumes the default stop_timeout_s of 30 s" in done.stderr
    assert plist["WorkingDirectory"] == str(h.config.parent)
    args = plist["ProgramArguments"]
    assert args[1] == "-P"  # no folder named veloxd in the working directory can shadow the package
    args = [args[0], *args[2:]]
    assert args[1:5] == ["-m", "veloxd", "run", "--config"]
    assert args[5] == str(h.config)
    assert args[6] == "--log-file" and args[8] == "--state-dir"
    log_dir = Path(args[7]).parent
    assert Path(args[7]).name == "veloxd.jsonl"
    assert plist["StandardOutPath"] == str(log_dir / "launchd.stdout.log")
    assert plist["StandardErrorPath"] == str(log_dir / "launchd.stderr.log")
    env = plist["EnvironmentVariables"]
    assert env["HOME"] == str(h.home)
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["HF_HOME"] == str(h.root / "hf-cache")
    assert env["HF_HUB_CACHE"] == str(h.home / "hub")  # `~` expanded against HOME, never left in
    assert env["PATH"].split(":") == [
        str(Path(args[0]).parent),
        "/usr/bin",
        "/bin",
        "/usr/sbin",
        "/sbin",
        "/opt/homebrew/bin",
    ]
    assert set(env) <= {"PATH", "HOME", "PYTHONUNBUFFERED", "HF_HOME", "HF_HUB_CACHE", "PYTHONPATH"}


def test_default_locations_follow_veloxd_paths(
    installed: tuple[LaunchdHarness, dict, subprocess.CompletedProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    h, plist, _ = installed
    monkeypatch.setenv("HOME", str(h.home))
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    from veloxd import paths

    assert plist["ProgramArguments"][8] == str(paths.default_log_file())  # after -P -m veloxd run --config C --log-file
    assert plist["ProgramArguments"][10] == str(paths.default_state_dir())


def test_every_path_is_absolute_and_exists(installed: tuple[LaunchdHarness, dict, subprocess.CompletedProcess]) -> None:
    _, plist, _ = installed
    args = plist["ProgramArguments"]
    assert args[1] == "-P"  # no folder named veloxd in the working directory can shadow the package
    args = [args[0], *args[2:]]
    files = [args[0], args[5]]
    dirs = [plist["WorkingDirectory"], args[9], str(Path(args[7]).parent), plist["EnvironmentVariables"]["HOME"]]
    dirs += [str(Path(plist[key]).parent) for key in ("StandardOutPath", "StandardErrorPath")]
    for path in files + dirs + [args[7]]:
        assert os.path.isabs(path) and "~" not in path, path
    for path in files:
        assert Path(path).is_file(), path
    for path in dirs:
        assert Path(path).is_dir(), path
    for entry in plist["EnvironmentVariables"]["PATH"].split(":"):
        assert os.path.isabs(entry), entry
    assert "~" not in plistlib.dumps(plist).decode()


def test_interpreter_is_the_venv_one_not_the_base(
    installed: tuple[LaunchdHarness, dict, subprocess.CompletedProcess],
) -> None:
    _, plist, _ = installed
    python = plist["ProgramArguments"][0]
    assert python == os.path.abspath(sys.executable)
    assert python.startswith(sys.prefix + os.sep)  # inside the venv, where its site-packages are


def test_the_agent_command_imports_veloxd_in_launchds_environment(
    installed: tuple[LaunchdHarness, dict, subprocess.CompletedProcess],
) -> None:
    """Run the plist's own interpreter with only the plist's environment, from its WorkingDirectory."""
    _, plist, _ = installed
    python = plist["ProgramArguments"][0]
    probe = subprocess.run(
        [python, "-P", "-m", "veloxd", "run", "--help"], env=plist["EnvironmentVariables"], cwd=plist["WorkingDirectory"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert probe.returncode == 0, probe.stderr
    assert "--state-dir" in probe.stdout


def test_plistlib_round_trip_is_exact(installed: tuple[LaunchdHarness, dict, subprocess.CompletedProcess]) -> None:
    h, plist, _ = installed
    assert plistlib.dumps(plist, sort_keys=True) == h.plist.read_bytes()


def test_checked_in_template_matches_the_code() -> None:
    assert REPO / "launchd" / f"{LABEL}.plist.template" == TEMPLATE_PATH
    assert TEMPLATE_PATH.read_text() == template_text(), "run `python -m veloxd.service.plist` to regenerate"
    assert plistlib.loads(TEMPLATE_PATH.read_bytes()) == render_plist(template_spec())


def test_exit_timeout_is_above_the_slowest_stop_timeout() -> None:
    spec = AgentSpec(
        label=LABEL, python="/v/bin/python", config="/c/veloxd.yaml", log_file="/l/veloxd.jsonl",
        state_dir="/s", home="/h", working_dir="/c", max_stop_timeout_s=62.5,
    )  # fmt: skip
    assert render_plist(spec)["ExitTimeOut"] == 73  # ceil(62.5) + 10 s margin


@pytest.mark.parametrize("bad", ["relative/python", "~/venv/bin/python"])
def test_spec_refuses_relative_or_tilde_paths(bad: str) -> None:
    with pytest.raises(ValueError, match="python must be an absolute path"):
        AgentSpec(
            label=LABEL, python=bad, config="/c/veloxd.yaml", log_file="/l/veloxd.jsonl",
            state_dir="/s", home="/h", working_dir="/c", max_stop_timeout_s=30,
        )  # fmt: skip


TWO_SERVERS = """\
version: 1
servers:
  coder:
    model: mlx-community/Qwen2.5-Coder-7B-Instruct-4bit
    port: 8081
    method: fp16
    stop_timeout_s: 45
  chat:
    model: mlx-community/Llama-3.2-3B-Instruct-4bit
    port: 8082
    method: fp16
"""


def test_exit_timeout_follows_the_slowest_server_in_the_config(tmp_path: Path) -> None:
    h = LaunchdHarness(tmp_path, config_text=TWO_SERVERS)
    done = h.install("--print")
    assert done.returncode == 0, done.stderr
    assert plistlib.loads(done.stdout.encode())["ExitTimeOut"] == 55  # coder's 45 s + 10 s margin
    assert "assumes the default stop_timeout_s" not in done.stderr


def test_an_invalid_config_warns_but_installs_with_the_default_grace(tmp_path: Path) -> None:
    h = LaunchdHarness(tmp_path, config_text=TWO_SERVERS.replace("port: 8082", "port: 99999"))
    done = h.install()
    assert done.returncode == 0, done.stderr
    assert f"warning: {h.config} is not valid: {h.config}:" in done.stderr
    assert "the daemon will run degraded until it is fixed" in done.stderr
    assert h.loaded_plist()["ExitTimeOut"] == 40
