"""The `veloxd serve` process: load on mlx_lm's generation thread, wire caches, READY, serve, stop.

Exit codes (veloxd.protocol.ExitCode): 0 clean stop (SIGTERM/SIGINT, or the daemon's lifeline
closed), 2 the model cannot be served with this method (never fixes itself), 3 the model failed
to load or the generation thread died (worth a restart). A stop interrupts running requests:
the worker is gone within about STOP_JOIN_S even in the middle of a prefill.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from veloxd import protocol
from veloxd.kv import KVCacheConfig
from veloxd.protocol import ExitCode
from veloxd.serve import figures, preflight
from veloxd.serve.lifeline import Stopper
from veloxd.serve.limits import EffectiveLimits
from veloxd.serve.mlx_compat.generators import generation_thread
from veloxd.serve.mlx_compat.handler import handler_class
from veloxd.serve.mlx_compat.httpd import ServerHandle
from veloxd.serve.mlx_compat.models import check_version
from veloxd.serve.mlx_compat.provider import UPSTREAM_DEFAULTS, PinnedProvider, model_names, server_args
from veloxd.serve.options import ServeOptions
from veloxd.serve.wiring import measured, wire_caches

STOP_JOIN_S = 2.0  # after a stop, wait this long for the generation thread's current step, then leave


def endpoints(host: str, port: int) -> dict[str, str]:
    shown = f"[{host}]" if ":" in host else host
    base = f"http://{shown}:{port}"
    return {
        "openai_base_url": f"{base}/v1",
        "chat_completions": f"{base}/v1/chat/completions",
        "completions": f"{base}/v1/completions",
        "models": f"{base}/v1/models",
        "health": f"{base}/health",
    }


def memory_facts(model: Any) -> dict[str, Any]:
    """Loaded weight bytes and (Metal) MLX's recommended working set: the gateway's memory admission reads them."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    flat: Any = tree_flatten(model.parameters())  # [(path, array), ...]
    weights = sum(int(value.nbytes) for _, value in flat)
    working_set = None
    try:
        if mx.metal.is_available():
            working_set = int(mx.metal.device_info().get("max_recommended_working_set_size") or 0) or None
    except (AttributeError, RuntimeError):
        working_set = None
    return {"weights_bytes": weights, "recommended_working_set_bytes": working_set}


def ready_payload(
    options: ServeOptions,
    model_id: str,
    wiring: Any,
    limits: EffectiveLimits,
    load_s: float,
    memory: dict[str, Any] | None = None,
    warnings: list[str] | None = None,
) -> protocol.ReadyPayload:
    info = options.info
    return {
        "schema_version": protocol.READY_SCHEMA_VERSION,
        "model": model_id,
        "method": options.kv.method,
        "bits": options.kv.bits,
        "config": options.kv.applied(),  # the full config: `veloxd status --json`
        "host": options.host,
        "port": options.port,
        "pid": os.getpid(),
        "layer_caches": wiring.layer_caches,
        "batchable": wiring.batchable,
        "trimmable": info.trimmable,
        "storage": info.storage,
        "auth": options.api_key_env is not None,
        "endpoints": endpoints(options.host, options.port),
        "kv_bytes_per_token": wiring.kv_bytes_per_token,
        "limits": limits.to_dict(),
        "kv_memory": wiring.kv_memory,
        "load_s": round(load_s, 3),
        "memory": memory or {},
        "warnings": warnings or [],
    }


def load_warnings(model: Any, kv: KVCacheConfig) -> list[str]:
    """What the loaded model tells about the method that the options could not (READY's `warnings`)."""
    from veloxd.kv.preflight import sharp_attention_warning

    warning = sharp_attention_warning(model, kv)
    return [] if warning is None else [warning]


def watch_generation(generator: Any, stopper: Stopper) -> None:
    """A dead generation thread behind a live port hangs every request: exit instead."""
    generation_thread(generator).join()
    stopper.stop(ExitCode.FAILED, "mlx_lm's generation thread stopped (see the error above); exiting")


@contextmanager
def stop_on_wiring_failure(stopper: Stopper, model_id: str, method: str) -> Iterator[None]:
    """Wiring the caches on the generation thread: a failure stops the worker with its exit code."""
    try:
        yield
    except ValueError as err:
        stopper.stop(ExitCode.INVALID, f"error: cannot serve {model_id} with method {method}: {err}")
        raise
    except Exception:
        stopper.stop(ExitCode.FAILED, "error: wiring the KV cache failed:\n" + traceback.format_exc())
        raise


def mlx_server_args(options: ServeOptions, **extra: Any) -> argparse.Namespace:
    """mlx_lm's server namespace for these options: every ServeOptions field mlx_lm's server has
    too (the model, adapter, address, sampling and prompt-cache defaults), then `extra`."""
    shared = {f.name: getattr(options, f.name) for f in dataclasses.fields(options) if f.name in UPSTREAM_DEFAULTS}
    return server_args(**shared, **extra)


def kept_figure(options: ServeOptions) -> figures.Measure:
    """The KV memory figure of these model files and KV settings: read back from the state
    directory when an earlier start measured it, else measured now and kept (veloxd.serve.figures)."""
    key = figures.figure_key(options.model, options.kv.to_dict(), options.adapter_path)
    return figures.reusing(figures.FigureStore(figures.state_dir()), key, measured)


def bind_server(options: ServeOptions, provider: PinnedProvider, model_id: str, names: set[str]) -> ServerHandle | None:
    """The HTTP server on --host/--port; None (the reason printed) when the port cannot be bound."""
    try:
        shown = options.served_names[0] if options.served_names else model_id  # the entry's name, under a daemon
        handler = handler_class(shown, names, options.api_key, limits=options.limits)
        return ServerHandle(options.host, options.port, provider, handler)
    except OSError as err:
        print(
            f"{protocol.WORKER_PREFIX}error: --port {options.port}: cannot bind {options.host}:{options.port} ({err.strerror})",
            file=sys.stderr,
        )
        return None


def serve(options: ServeOptions, stopper: Stopper | None = None) -> int:
    """Load, wire, READY, serve. `stopper` is the one the early lifeline watch already holds.
    (A distributed rank runs veloxd.serve.distributed.serve_rank instead: cli/serve.py picks.)"""
    check_version()
    refused = preflight.refusal(options.model, options.kv)
    if refused:
        print(f"{protocol.WORKER_PREFIX}{refused}", file=sys.stderr)
        return ExitCode.INVALID
    # Under the daemon every output line is already timestamped in its log: no second clock.
    shown = (
        protocol.WORKER_LOG_FORMAT if options.lifeline_fd is not None else "%(asctime)s - %(levelname)s - %(message)s"
    )
    logging.basicConfig(level=logging.INFO, format=shown)
    stopper = stopper or Stopper()
    model_id, names = model_names(options.model)
    names |= set(options.served_names)
    started = time.monotonic()

    def on_loaded(model: Any, tokenizer: Any) -> bool:
        with stop_on_wiring_failure(stopper, model_id, options.kv.method):
            wiring = wire_caches(model, options.kv, kept_figure(options))
        warnings = load_warnings(model, options.kv)
        for warning in warnings:
            print(f"{protocol.WORKER_PREFIX}warning: {warning}", file=sys.stderr, flush=True)
        payload = ready_payload(
            options, model_id, wiring, provider.limits, time.monotonic() - started, memory_facts(model), warnings
        )
        print(protocol.format_ready(payload), flush=True)
        return wiring.batchable

    provider = PinnedProvider(mlx_server_args(options), names, on_loaded, options.limits)
    handle = bind_server(options, provider, model_id, names)
    if handle is None:
        return ExitCode.PORT_IN_USE
    stopper.handle = handle
    if stopper.code is not None:  # the lifeline closed while loading: the timer ends us anyway
        return stopper.code
    stopper.stop_on_signals(signal.SIGTERM, signal.SIGINT)
    threading.Thread(target=watch_generation, args=(handle.generator, stopper), daemon=True).start()
    if stopper.code is None:
        handle.serve_forever()
    handle.close(join_timeout=STOP_JOIN_S)
    return stopper.code or ExitCode.OK
