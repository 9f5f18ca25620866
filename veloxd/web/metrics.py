"""Prometheus series of the daemon and its workers, built from the monitor's latest sample at scrape time.

A custom collector: no metric is updated in place, so what a scrape shows is exactly what the
daemon and the workers reported (states, restarts, measured KV bytes, resident memory, the
workers' own request counters). Names: `veloxd_` prefix, units in the name, `_total` counters.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.utils import floatToGoString

from veloxd.daemon.state import ServerState
from veloxd.web.monitor import Monitor


class GatewayCounters(Protocol):
    """The hook for the gateway process (veloxd.gateway.tally): what only the gateway knows, per server."""

    def admissions_total(self) -> Mapping[str, int]: ...  # on-demand starts admission let through

    def admission_refusals_total(self) -> Mapping[str, int]: ...  # starts refused: over the memory budget

    def unloads_total(self) -> Mapping[tuple[str, str], int]: ...  # (server, reason) -> count

    def requests_total(self) -> Mapping[tuple[str, str], int]: ...  # (server, status) -> answered by the gateway

    def queue_depth(self) -> Mapping[str, int]: ...  # waiting in the gateway for a start or a slot


class VeloxdCollector:
    """Reads `monitor` (and the gateway's counters, once there is a gateway) at each scrape."""

    def __init__(self, monitor: Monitor, gateway: GatewayCounters | None = None) -> None:
        self.monitor = monitor
        self.gateway = gateway

    def collect(self) -> Iterator[Metric]:
        monitor = self.monitor
        yield _family(
            GaugeMetricFamily,
            "veloxd_daemon_up",
            "1 when the daemon answered the dashboard's last sample.",
            [([], 1.0 if monitor.reachable else 0.0)],
        )
        last_reload = monitor.state.get("last_reload") or {}
        if last_reload:
            yield _family(
                GaugeMetricFamily,
                "veloxd_config_last_reload_success",
                "1 when the last reload of veloxd.yaml was accepted.",
                [([], 1.0 if last_reload.get("ok") else 0.0)],
            )
        yield from self._log_writes(monitor.state.get("daemon") or {}) if monitor.reachable else ()
        servers = list(monitor.servers.values())
        yield from self._servers(servers)
        yield from self._requests(servers)
        if self.gateway is not None:
            yield from self._gateway(self.gateway)

    def _servers(self, servers: list[dict[str, Any]]) -> Iterator[Metric]:
        state = GaugeMetricFamily(
            "veloxd_server_state", "1 for the state each server is in, 0 for the others.", labels=["server", "state"]
        )
        info = GaugeMetricFamily(
            "veloxd_server_info",
            "Model, KV-cache method and bits of each server (value 1).",
            labels=["server", "model", "method", "bits"],
        )
        for s in servers:
            for value in ServerState:
                state.add_metric([s["name"], value.value], 1.0 if s["state"] == value.value else 0.0)
            bits = "" if s["bits"] is None else str(s["bits"])
            info.add_metric([s["name"], str(s["model"]), str(s["method"]), bits], 1.0)
        yield state
        yield info
        yield from _per_server(_START_SERIES, [(s["name"], s) for s in servers])
        kv = GaugeMetricFamily(
            "veloxd_kv_cache_bytes_per_token",
            "Measured KV-cache bytes per token at the "
            "worker's start: its method's cache and the fp16 cache on the same tokens. An evicting "
            "method's figure holds below its cap only (veloxd_kv_cache_capped_tokens), and may be 0.",
            labels=["server", "cache"],
        )
        for s in servers:
            for cache, key in (("method", "kv_bytes_per_token"), ("fp16", "fp16_bytes_per_token")):
                if s[key] is not None:
                    kv.add_metric([s["name"], cache], float(s[key]))
        yield kv
        yield from _per_server(_MEMORY_SERIES, [(s["name"], s) for s in servers])

    def _log_writes(self, daemon: dict[str, Any]) -> Iterator[Metric]:
        """The daemon's log file: records it could not write (full disk, removed or read-only directory)."""
        log_write = daemon.get("log_write")
        if not isinstance(log_write, dict):
            return
        yield _family(
            CounterMetricFamily,
            "veloxd_log_records_lost",
            "Log records the daemon could not write to its log file (log_write_recovered says when).",
            [([], log_write.get("lost_records_total", 0))],
        )
        yield _family(
            GaugeMetricFamily,
            "veloxd_log_write_failing",
            "1 while the daemon cannot write its log file.",
            [([], 1.0 if log_write.get("failing") else 0.0)],
        )

    def _requests(self, servers: list[dict[str, Any]]) -> Iterator[Metric]:
        stats = self.monitor.stats
        live = [s for s in servers if s["name"] in stats]
        requests = CounterMetricFamily(
            "veloxd_requests", "HTTP requests a worker answered, by status code.", labels=["server", "status"]
        )
        for s in live:
            for status, count in sorted(stats[s["name"]].get("requests", {}).items()):
                requests.add_metric([s["name"], status], float(count))
        yield requests
        for name, key, doc in (
            ("veloxd_request_duration_seconds", "latency_s", "Seconds from a request's arrival to its last byte."),
            ("veloxd_time_to_first_token_seconds", "ttft_s", "Seconds from a request's arrival to its first token."),
        ):
            family = HistogramMetricFamily(name, doc, labels=["server"])
            for s in live:
                histogram = stats[s["name"]].get(key) or {}
                buckets = [(_le(bound), float(count)) for bound, count in histogram.get("buckets", [])]
                if buckets:
                    family.add_metric([s["name"]], buckets, float(histogram.get("sum", 0.0)))
            yield family
        # The token counters are the worker's own (its stats); the rest the monitor's view of it.
        yield from _per_server(_TOKEN_SERIES, [(s["name"], stats[s["name"]]) for s in live])
        yield from _per_server(_WORKER_SERIES, [(s["name"], s) for s in live])

    def _gateway(self, gateway: GatewayCounters) -> Iterator[Metric]:
        # Every routed server is in queue_depth, 0 included: an absent series would read as "no data".
        for kind, name, labels, counts, doc in (
            (
                CounterMetricFamily,
                "veloxd_gateway_admissions",
                ["server"],
                gateway.admissions_total(),
                "Starts of on-demand servers the gateway admitted within the memory budget.",
            ),
            (
                CounterMetricFamily,
                "veloxd_gateway_admission_refusals",
                ["server"],
                gateway.admission_refusals_total(),
                "Starts of on-demand servers the gateway refused (they did not fit the memory budget).",
            ),
            (
                CounterMetricFamily,
                "veloxd_gateway_unloads",
                ["server", "reason"],
                gateway.unloads_total(),
                "On-demand servers the gateway stopped, by reason (idle: idle_unload_s; admission: to make room).",
            ),
            (
                CounterMetricFamily,
                "veloxd_gateway_requests",
                ["server", "status"],
                gateway.requests_total(),
                "Completion requests the gateway answered, by server and status (its own 400, 404, 413 and 503 "
                'included; server="" when the request named no known model).',
            ),
            (
                GaugeMetricFamily,
                "veloxd_gateway_queue_depth",
                ["server"],
                gateway.queue_depth(),
                "Requests waiting in the gateway for their server to start or for a concurrency slot.",
            ),
        ):
            samples: list[tuple[list[str], Any]] = [
                ([k] if isinstance(k, str) else [*k], n) for k, n in sorted(counts.items())
            ]
            yield _family(kind, name, doc, samples, labels)


_Kind = type[GaugeMetricFamily] | type[CounterMetricFamily]
_Series = tuple[tuple[_Kind, str, str, str], ...]

# One sample per server: (family, metric name, key of the server's view, help), in exposition order.
_START_SERIES: _Series = (
    (
        CounterMetricFamily,
        "veloxd_server_restarts",
        "restarts",
        "Worker starts after the first one that no request asked for (crashes, reloads, restarts); "
        "on-demand starts are not restarts.",
    ),
    (
        CounterMetricFamily,
        "veloxd_server_starts",
        "starts",
        "Worker starts of every kind: the first, on-demand starts, restarts.",
    ),
    (
        CounterMetricFamily,
        "veloxd_server_on_demand_starts",
        "on_demand_starts",
        "Starts of an on_demand server that a request asked for (after idle unloads, among others).",
    ),
    (
        GaugeMetricFamily,
        "veloxd_server_startup_seconds",
        "startup_s",
        "Seconds from spawn to ready at the worker's last start.",
    ),
    (
        GaugeMetricFamily,
        "veloxd_server_uptime_seconds",
        "uptime_s",
        "Seconds since the server became ready (ready servers only).",
    ),
)
_MEMORY_SERIES: _Series = (  # after veloxd_kv_cache_bytes_per_token (two samples per server)
    (
        GaugeMetricFamily,
        "veloxd_kv_cache_capped_tokens",
        "kv_cap_tokens",
        "Tokens an evicting method's cache stops growing at (its budget); its bytes there are "
        "veloxd_kv_cache_capped_bytes. Absent for methods that keep every token.",
    ),
    (
        GaugeMetricFamily,
        "veloxd_kv_cache_capped_bytes",
        "kv_capped_bytes",
        "Measured KV bytes of one sequence at an evicting method's cap (what it holds from then on).",
    ),
    (
        GaugeMetricFamily,
        "veloxd_kv_cache_compression_ratio",
        "kv_ratio",
        "Measured KV bytes of the method over fp16's, totals at READY's reference length "
        "(4096 tokens; a method's fp16 residual window included; lower is smaller).",
    ),
    (
        GaugeMetricFamily,
        "veloxd_worker_resident_memory_bytes",
        "rss_bytes",
        "Resident memory of the worker and its child processes.",
    ),
)
_TOKEN_SERIES: _Series = (
    (CounterMetricFamily, "veloxd_generated_tokens", "generated_tokens", "Tokens a worker generated."),
    (CounterMetricFamily, "veloxd_prompt_tokens", "prompt_tokens", "Prompt tokens a worker was given."),
)
_WORKER_SERIES: _Series = (
    (
        GaugeMetricFamily,
        "veloxd_generation_tokens_per_second",
        "tokens_per_s",
        "Tokens generated per second over the last sample interval.",
    ),
    (GaugeMetricFamily, "veloxd_requests_in_flight", "in_flight", "Requests a worker is answering now."),
    (
        GaugeMetricFamily,
        "veloxd_request_queue_depth",
        "queued",
        "Requests waiting for the worker's generation thread.",
    ),
)


def _per_server(series: _Series, rows: list[tuple[str, Mapping[str, Any]]]) -> Iterator[Metric]:
    """A family per row of `series`, labelled by server: each (server, values) row's `key` (None: no sample)."""
    for kind, name, key, doc in series:
        yield _family(kind, name, doc, [([server], values.get(key)) for server, values in rows], ["server"])


def _le(bound: Any) -> str:
    return "+Inf" if bound == "+Inf" else floatToGoString(float(bound))


def _family(
    kind: _Kind, name: str, doc: str, samples: list[tuple[list[str], Any]], labels: list[str] | None = None
) -> Metric:
    """A gauge or counter family of the samples whose value is known (None: no series)."""
    family = kind(name, doc, labels=labels or [])
    for label_values, value in samples:
        if value is not None:
            family.add_metric(label_values, float(value))
    return family


def registry_for(monitor: Monitor, gateway: GatewayCounters | None = None) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(VeloxdCollector(monitor, gateway))
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The Prometheus text format of every series in `registry`."""
    return generate_latest(registry)
