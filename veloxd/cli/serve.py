"""The `veloxd serve` subcommand: flags, validation before load, then the worker."""

from __future__ import annotations

import argparse
import os
import sys

from veloxd import protocol
from veloxd.checks import size_text
from veloxd.kv import registry
from veloxd.kv.config import override_fields_for
from veloxd.serve.limits import RequestLimits
from veloxd.serve.options import PARALLELISMS, ServeOptions

BODY_HELP = f"largest request body, e.g. 64Mi; larger ones get 413 (default {size_text(RequestLimits.max_body_bytes)})"


def document_help() -> str:
    """The --entry-json document, described from protocol.ENTRY_KEYS (one list of keys)."""
    keys = ", ".join(f"{key} ({'|'.join(kinds)})" for key, kinds in protocol.ENTRY_KEYS.items())
    return (
        f"{protocol.ENTRY_JSON_FLAG} document: one JSON object, the daemon's way to pass a whole entry. "
        f'Keys: "version": {protocol.ENTRY_DOCUMENT_VERSION}, then each flag above by its name with "_" for "-" '
        f"(the value as the flag takes it; kv is the --kv-json object, served_name a list): {keys}. "
        f"Required: {', '.join(protocol.REQUIRED_ENTRY_KEYS)}; a key left out or null takes the flag's default. "
        f'Example: \'{{"version": 1, "model": "./m", "kv": {{"method": "kivi", "bits": 2}}, "port": 8081}}\''
    )


def register(sub: argparse._SubParsersAction) -> None:
    fields = "; ".join(f"{m}: {', '.join(override_fields_for(m)) or '-'}" for m in registry.names())
    p = sub.add_parser(
        "serve",
        help="run one OpenAI-compatible server with a compressed KV cache",
        description="Serve one MLX model through mlx_lm's OpenAI-compatible server with a compressed "
        "KV cache. Invalid flags exit 2 before the model loads. Prints one line "
        f"'{protocol.READY_PREFIX}{{json}}' on stdout once the model is loaded and the cache wired. "
        "KV settings come from --method/--bits/--seed/--set (by hand) or from one JSON document, "
        "--kv-json. The daemon passes everything as one JSON document, --entry-json (described below). Sizes: K/M/G decimal, Ki/Mi/Gi binary.",
        epilog=f"--set fields per method: {fields}. {document_help()}",
    )
    p.add_argument("--model", help="local model directory or Hugging Face id (required, unless --entry-json)")
    p.add_argument("--method", help=f"KV-cache method: {', '.join(registry.names())} (default affine)")
    p.add_argument("--bits", type=int, help="bits per element (valid values depend on the method)")
    p.add_argument("--seed", type=int, help="seed for rotations and sketches (methods that use one)")
    # Every setting flag defaults to None (ServeOptions holds the defaults): given means not None.
    p.add_argument("--host", help=f"bind address (default {ServeOptions.host})")
    p.add_argument("--port", type=int, help=f"port (default {ServeOptions.port})")
    p.add_argument("--adapter-path", help="LoRA adapter directory")
    p.add_argument("--max-tokens", type=int, help="default max tokens per completion")
    p.add_argument("--temp", type=float, help="default sampling temperature")
    p.add_argument("--top-p", type=float, help="default nucleus sampling top-p")
    p.add_argument("--prompt-cache-size", type=int, help="prompt caches kept for prefix reuse (count)")
    p.add_argument("--prompt-cache-bytes", help="byte bound of the prompt caches, e.g. 2G (batched path only)")
    p.add_argument("--set", action="append", metavar="FIELD=VALUE", help="a KVCacheConfig field (repeatable)")
    p.add_argument(
        protocol.KV_JSON_FLAG,
        metavar="JSON|FILE",
        help="every KV setting as one JSON object "
        '(KVCacheConfig.to_dict(), e.g. \'{"method": "kivi", "bits": 2}\') or a file holding it; '
        "replaces --method/--bits/--seed/--set",
    )
    p.add_argument(
        "--limit-max-tokens",
        type=int,
        metavar="N",
        help="most tokens a request may generate; "
        "larger requests are capped to it (default: the model's context length)",
    )
    p.add_argument(
        "--limit-max-prompt-tokens",
        type=int,
        metavar="N",
        help="longest prompt accepted; longer "
        "ones get HTTP 400 before any prefill (default: the model's context length)",
    )
    p.add_argument(
        "--request-body-timeout",
        type=float,
        metavar="S",
        help="seconds a client has to send its request body (slower: 408) and, in total, its headers "
        f"(default {RequestLimits.body_timeout_s:g})",
    )
    p.add_argument("--max-body-bytes", metavar="SIZE", help=BODY_HELP)
    p.add_argument(
        "--api-key-env", metavar="VAR", help="require 'Authorization: Bearer $VAR' on every request but /health"
    )
    p.add_argument(
        "--distributed",
        choices=PARALLELISMS,
        help="serve one rank of a sharded model; run under mlx.launch (veloxd starts it for a "
        "`distributed:` entry): rank 0 serves HTTP, the others follow it",
    )
    p.add_argument(
        "--served-name",
        action="append",
        metavar="NAME",
        help="another model name requests may use; responses then name it (repeatable)",
    )
    p.add_argument(
        protocol.ENTRY_JSON_FLAG,
        metavar="JSON|FILE",
        help="every setting as one JSON document, inline or a file holding it (what the daemon passes; "
        "keys below); no other flag but the daemon's lifeline may be given with it",
    )
    p.add_argument(protocol.LIFELINE_FLAG, type=int, help=argparse.SUPPRESS)  # the daemon's pipe: EOF means it died
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from veloxd.serve.lifeline import Stopper, start_watch
    from veloxd.serve.options import CannotListen, UsageError, build_options

    stopper = Stopper()
    start_watch(args.lifeline_fd, stopper)  # first: a daemon dying during import or load ends us too
    try:
        options = build_options(args)
    except UsageError as err:
        print(f"{protocol.WORKER_PREFIX}error: {err}", file=sys.stderr)
        return protocol.ExitCode.PORT_IN_USE if isinstance(err, CannotListen) else protocol.ExitCode.INVALID
    for warning in options.warnings:
        print(f"{protocol.WORKER_PREFIX}warning: {warning}", file=sys.stderr)
    if options.distributed is not None:  # imports mlx: only after validation
        from veloxd.serve.distributed import serve_rank

        code = serve_rank(options, stopper)
    else:
        from veloxd.serve.worker import serve

        code = serve(options, stopper)
    # Leave without interpreter teardown: MLX's C++ stream threads abort ("terminate called
    # without an active exception") when static destructors run after a served request.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
