"""The `gateway:` block and the per-entry gateway keys: validation, assigned ports, what a reload restarts."""

from __future__ import annotations

from pathlib import Path

from tests.config_support import issues, write_config
from veloxd.config import load_config
from veloxd.config.gateway import ASSIGNED_PORTS, GATEWAY_NAME
from veloxd.config.plan import diff

BASE = """\
version: 1
gateway: {port: 9000, memory_budget: 48G}
servers:
  coder: {model: ./model, method: fp16, aliases: [code, gpt-4o]}
  chat: {model: ./model, method: fp16, start: on_demand, idle_unload_s: 300, port: 8082}
"""


def test_gateway_block_defaults_sizes_and_assigned_ports(tmp_path: Path) -> None:
    config = load_config(write_config(tmp_path, BASE))
    gateway = config.gateway
    assert gateway is not None
    assert (gateway.host, gateway.port, gateway.memory_budget, gateway.max_body_bytes) == (
        "127.0.0.1",
        9000,
        48 * 10**9,
        16_000_000,
    )
    coder, chat = config.servers["coder"], config.servers["chat"]
    assert ASSIGNED_PORTS[0] <= coder.port <= ASSIGNED_PORTS[1] and chat.port == 8082
    assert coder.aliases == ("code", "gpt-4o") and coder.start == "always" and chat.start == "on_demand"
    assert list(config.supervised()) == ["coder", "chat", GATEWAY_NAME]
    # The same name gets the same port in another file with other entries.
    other = BASE.replace("  chat:", "  aaa: {model: ./model, method: fp16}\n  chat:")
    assert load_config(write_config(tmp_path, other, name="other.yaml")).servers["coder"].port == coder.port


def test_gateway_mistakes_are_located(tmp_path: Path) -> None:
    text = """\
version: 1
gateway: {port: 9000, host: 0.0.0.0, memory_budget: 0, max_body: 10}
servers:
  coder: {model: ./model, method: fp16, aliases: [chat], port: 9000}
  chat: {model: ./model, method: fp16, aliases: [x, y], start: sometimes}
  other: {model: ./model, method: fp16, aliases: [y]}
"""
    found = {(path, message) for _, _, path, message in issues(write_config(tmp_path, text))}
    paths = {path for path, _ in found}
    assert "$.gateway.max_body" in paths  # unknown key
    assert "$.servers.coder.aliases[0]" in paths and "$.servers.other.aliases[0]" in paths
    assert "$.servers.chat.start" in paths
    messages = " | ".join(message for _, message in found)
    assert "alias 'chat' is already the name of server 'chat'" in messages
    assert "alias 'y' is already an alias of server 'chat'" in messages


def test_gateway_exposure_budget_and_port_clash(tmp_path: Path) -> None:
    text = """\
version: 1
gateway: {port: 9000, host: 0.0.0.0, memory_budget: "0.1"}
servers:
  coder: {model: ./model, method: fp16, port: 9000}
"""
    found = {(path, message) for _, _, path, message in issues(write_config(tmp_path, text))}
    assert (
        "$.gateway.host",
        "host 0.0.0.0 exposes the gateway beyond this machine: set api_key_env (clients "
        "then need a bearer token) or, deliberately, allow_unauthenticated: true",
    ) in found
    assert any(path == "$.gateway.memory_budget" and "at least 1 byte" in message for path, message in found)
    assert any(path == "$.gateway.port" and "already used by server 'coder'" in message for path, message in found)


def test_on_demand_and_missing_ports_need_a_gateway(tmp_path: Path) -> None:
    text = "version: 1\nservers:\n  coder: {model: ./model, method: fp16, start: on_demand}\n"
    assert {(path, message.split(" (")[0]) for _, _, path, message in issues(write_config(tmp_path, text))} == {
        ("$.servers.coder.port", "server 'coder' is missing required key 'port'"),
        ("$.servers.coder.start", "start: on_demand needs a gateway: block"),
    }
    null = "version: 1\nservers:\n  coder: {model: ./model, method: fp16, port: null}\n"  # as leaving it out
    assert [(path, message.split(" (")[0]) for _, _, path, message in issues(write_config(tmp_path, null))] == [
        ("$.servers.coder.port", "port: null needs a gateway: block")
    ]


def test_aliases_idle_budget_and_auth_change_live_and_host_port_restart_the_gateway(tmp_path: Path) -> None:
    before = load_config(write_config(tmp_path, BASE))
    live = (
        BASE.replace("[code, gpt-4o]", "[code]")
        .replace("idle_unload_s: 300", "idle_unload_s: 30")
        .replace("memory_budget: 48G", "memory_budget: 8G, api_key_env: TOKEN, start_timeout_s: 5")
    )
    plan = diff(before, load_config(write_config(tmp_path, live, name="live.yaml")))
    assert not plan.changed and set(plan.updated) == {"coder", "chat", GATEWAY_NAME}
    assert set(plan.updated[GATEWAY_NAME]) == {
        "gateway.memory_budget",
        "gateway.api_key_env",
        "gateway.start_timeout_s",
    }
    moved = BASE.replace("port: 9000", "port: 9001")
    plan = diff(before, load_config(write_config(tmp_path, moved, name="moved.yaml")))
    assert set(plan.changed) == {GATEWAY_NAME} and plan.changed[GATEWAY_NAME] == ("gateway.port",)


def test_state_file_round_trip_keeps_the_gateway(tmp_path: Path) -> None:
    from veloxd.config.roundtrip import config_from_dict, config_to_dict

    config = load_config(write_config(tmp_path, BASE))
    again = config_from_dict(config_to_dict(config))
    assert again.gateway == config.gateway and again.servers == config.servers
    assert diff(config, again).is_noop


def test_a_dashboard_block_beside_a_gateway_is_refused_naming_the_gateways_port(tmp_path: Path) -> None:
    """The gateway serves the dashboard and /metrics: a second dashboard on another port is a mistake of the
    file, reported at the dashboard: key; the same block without a gateway stays valid."""
    text = BASE + "dashboard: {port: 8090, interval_s: 0.5}\n"
    found = issues(write_config(tmp_path, text))
    assert [(line, path) for line, _, path, _ in found] == [(6, "$.dashboard")]
    message = found[0][3]
    assert "the gateway serves the dashboard and /metrics itself" in message
    assert "http://127.0.0.1:9000/" in message and "remove the dashboard: block" in message
    alone = "version: 1\nservers:\n  coder: {model: ./model, method: fp16, port: 8081}\ndashboard: {port: 8090}\n"
    assert load_config(write_config(tmp_path, alone, name="alone.yaml")).dashboard is not None


def test_timeouts_and_the_connection_cap_default_apply_live_and_refuse_nonsense(tmp_path: Path) -> None:
    before = load_config(write_config(tmp_path, BASE))
    gateway = before.gateway
    assert gateway is not None
    assert (
        gateway.header_timeout_s,
        gateway.body_timeout_s,
        gateway.keepalive_timeout_s,
        gateway.connect_timeout_s,
        gateway.first_byte_timeout_s,
        gateway.read_timeout_s,
        gateway.max_connections,
    ) == (10.0, 60.0, 15.0, 10.0, 600.0, 120.0, 1000)
    keys = "header_timeout_s: 5, read_timeout_s: 30, max_connections: 64"
    tuned = BASE.replace("memory_budget: 48G", f"memory_budget: 48G, {keys}")
    plan = diff(before, load_config(write_config(tmp_path, tuned, name="tuned.yaml")))
    assert not plan.changed
    assert set(plan.updated[GATEWAY_NAME]) == {
        "gateway.header_timeout_s",
        "gateway.read_timeout_s",
        "gateway.max_connections",
    }
    wrong = BASE.replace("memory_budget: 48G", "first_byte_timeout_s: 0, body_timeout_s: -1, max_connections: 0")
    paths = {path for _, _, path, _ in issues(write_config(tmp_path, wrong, name="wrong.yaml"))}
    assert {"$.gateway.first_byte_timeout_s", "$.gateway.body_timeout_s", "$.gateway.max_connections"} <= paths
