"""`veloxd pull`: fetch the models of config entries (or given ids) in the foreground, with progress.

With --progress-json it is the daemon's download step: protocol lines on stdout, the verdict
in the exit code (veloxd/download/protocol.py). Config entries are pulled in a child process
each, with the entry's `env:` (HF_TOKEN, HF_HOME...), exactly as the daemon would.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from veloxd import lifeline, protocol
from veloxd.launch import veloxd_argv
from veloxd.paths import CONFIG_DEFAULT, default_config_path


def register(sub: Any) -> None:
    p = sub.add_parser(
        "pull",
        help="download the models of config entries now (all by default), with progress",
        description="Download the Hugging Face models of the named entries (all entries by default) into the "
        "Hugging Face cache, in the foreground: a progress bar on a terminal, plain lines otherwise. Only the "
        "files mlx_lm loads are fetched; an interrupted download continues where it stopped. Exit 0 when every "
        "model is complete, 2 when one cannot be fetched (not found, gated, no disk space, offline), 75 on "
        "network trouble, 1 otherwise.",
    )
    p.add_argument("names", nargs="*", metavar="NAME", help="server names (keys under `servers:`); default: all")
    p.add_argument("--config", type=Path, help=f"config file (default: {CONFIG_DEFAULT})")
    p.add_argument(
        "--model",
        action="append",
        metavar="ID",
        help="a Hugging Face id to fetch instead of config entries (repeatable)",
    )
    p.add_argument(
        "--progress-json",
        action="store_true",
        help="print machine-readable `VELOXD_DOWNLOAD {json}` "
        "lines on stdout instead of a progress bar (the daemon's download step)",
    )
    # Set by `veloxd pull NAME` for its children: their failure message goes to a person, not the daemon.
    p.add_argument("--for-person", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(protocol.LIFELINE_FLAG, type=int, help=argparse.SUPPRESS)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.lifeline_fd is not None:
        # The daemon died: stop at once; the partial files stay for next time.
        lifeline.watch(args.lifeline_fd, lambda: os._exit(1))
    if args.model:
        if args.names:
            print("veloxd pull: error: give server NAMEs or --model, not both", file=sys.stderr)
            return 2
        ids = _hub_ids(args.model)
        if isinstance(ids, int):
            return ids
        for_person = args.for_person or not args.progress_json
        return _worst([_pull_here(model, args.progress_json, for_person) for model in ids])
    targets = _targets(args)
    if isinstance(targets, int):
        return targets
    try:
        return _worst([_pull_child(label, model, env, args.progress_json) for label, model, env in targets])
    except KeyboardInterrupt:
        print("\nveloxd pull: interrupted; run it again to continue where it stopped", file=sys.stderr)
        return 130


def _targets(args: argparse.Namespace) -> list[tuple[str, str, dict[str, str]]] | int:
    """(label, model, env) per distinct model of the named entries; an exit code on bad input."""
    from veloxd.config.loader import inspect_config
    from veloxd.daemon.process import worker_env
    from veloxd.download.cache import is_hub_model

    path = (args.config or default_config_path()).expanduser()
    result = inspect_config(str(path))
    if result.config is None:
        for issue in result.issues:
            print(issue, file=sys.stderr)
        return 2 if result.unreadable else 1
    servers = result.config.servers
    unknown = [n for n in args.names if n not in servers]
    if unknown:
        known = ", ".join(servers) or "none"
        print(
            f"veloxd pull: error: no server named {', '.join(map(repr, unknown))} in {path} (servers: {known})",
            file=sys.stderr,
        )
        return 2
    targets: dict[tuple[str, tuple[tuple[str, str], ...]], list[str]] = {}
    for name in args.names or list(servers):
        entry = servers[name]
        if not is_hub_model(entry.model):
            print(f"{name}: {entry.model} is a local directory: nothing to download")
            continue
        targets.setdefault((entry.model, tuple(sorted(entry.env.items()))), []).append(name)
    return [(f"{'+'.join(names)} ({model})", model, worker_env(dict(env))) for (model, env), names in targets.items()]


def _hub_ids(models: list[str]) -> list[str] | int:
    """The --model values to fetch, each checked as `veloxd check` checks `model:`; exit 2 naming any that
    is neither a Hugging Face id nor an existing directory (a local directory needs no download)."""
    from veloxd.checks import is_hf_id, resolve_model

    ids, refused = [], False
    for model in dict.fromkeys(models):
        if is_hf_id(model):
            ids.append(model)
            continue
        ref = resolve_model(model, Path.cwd())
        if ref.problem:
            print(f"veloxd pull: error: --model {model}: {ref.problem}", file=sys.stderr)
            refused = True
        else:
            print(f"{model}: {ref.value} is a local directory: nothing to download")
    return 2 if refused else ids


def next_step(reason: str, message: str) -> str:
    """A failure as a person running `veloxd pull` should read it: what to do next, not what the daemon does."""
    if reason == "network":
        return (
            message.removesuffix("; retrying") + ": check the network connection (and a proxy or HF_ENDPOINT if "
            "you use one), then run `veloxd pull` again; the files already fetched are kept and it continues "
            "where it stopped (the daemon retries by itself with backoff)"
        )
    return message


def _pull_here(model: str, as_json: bool, for_person: bool) -> int:
    """Pull in this process (`--model`): the download step itself."""
    from veloxd.download.fetch import pull
    from veloxd.download.hub import DownloadError
    from veloxd.download.protocol import exit_code_for

    renderer = _renderer(model, as_json)
    try:
        pull(model, renderer)
    except DownloadError as err:
        if as_json:
            renderer("failed", model=model, reason=err.reason, message=err.message)
        shown = next_step(err.reason, err.message) if for_person else err.message
        print(f"veloxd pull: {shown}", file=sys.stderr, flush=True)
        return exit_code_for(err.reason)
    except KeyboardInterrupt:
        if not as_json:  # as a child of `veloxd pull NAME`, the parent says it once
            print(f"\nveloxd pull: interrupted; run it again to continue {model} where it stopped", file=sys.stderr)
        return 130
    finally:
        getattr(renderer, "close", lambda: None)()
    return 0


def _pull_child(label: str, model: str, env: dict[str, str], as_json: bool) -> int:
    """Pull in a child with the entry's environment; render its protocol lines here."""
    from veloxd.download.protocol import parse_line

    renderer = _renderer(label, as_json)
    argv = veloxd_argv("pull", "--progress-json", "--for-person", "--model", model)
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, text=True, errors="replace")
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            event = parse_line(line.rstrip("\n"))
            if event is None:
                sys.stdout.write(line)
            elif event["event"] != "failed":  # the child names the reason on stderr already
                renderer(**event)
    finally:
        getattr(renderer, "close", lambda: None)()
        code = proc.wait()
    return code


def _renderer(label: str, as_json: bool) -> Any:
    from veloxd.download.render import JsonLines, PlainLines, ProgressBar

    if as_json:
        return JsonLines()
    return ProgressBar(label) if sys.stderr.isatty() else PlainLines(label)


def _worst(codes: list[int]) -> int:
    """0 if all succeeded, else the first failure's code."""
    return next((code for code in codes if code != 0), 0)
