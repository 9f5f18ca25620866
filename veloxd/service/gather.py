"""Collect the machine facts an `AgentSpec` needs: the venv interpreter, HOME, default paths, HF cache
variables, the slowest server's stop_timeout_s, and whether that interpreter can import veloxd."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

import veloxd
from veloxd import paths
from veloxd.service.pathcheck import dir_problem
from veloxd.service.spec import FORWARDED_ENV, AgentSpec


def default_stop_timeout_s() -> float:
    """The config format's own default for stop_timeout_s (one source of truth: ServerEntry)."""
    try:
        from veloxd.config.model import ServerEntry

        default = next(f.default for f in dataclasses.fields(ServerEntry) if f.name == "stop_timeout_s")
    except (ImportError, StopIteration):  # config package absent or reshaped: its documented default
        return 30.0
    return float(default) if isinstance(default, int | float) else 30.0


class InstallError(Exception):
    """A user-facing problem found before anything was written (exit 2)."""


@dataclass
class Gathered:
    spec: AgentSpec
    notes: list[str] = field(default_factory=list)  # warnings for stderr; the install still proceeds


def interpreter() -> str:
    """The venv's bin/python as invoked: abspath, not resolve(), so the venv symlink is kept and the
    venv's site-packages load (resolving would name the base interpreter without them)."""
    return os.path.abspath(sys.executable)


def absolute(path: str | os.PathLike[str]) -> str:
    return os.path.abspath(os.path.expanduser(os.fspath(path)))


def max_stop_timeout(config_path: str) -> tuple[float, str | None]:
    """The largest stop_timeout_s across the config's servers, or the default and a note saying why."""
    default = default_stop_timeout_s()
    fallback = f"the stop grace (ExitTimeOut / TimeoutStopSec) assumes the default stop_timeout_s of {default:g} s"
    try:
        from veloxd.config import load_config
    except ImportError:
        return default, f"note: the config loader is not available; {fallback}"
    try:
        config = load_config(config_path)
    except Exception as err:  # ConfigError lists every problem (one per line); show the first
        issues = str(err).strip().splitlines() or [type(err).__name__]
        more = f" and {len(issues) - 1} more" if len(issues) > 1 else ""
        return default, (
            f"warning: {config_path} is not valid: {issues[0]}{more} (`veloxd check` lists them); "
            f"the daemon will run degraded until it is fixed; {fallback}"
        )
    timeouts = [float(entry.stop_timeout_s) for entry in config.servers.values()]
    if not timeouts:
        return default, f"note: {config_path} declares no servers; {fallback}"
    return max(timeouts), None


def _imports_veloxd(python: str, env: dict[str, str], cwd: str) -> bool:
    try:
        probe = subprocess.run(
            # -P as the agent runs it: a `veloxd` folder in cwd must not hide an (editable) install
            [python, "-P", "-c", "import veloxd.cli"],
            env=env,
            cwd=cwd,
            capture_output=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.returncode == 0


def gather(label: str, config: str | None, log_file: str | None = None, state_dir: str | None = None) -> Gathered:
    config_path = absolute(config if config else paths.default_config_path())
    if os.path.isdir(config_path):
        raise InstallError(f"config path is a directory, not a file: {config_path} (pass --config FILE)")
    if not os.path.isfile(config_path):
        raise InstallError(f"config file not found: {config_path} (create it, or pass --config FILE)")
    home = absolute(Path.home())
    stop_timeout, note = max_stop_timeout(config_path)
    extra_env = {name: absolute(os.environ[name]) for name in FORWARDED_ENV if os.environ.get(name)}
    spec = AgentSpec(
        label=label,
        python=interpreter(),
        config=config_path,
        log_file=absolute(log_file if log_file else paths.default_log_file()),
        state_dir=absolute(state_dir if state_dir else paths.default_state_dir()),
        home=home,
        working_dir=os.path.dirname(config_path),  # relative paths in the config resolve as they do beside it
        max_stop_timeout_s=stop_timeout,
        extra_env=extra_env,
    )
    _check_dirs(spec)
    gathered = Gathered(spec, [note] if note else [])
    _ensure_importable(gathered)
    return gathered


def _check_dirs(spec: AgentSpec) -> None:
    """install creates the log and state directories (launchd creates neither): refuse, before anything is
    written, a path that cannot be one, so the install is not left half done."""
    if os.path.isdir(spec.log_file):
        raise InstallError(f"log file {spec.log_file} is a directory (pass --log-file FILE)")
    for role, directory in (("log directory", spec.paths["log_dir"]), ("state directory", spec.state_dir)):
        problem = dir_problem(Path(directory))
        if problem is not None:
            raise InstallError(f"cannot create the {role} {directory}: {problem}")


def _ensure_importable(gathered: Gathered) -> None:
    """launchd gives a clean environment: check the agent's own command can import veloxd, else the job
    would crash-loop on ModuleNotFoundError. A source checkout that is not pip-installed gets PYTHONPATH."""
    spec = gathered.spec
    if _imports_veloxd(spec.python, spec.environment, spec.working_dir):
        return
    source_root = str(Path(veloxd.__file__).resolve().parent.parent)
    with_path = replace(spec, extra_env={**spec.extra_env, "PYTHONPATH": source_root})
    if not _imports_veloxd(with_path.python, with_path.environment, with_path.working_dir):
        raise InstallError(
            f"{spec.python} cannot import veloxd outside a shell; install it into that environment "
            f"(`{spec.python} -m pip install -e {source_root}`) and run `veloxd install` again"
        )
    gathered.spec = with_path
    gathered.notes.append(
        f"note: veloxd is not installed in {os.path.dirname(os.path.dirname(spec.python))}; "
        f"the agent imports it from {source_root} via PYTHONPATH (`pip install -e .` makes that unnecessary)"
    )
