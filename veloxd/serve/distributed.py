"""One rank of a distributed `veloxd serve` (started on every host by MLX's launcher).

Every rank loads its shard through mlx_lm (`sharded_load`: tensor parallel splits every layer's
heads, pipeline gives each rank a run of layers), wires veloxd's caches on its own attention
layers and measures them with the same probe prefill (the prefill's collectives run in lockstep
on every rank). The ranks then pool their figures with one `all_sum`, so READY comes from
rank 0 only after every rank is loaded and wired, carrying each rank's measured KV bytes.
Rank 0 serves HTTP; the others run mlx_lm's generation loop, which takes every request, batch
decision and cache removal from rank 0 (`ResponseGenerator._share_request`/`_share_object`).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

import mlx.core as mx

from veloxd import protocol
from veloxd.distributed.checks import PIPELINE_NEEDS_FP16
from veloxd.serve import preflight
from veloxd.serve.adapter import (
    PinnedProvider,
    ServerHandle,
    check_version,
    handler_class,
    model_names,
    server_args,
    start_generator,
)
from veloxd.serve.doorbell import Doorbell, connect_group
from veloxd.serve.lifeline import Stopper, watch_lifeline
from veloxd.serve.limits import EffectiveLimits
from veloxd.serve.options import ServeOptions
from veloxd.serve.wiring import Wiring, wire_caches
from veloxd.serve.worker import ready_payload

FIGURES = ("pid", "kv_method", "kv_fp16", "layer_caches", "load_s", "kv_total_method", "kv_total_fp16")


def precheck_sharding(options: ServeOptions) -> str | None:
    """Before loading weights: can mlx_lm shard this local model the way the entry asks?"""
    config_file = Path(options.model).expanduser() / "config.json"
    if not config_file.is_file():
        return None  # a Hugging Face id: sharded_load itself says so
    from mlx_lm.models.pipeline import PipelineMixin
    from mlx_lm.utils import _get_classes

    model_class, _ = _get_classes(json.loads(config_file.read_text()))
    module = sys.modules[model_class.__module__]
    if options.distributed == "tensor" and not hasattr(model_class, "shard"):
        return f"model type of {options.model} has no tensor-parallel sharding in mlx_lm; use parallelism: pipeline"
    if options.distributed == "pipeline" and options.kv.method != "fp16":
        return "error: --distributed pipeline: " + PIPELINE_NEEDS_FP16
    if options.distributed == "pipeline" and not any(
        isinstance(c, type) and issubclass(c, PipelineMixin) for c in vars(module).values()
    ):
        return f"model type of {options.model} has no pipeline support in mlx_lm; use parallelism: tensor"
    return None


def rank_hosts() -> list[str]:
    """Each rank's address as MLX's launcher handed it over (ring: MLX_HOSTFILE), else []."""
    try:
        ranks = json.loads(Path(os.environ["MLX_HOSTFILE"]).read_text())
        return [str(r[0]).rsplit(":", 1)[0] if r else "?" for r in ranks]
    except (KeyError, OSError, ValueError, TypeError, IndexError):
        return []


def pool_figures(group: Any, wiring: Wiring, load_s: float) -> list[dict[str, Any]]:
    """Every rank's figures, on every rank (one all_sum of a [ranks, figures] table)."""
    # totals at the summary's context (4k): an evicting rank's ratio is of its capped totals, not
    # of bytes per added token (which are nil once its budget fits in one capacity step)
    total = wiring.kv_memory["at"][str(wiring.kv_bytes_per_token["tokens"])]
    mine = [
        os.getpid(),
        wiring.kv_bytes_per_token["method"],
        wiring.kv_bytes_per_token["fp16"],
        sum(wiring.layer_caches.values()),
        load_s,
        total["method"],
        total["fp16"],
    ]
    table = mx.zeros((group.size(), len(FIGURES)), dtype=mx.float32)
    table[group.rank()] = mx.array(mine, dtype=mx.float32)
    rows: Any = mx.distributed.all_sum(table, group=group).tolist()
    hosts = rank_hosts()
    out = []
    for rank, row in enumerate(rows):
        pid, method, fp16, layers, load, total_method, total_fp16 = row
        out.append(
            {
                "rank": rank,
                "pid": int(pid),
                "host": hosts[rank] if rank < len(hosts) else None,
                "kv_bytes_per_token": {"method": round(method, 1), "fp16": round(fp16, 1)},
                "layer_caches": int(layers),
                "load_s": round(load, 3),
                "kv_total": {"method": round(total_method), "fp16": round(total_fp16)},
            }
        )
    return out


def leader_ip() -> str | None:
    """Rank 0's address as the other ranks reach it (ring: MLX_HOSTFILE; jaccl: its coordinator)."""
    hosts = rank_hosts()
    if hosts:
        return hosts[0]
    coordinator = os.environ.get("MLX_JACCL_COORDINATOR")
    return coordinator.rsplit(":", 1)[0] if coordinator else None


def ring_doorbell(group: Any) -> Doorbell | None:
    """Set up the followers' doorbell (every rank calls this at the same point)."""

    def exchange(words: list[int]) -> list[int]:
        summed: Any = mx.distributed.all_sum(mx.array(words, dtype=mx.int32), group=group).tolist()
        return [int(w) for w in summed]

    def vote(ok: bool) -> bool:
        agreed: Any = mx.distributed.all_sum(mx.array(int(ok), dtype=mx.int32), group=group).item()
        return int(agreed) == group.size()

    return connect_group(group.rank(), group.size(), leader_ip(), exchange, vote)


def group_payload(
    options: ServeOptions,
    model_id: str,
    wiring: Wiring,
    limits: EffectiveLimits,
    load_s: float,
    ranks: list[dict[str, Any]],
) -> protocol.ReadyPayload:
    """The READY payload: the group's totals at the top level, each rank's figures under `distributed`."""
    payload = ready_payload(options, model_id, wiring, limits, load_s)
    method = sum(r["kv_bytes_per_token"]["method"] for r in ranks)
    fp16 = sum(r["kv_bytes_per_token"]["fp16"] for r in ranks)
    total_method = sum(r["kv_total"]["method"] for r in ranks)
    total_fp16 = sum(r["kv_total"]["fp16"] for r in ranks)
    tokens = wiring.kv_bytes_per_token["tokens"]
    payload["kv_bytes_per_token"] = {
        **wiring.kv_bytes_per_token,
        "method": round(method, 1),
        "fp16": round(fp16, 1),
        "ratio": round(total_method / total_fp16, 4) if total_fp16 else None,
        "source": (
            f"bytes per added token: measured, summed over {len(ranks)} ranks; ratio of the ranks' "
            f"summed totals at {tokens} tokens (derived from measurements, as on one process)"
        ),
    }
    payload["load_s"] = round(max(r["load_s"] for r in ranks), 3)
    payload["distributed"] = {"parallelism": options.distributed, "world_size": len(ranks), "ranks": ranks}
    return payload


def serve_rank(options: ServeOptions) -> int:
    check_version()
    refused = preflight.refusal(options.model, options.kv)
    try:
        refused = refused or precheck_sharding(options)
    except ValueError as err:
        refused = f"error: cannot shard {options.model}: {err}"
    if refused:
        print(f"veloxd serve: {refused}", file=sys.stderr)
        return 2
    group = mx.distributed.init()
    if group.size() < 2:
        print(
            "veloxd serve: error: --distributed: this process is not one rank of a group "
            "(start it with mlx.launch, as the daemon does for a `distributed:` entry)",
            file=sys.stderr,
        )
        return 2
    rank = group.rank()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(levelname)s - %(message)s")
    stopper = Stopper()
    model_id, names = model_names(options.model)
    started = time.monotonic()

    def on_loaded(model: Any, tokenizer: Any) -> bool:
        try:
            wiring = wire_caches(model, options.kv)
            ranks = pool_figures(group, wiring, time.monotonic() - started)
            provider.doorbell = ring_doorbell(group)
        except ValueError as err:
            stopper.stop(2, f"error: cannot serve {model_id} with method {options.kv.method}: {err}")
            raise
        except Exception:
            stopper.stop(3, "error: wiring the KV cache failed:\n" + traceback.format_exc())
            raise
        if rank == 0:
            payload = group_payload(options, model_id, wiring, provider.limits, time.monotonic() - started, ranks)
            payload["distributed"]["idle"] = "doorbell" if provider.doorbell is not None else "polling"
            print(protocol.format_ready(payload), flush=True)
        return wiring.batchable

    cli_args = server_args(
        model=options.model,
        host=options.host,
        port=options.port,
        max_tokens=options.max_tokens,
        temp=options.temp,
        top_p=options.top_p,
        prompt_cache_size=options.prompt_cache_size,
        prompt_cache_bytes=options.prompt_cache_bytes,
        pipeline=options.distributed == "pipeline",
    )
    provider = PinnedProvider(cli_args, names, on_loaded, options.limits)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # SIGHUP: a remote rank's ssh went away
        signal.signal(signum, lambda *_: stopper.stop(0))
    if options.lifeline_fd is not None:
        threading.Thread(target=watch_lifeline, args=(options.lifeline_fd, stopper), daemon=True).start()
    if rank != 0:
        generator = start_generator(provider)
        threading.Thread(target=_watch, args=(generator, stopper), daemon=True).start()
        stopper.stopped.wait()
        return stopper.code or 0
    try:
        handler = handler_class(model_id, names, options.api_key, limits=options.limits)
        handle = ServerHandle(options.host, options.port, provider, handler)
    except OSError as err:
        print(
            f"veloxd serve: error: --port {options.port}: cannot bind {options.host}:{options.port} ({err.strerror})",
            file=sys.stderr,
        )
        return 2
    stopper.handle = handle
    threading.Thread(target=_watch, args=(handle.generator, stopper), daemon=True).start()
    if stopper.code is None:
        handle.serve_forever()
    # The generation thread may wait in a collective for ranks that are gone: do not wait long.
    handle.close(join_timeout=1.0)
    return stopper.code or 0


def _watch(generator: Any, stopper: Stopper) -> None:
    generator._generation_thread.join()
    stopper.stop(3, "mlx_lm's generation thread stopped (see the error above); exiting")
