"""`veloxd install` / `uninstall` against a stub launchctl first on PATH: the exact command sequences,
the one-line reports, and launchctl's own error text on failure. The CLI runs as a real subprocess."""

from __future__ import annotations

import plistlib
import sys
from collections.abc import Callable

import pytest

from tests.fixtures.launchd_harness import LABEL, TARGET, UID, LaunchdHarness

DOMAIN = f"gui/{UID}"
EIO = "Bootstrap failed: 5: Input/output error\nTry re-running the command as root for richer errors."


def fresh_bootstrap(h: LaunchdHarness) -> list[str]:
    """The calls that load an agent launchd does not hold: look it up, enable it, bootstrap the plist."""
    return [f"launchctl print {TARGET}", f"launchctl enable {TARGET}", f"launchctl bootstrap {DOMAIN} {h.plist}"]


def test_fresh_install_bootstraps_and_reinstall_unchanged_kickstarts(h: LaunchdHarness) -> None:
    done = h.install()
    assert done.returncode == 0, done.stderr
    assert h.calls() == fresh_bootstrap(h)
    assert done.stdout == f"installed {LABEL}: wrote {h.plist}, bootstrapped {LABEL}.plist into {DOMAIN}\n"
    assert h.loaded_plist()["Label"] == LABEL
    assert h.is_marked("loaded", LABEL)
    first = h.plist.read_bytes()

    again = h.install()
    assert again.returncode == 0, again.stderr
    assert h.calls() == [f"launchctl print {TARGET}", f"launchctl kickstart -k {TARGET}"]
    assert again.stdout == f"restarted {LABEL}: plist unchanged, `launchctl kickstart -k {TARGET}`\n"
    assert h.plist.read_bytes() == first


def test_reinstall_changed_boots_out_waits_and_retries_bootstrap_once(h: LaunchdHarness) -> None:
    assert h.install().returncode == 0
    h.calls()
    h.linger(LABEL, prints=2)  # launchd still holds the label for two polls after bootout
    h.fail("launchctl", "bootstrap", 5, EIO, times=1)  # ... and then refuses one bootstrap with EIO

    done = h.install(HF_HOME=str(h.root / "hf"))  # a new environment variable changes the plist
    assert done.returncode == 0, done.stderr
    assert h.calls() == [
        f"launchctl print {TARGET}",
        f"launchctl bootout {TARGET}",
        f"launchctl print {TARGET}",
        f"launchctl print {TARGET}",
        f"launchctl print {TARGET}",
        f"launchctl enable {TARGET}",
        f"launchctl bootstrap {DOMAIN} {h.plist}",
        f"launchctl bootstrap {DOMAIN} {h.plist}",
    ]
    assert done.stdout == (
        f"reinstalled {LABEL}: booted out the old job, wrote {h.plist}, "
        f"bootstrapped {LABEL}.plist into {DOMAIN} (after 1 retry)\n"
    )
    assert h.loaded_plist()["EnvironmentVariables"]["HF_HOME"] == str(h.root / "hf")


def test_plist_on_disk_but_not_loaded_is_bootstrapped_without_bootout(h: LaunchdHarness) -> None:
    assert h.install().returncode == 0
    h.calls()
    (h.state / "loaded" / LABEL).unlink()  # e.g. after a logout/login with the agent toggled off
    done = h.install()
    assert done.returncode == 0, done.stderr
    assert h.calls() == fresh_bootstrap(h)
    assert done.stdout == f"installed {LABEL}: bootstrapped {LABEL}.plist into {DOMAIN}\n"


def test_disabled_label_is_enabled_before_bootstrap(h: LaunchdHarness) -> None:
    h.mark("disabled", LABEL)  # `launchctl disable` persists across uninstall; bootstrap would fail 119
    done = h.install()
    assert done.returncode == 0, done.stderr
    assert h.calls()[1:] == [f"launchctl enable {TARGET}", f"launchctl bootstrap {DOMAIN} {h.plist}"]
    assert not h.is_marked("disabled", LABEL)


def test_permanent_bootstrap_failure_shows_launchctl_text_and_exits_nonzero(h: LaunchdHarness) -> None:
    h.fail("launchctl", "bootstrap", 1, "Bootstrap failed: 1: Operation not permitted")
    done = h.install()
    assert done.returncode == 1
    assert h.calls()[-1] == f"launchctl bootstrap {DOMAIN} {h.plist}"  # not retried: not the EIO window
    assert "Bootstrap failed: 1: Operation not permitted" in done.stderr
    assert f"`launchctl bootstrap {DOMAIN} {h.plist}` failed (exit 1)" in done.stderr
    assert "run `veloxd install` again" in done.stderr
    assert done.stdout == ""


def test_eio_retries_follow_the_interval_until_the_deadline(h: LaunchdHarness, monkeypatch: pytest.MonkeyPatch) -> None:
    """In process, with a fake clock that only the retry sleeps advance: exactly deadline/interval retries."""
    from veloxd.service import launchctl

    h.fail("launchctl", "bootstrap", 5, EIO)
    for name, value in h.env.items():
        monkeypatch.setenv(name, value)
    now = [100.0]
    result, retries = launchctl.bootstrap_with_retry(
        str(h.plist), deadline_s=1.0, sleep=lambda s: now.__setitem__(0, now[0] + s), clock=lambda: now[0]
    )
    assert result.returncode == 5 and launchctl.is_transient_bootstrap_failure(result)
    assert retries == 4  # attempts at t+0, 0.25, 0.5, 0.75 failed and were retried; the one at t+1.0 is the last
    assert len([c for c in h.calls() if c.startswith("launchctl bootstrap")]) == 5


def test_eio_that_never_clears_gives_up_at_the_deadline(h: LaunchdHarness) -> None:
    h.fail("launchctl", "bootstrap", 5, EIO)
    done = h.install(VELOXD_BOOTSTRAP_DEADLINE_S="0.6")
    assert done.returncode == 1
    assert [c for c in h.calls() if c.startswith("launchctl bootstrap")], "never tried to bootstrap"
    assert "Bootstrap failed: 5: Input/output error" in done.stderr
    assert "Try re-running the command as root" in done.stderr
    assert "Allow in the Background" in done.stderr  # the usual cause of an EIO that never clears


def test_print_failure_other_than_not_loaded_stops_before_any_change(h: LaunchdHarness) -> None:
    h.fail("launchctl", "print", 112, "Could not find domain for user gui: 501")
    done = h.install()
    assert done.returncode == 1
    assert "Could not find domain" in done.stderr
    assert h.calls() == [f"launchctl print {TARGET}"]
    assert not h.plist.exists()


def test_uninstall_loaded_then_again_then_not_loaded(h: LaunchdHarness) -> None:
    assert h.install().returncode == 0
    h.calls()
    h.linger(LABEL, prints=1)
    done = h.run("uninstall")
    assert done.returncode == 0, done.stderr
    assert h.calls() == [f"launchctl bootout {TARGET}", f"launchctl print {TARGET}", f"launchctl print {TARGET}"]
    assert done.stdout == f"uninstalled {LABEL}: booted out of {DOMAIN}, removed {h.plist}\n"
    assert not h.plist.exists()

    twice = h.run("uninstall")
    assert twice.returncode == 0, twice.stderr
    assert h.calls() == [f"launchctl bootout {TARGET}"]
    assert twice.stdout == f"nothing to uninstall: {LABEL} is not loaded and {h.plist} does not exist\n"

    h.plist.parent.mkdir(parents=True, exist_ok=True)
    h.plist.write_bytes(plistlib.dumps({"Label": LABEL, "ExitTimeOut": 5}))
    stale = h.run("uninstall")
    assert stale.returncode == 0, stale.stderr
    assert stale.stdout == f"uninstalled {LABEL}: it was not loaded, removed {h.plist}\n"
    assert not h.plist.exists()


def test_uninstall_failure_keeps_the_plist_and_shows_launchctl_text(h: LaunchdHarness) -> None:
    assert h.install().returncode == 0
    h.fail("launchctl", "bootout", 1, "Boot-out failed: 1: Operation not permitted")
    done = h.run("uninstall")
    assert done.returncode == 1
    assert "Boot-out failed: 1: Operation not permitted" in done.stderr
    assert h.plist.exists()


def test_print_writes_nothing_and_calls_nothing(h: LaunchdHarness) -> None:
    done = h.install("--print")
    assert done.returncode == 0, done.stderr
    assert plistlib.loads(done.stdout.encode())["Label"] == LABEL
    assert not (h.home / "Library").exists()
    assert h.calls() == []
    assert not h.state.exists()


def test_custom_label_names_the_file_and_the_service(h: LaunchdHarness) -> None:
    done = h.install("--label", "com.example.veloxd-test")
    assert done.returncode == 0, done.stderr
    custom = h.home / "Library" / "LaunchAgents" / "com.example.veloxd-test.plist"
    assert plistlib.loads(custom.read_bytes())["Label"] == "com.example.veloxd-test"
    assert h.calls()[-1] == f"launchctl bootstrap {DOMAIN} {custom}"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--config", "/nonexistent/veloxd.yaml"), "config file not found: /nonexistent/veloxd.yaml"),
        (("--label", "../evil"), "invalid label '../evil'"),
    ],
)
def test_bad_input_exits_2_before_touching_anything(h: LaunchdHarness, args: tuple[str, ...], message: str) -> None:
    done = h.run("install", *args)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert h.calls() == [] and not (h.home / "Library").exists()


@pytest.mark.skipif(sys.platform == "darwin", reason="macOS has a real launchctl in /usr/bin")
def test_without_launchctl_install_says_to_use_systemd(h: LaunchdHarness) -> None:
    done = h.install(PATH="/nonexistent")
    assert done.returncode == 2
    assert "launchctl not found on PATH" in done.stderr and "--systemd" in done.stderr
    assert not (h.home / "Library").exists()


def test_reinstall_whose_plist_cannot_be_written_leaves_the_old_job_running(h: LaunchdHarness) -> None:
    """The new plist is written before the bootout: when it cannot be, the old job is not touched."""
    assert h.install().returncode == 0
    h.calls()
    agents = h.plist.parent
    for child in agents.iterdir():
        child.unlink()
    agents.rmdir()
    agents.symlink_to(h.root / "unmounted-volume")  # root cannot write through a link to nowhere either

    done = h.install(HF_HOME=str(h.root / "hf"))  # a changed plist: a replace
    assert done.returncode == 1
    assert done.stderr.splitlines()[-2:] == [
        f"veloxd install: cannot write {h.plist}: {agents} is a broken symlink; nothing was changed",
        "veloxd install: fix the cause above and run `veloxd install` again (re-running is safe)",
    ]
    assert "Traceback" not in done.stderr
    assert h.calls() == [f"launchctl print {TARGET}"]  # never booted out
    assert h.is_marked("loaded", LABEL)


def test_a_failed_bootout_leaves_the_old_plist_and_no_staged_file(h: LaunchdHarness) -> None:
    assert h.install().returncode == 0
    first = h.plist.read_bytes()
    h.fail("launchctl", "bootout", 1, "Boot-out failed: 1: Operation not permitted")
    done = h.install(HF_HOME=str(h.root / "hf"))
    assert done.returncode == 1
    assert "Boot-out failed: 1: Operation not permitted" in done.stderr
    assert h.plist.read_bytes() == first
    assert sorted(p.name for p in h.plist.parent.iterdir()) == [h.plist.name]  # the staged plist is gone
    assert h.is_marked("loaded", LABEL)


def _agents_dir_is_a_file(h: LaunchdHarness) -> str:
    h.plist.parent.parent.mkdir(parents=True)
    h.plist.parent.write_text("not a directory")
    return f"cannot read {h.plist}: {h.plist.parent} is not a directory"


def _plist_is_a_directory(h: LaunchdHarness) -> str:
    h.plist.mkdir(parents=True)
    return f"cannot read {h.plist}: Is a directory"


@pytest.mark.parametrize("command", ["install", "uninstall"])
@pytest.mark.parametrize("setup", [_agents_dir_is_a_file, _plist_is_a_directory])
def test_a_plist_path_that_cannot_be_read_is_one_line_before_launchctl(
    h: LaunchdHarness, command: str, setup: Callable[[LaunchdHarness], str]
) -> None:
    message = setup(h)
    h.mark("loaded", LABEL, f"{h.plist}\n")  # a job launchd still holds: uninstall must not boot it out
    done = h.install() if command == "install" else h.run("uninstall")
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith(f"veloxd {command}: ")]
    assert errors[0] == f"veloxd {command}: {message}"
    assert "Traceback" not in done.stderr
    assert h.calls() == []
    assert h.is_marked("loaded", LABEL)


def test_uninstall_bootout_eio_hints_at_the_domain_not_at_login_items(h: LaunchdHarness) -> None:
    assert h.install().returncode == 0
    h.fail("launchctl", "bootout", 5, "Boot-out failed: 5: Input/output error")
    done = h.run("uninstall")
    assert done.returncode == 1
    assert "Boot-out failed: 5: Input/output error" in done.stderr
    assert f"see which domain holds the job (`launchctl print {TARGET}`" in done.stderr
    assert "Allow in the Background" not in done.stderr and "print-disabled" not in done.stderr
    assert h.plist.exists()


def test_install_config_that_is_a_directory_says_so(h: LaunchdHarness) -> None:
    done = h.run("install", "--config", str(h.config.parent))
    assert done.returncode == 2
    assert done.stderr.strip() == (
        f"veloxd install: config path is a directory, not a file: {h.config.parent} (pass --config FILE)"
    )


@pytest.mark.parametrize(
    ("flag", "where", "message"),
    [
        ("--state-dir", "file", "cannot create the state directory {root}/file: {root}/file is not a directory"),
        ("--state-dir", "file/state", "cannot create the state directory {root}/file/state: {root}/file is not a directory"),
        ("--log-file", "file/logs/veloxd.jsonl", "cannot create the log directory {root}/file/logs: {root}/file is not a directory"),
        ("--log-file", "conf", "log file {root}/conf is a directory (pass --log-file FILE)"),
    ],
)  # fmt: skip
def test_install_refuses_log_and_state_paths_that_cannot_be_made(
    h: LaunchdHarness, flag: str, where: str, message: str
) -> None:
    (h.root / "file").write_text("in the way")
    # The other of the two paths is a good one, which must not be created either.
    good = (
        ("--log-file", str(h.root / "logs" / "x.jsonl"))
        if flag == "--state-dir"
        else ("--state-dir", str(h.root / "state"))
    )
    done = h.install(flag, str(h.root / where), *good)
    assert done.returncode == 2
    assert done.stderr.strip() == f"veloxd install: {message.format(root=h.root)}"
    assert h.calls() == []
    assert not (h.root / "logs").exists() and not (h.root / "state").exists()  # nothing half made
    assert not (h.home / "Library").exists()
