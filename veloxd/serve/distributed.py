"""One rank of a distributed `veloxd serve` (started on every host by MLX's launcher).

Every rank loads its shard through mlx_lm (`sharded_load`: tensor parallel splits every layer's
heads, pipeline gives each rank a run of layers), wires veloxd's caches on its own attention
layers and measures them with the same probes (the one token step that reads the key/value
shapes runs its collectives in lockstep on every rank; veloxd.kv.probe). The ranks then pool their figures with one `all_sum`, so READY comes from
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
from pathlib import Path
from typing import Any

import mlx.core as mx

from veloxd import protocol
from veloxd.distributed.checks import PIPELINE_NEEDS_FP16
from veloxd.distributed.kv_figures import group_kv_memory
from veloxd.kv.footprint import summary
from veloxd.serve import preflight
from veloxd.serve.doorbell import Doorbell, connect_group
from veloxd.serve.lifeline import Stopper, start_watch
from veloxd.serve.limits import EffectiveLimits
from veloxd.serve.mlx_compat.generators import start_generator
from veloxd.serve.mlx_compat.models import check_version, model_classes
from veloxd.serve.mlx_compat.provider import PinnedProvider, model_names
from veloxd.serve.options import ServeOptions
from veloxd.serve.wiring import Wiring, wire_caches
from veloxd.serve.worker import (
    bind_server,
    load_warnings,
    mlx_server_args,
    ready_payload,
    stop_on_wiring_failure,
    watch_generation,
)

FIGURES = ("pid", "kv_method", "kv_fp16", "layer_caches", "load_s")


def precheck_sharding(options: ServeOptions) -> str | None:
    """Before loading weights: can mlx_lm shard this local model the way the entry asks?"""
    config_file = Path(options.model).expanduser() / "config.json"
    if not config_file.is_file():
        return None  # a Hugging Face id: sharded_load itself says so
    from mlx_lm.models.pipeline import PipelineMixin

    model_class, _ = model_classes(json.loads(config_file.read_text()))
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


def share_json(group: Any, value: Any) -> list[Any]:
    """Every rank's JSON-able `value`, on every rank, exactly: each rank writes its JSON bytes into
    its own row of an int32 table that the others leave at 0, and one all_sum gathers the rows
    (a first all_sum of the lengths sizes the table)."""
    data = json.dumps(value, sort_keys=True).encode()
    sizes = mx.zeros((group.size(),), dtype=mx.int32)
    sizes[group.rank()] = len(data)
    lengths: Any = mx.distributed.all_sum(sizes, group=group).tolist()
    table = mx.zeros((group.size(), max(lengths)), dtype=mx.int32)
    table[group.rank(), : len(data)] = mx.array(list(data), dtype=mx.int32)
    rows: Any = mx.distributed.all_sum(table, group=group).tolist()
    return [json.loads(bytes(row[:n]).decode()) for row, n in zip(rows, lengths, strict=True)]


def pool_figures(group: Any, wiring: Wiring, load_s: float) -> list[dict[str, Any]]:
    """Every rank's figures, on every rank (one all_sum of a [ranks, figures] table, and each
    rank's kv_memory document through `share_json`)."""
    mine = [
        os.getpid(),
        wiring.kv_bytes_per_token["method"],
        wiring.kv_bytes_per_token["fp16"],
        sum(wiring.layer_caches.values()),
        load_s,
    ]
    table = mx.zeros((group.size(), len(FIGURES)), dtype=mx.float32)
    table[group.rank()] = mx.array(mine, dtype=mx.float32)
    rows: Any = mx.distributed.all_sum(table, group=group).tolist()
    memories = share_json(group, wiring.kv_memory)
    hosts = rank_hosts()
    out = []
    for rank, row in enumerate(rows):
        pid, method, fp16, layers, load = row
        out.append(
            {
                "rank": rank,
                "pid": int(pid),
                "host": hosts[rank] if rank < len(hosts) else None,
                "kv_bytes_per_token": {"method": round(method, 1), "fp16": round(fp16, 1)},
                "kv_memory": memories[rank],
                "layer_caches": int(layers),
                "load_s": round(load, 3),
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
    """The READY payload: the group's totals (sums over the ranks, labelled so) at the top level,
    each rank's own figures under `distributed.ranks`."""
    payload = ready_payload(options, model_id, wiring, limits, load_s)
    payload["kv_memory"] = group_kv_memory([r["kv_memory"] for r in ranks])
    short = summary(payload["kv_memory"])
    short["source"] = (
        f"derived from kv_memory, summed over {len(ranks)} ranks: bytes per added token (measured), "
        f"ratio of totals at {short['tokens']} tokens"
    )
    payload["kv_bytes_per_token"] = short
    payload["load_s"] = round(max(r["load_s"] for r in ranks), 3)
    payload["distributed"] = {"parallelism": options.distributed, "world_size": len(ranks), "ranks": ranks}
    return payload


def serve_rank(options: ServeOptions, stopper: Stopper | None = None) -> int:
    """One rank: load, wire, pool figures, READY from rank 0, serve. `stopper` is the one the
    early lifeline watch (cli/serve.py) already holds: one watch per descriptor, one Stopper, so
    the lifeline's EOF goes through the same graceful stop as a signal."""
    check_version()
    refused = preflight.refusal(options.model, options.kv)
    try:
        refused = refused or precheck_sharding(options)
    except ValueError as err:
        refused = f"error: cannot shard {options.model}: {err}"
    if refused:
        print(f"{protocol.WORKER_PREFIX}{refused}", file=sys.stderr)
        return protocol.ExitCode.INVALID
    group = mx.distributed.init()
    if group.size() < 2:
        print(
            f"{protocol.WORKER_PREFIX}error: --distributed: this process is not one rank of a group "
            "(start it with mlx.launch, as the daemon does for a `distributed:` entry)",
            file=sys.stderr,
        )
        return protocol.ExitCode.INVALID
    rank = group.rank()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s - %(levelname)s - %(message)s")
    if stopper is None:  # called without the early watch (tests, by hand): watch the lifeline here
        stopper = Stopper()
        start_watch(options.lifeline_fd, stopper)
    model_id, names = model_names(options.model)
    names |= set(options.served_names)  # the entry's name, as a single worker accepts it
    started = time.monotonic()

    def on_loaded(model: Any, tokenizer: Any) -> bool:
        with stop_on_wiring_failure(stopper, model_id, options.kv.method):
            wiring = wire_caches(model, options.kv)
            ranks = pool_figures(group, wiring, time.monotonic() - started)
            provider.doorbell = ring_doorbell(group)
        if rank == 0:
            payload = group_payload(options, model_id, wiring, provider.limits, time.monotonic() - started, ranks)
            payload["warnings"] = load_warnings(model, options.kv)  # as a single worker's READY
            for warning in payload["warnings"]:
                print(f"{protocol.WORKER_PREFIX}warning: {warning}", file=sys.stderr, flush=True)
            payload["distributed"]["idle"] = "doorbell" if provider.doorbell is not None else "polling"
            print(protocol.format_ready(payload), flush=True)
        return wiring.batchable

    provider = PinnedProvider(
        mlx_server_args(options, pipeline=options.distributed == "pipeline"), names, on_loaded, options.limits
    )
    stopper.stop_on_signals(signal.SIGTERM, signal.SIGINT, signal.SIGHUP)  # SIGHUP: a remote rank's ssh went away
    if rank != 0:
        generator = start_generator(provider)
        threading.Thread(target=watch_generation, args=(generator, stopper), daemon=True).start()
        stopper.stopped.wait()
        return stopper.code or protocol.ExitCode.OK
    handle = bind_server(options, provider, model_id, names)
    if handle is None:
        return protocol.ExitCode.PORT_IN_USE
    stopper.handle = handle
    if stopper.code is not None:  # the lifeline closed while loading: the timer ends us anyway
        return stopper.code
    threading.Thread(target=watch_generation, args=(handle.generator, stopper), daemon=True).start()
    if stopper.code is None:
        handle.serve_forever()
    # The generation thread may wait in a collective for ranks that are gone: do not wait long.
    handle.close(join_timeout=1.0)
    return stopper.code or protocol.ExitCode.OK
