"""Gateway test helpers: config text with a `gateway:` block, stand-in model directories, HTTP calls."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tests.fixtures.daemon_harness import FAST_RESTART, DaemonHarness
from tests.support import REPO, free_port, http_json, wait_until

GATEWAY = "@gateway"
MODEL = str(REPO / "veloxd" / "assets" / "tiny-llama")  # the shipped model: real workers, no download
LOAD_S = 240  # several model loads on two busy CPU cores


def gateway_yaml(gateway: Mapping[str, Any], servers: Mapping[str, Mapping[str, Any]]) -> str:
    lines = ["version: 1", f"gateway: {json.dumps(dict(gateway))}", "servers:"]
    lines += [f"  {name}: {json.dumps(dict(body))}" for name, body in servers.items()]
    return "\n".join(lines) + "\n"


def fake_entry(model: Path | str, *, assigned_port: bool = False, **extra: Any) -> dict[str, Any]:
    """An entry for the stand-in worker: fast timeouts, fp16, a claimed free port (see `with_port`)."""
    body = {
        "model": str(model),
        "method": "fp16",
        "ready_timeout_s": 30,
        "stop_timeout_s": 5,
        "restart": dict(FAST_RESTART),
    }
    return with_port({**body, **extra}, assigned_port)


def real_entry(*, assigned_port: bool = False, **extra: Any) -> dict[str, Any]:
    """An entry for a real `veloxd serve` on the shipped tiny model (fp16 unless `extra` says otherwise)."""
    return with_port(
        {"model": MODEL, "method": "fp16", "ready_timeout_s": LOAD_S, "stop_timeout_s": 20, **extra}, assigned_port
    )


def with_port(entry: dict[str, Any], assigned_port: bool) -> dict[str, Any]:
    """A claimed free port unless the entry has one or the test wants the daemon's assigned one:
    assigned ports are a hash of the entry's name, so two test modules running at once with an
    entry of the same name would be handed the same port."""
    if assigned_port or "port" in entry:
        return entry
    return {**entry, "port": free_port()}


def model_dir(root: Path, name: str, weights_bytes: int = 1000, context: int = 16) -> Path:
    """A directory `check` accepts as a model, whose weight files total `weights_bytes` on disk."""
    path = root / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({"model_type": "llama", "max_position_embeddings": context}))
    (path / "model.safetensors").write_bytes(b"\0" * weights_bytes)
    return path


def events_after(h: DaemonHarness, mark: int, event: str, **match: Any) -> list[dict[str, Any]]:
    return [r for r in h.records()[mark:] if r["event"] == event and all(r.get(k) == v for k, v in match.items())]


def post(
    base: str, path: str, body: dict[str, Any] | bytes, headers: dict[str, str] | None = None, timeout: float = 60
) -> tuple[int, Any]:
    import urllib.error
    import urllib.request

    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(
        base + path, data=data, headers={"Content-Type": "application/json", **(headers or {})}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        with err:  # it holds the response's socket
            text = err.read()
        try:
            return err.code, {**json.loads(text), "_headers": dict(err.headers)}
        except ValueError:
            return err.code, {"_text": text.decode(errors="replace"), "_headers": dict(err.headers)}


def models(base: str, headers: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    status, body = http_json(base + "/v1/models", headers=headers)
    assert status == 200, body
    return {card["id"]: card for card in body["data"]}


def wait_model_state(base: str, name: str, state: str, timeout: float = 60) -> dict[str, Any]:
    return wait_until(
        lambda: (card := models(base).get(name)) and card["state"] == state and card,
        timeout,
        interval=0.05,
        what=f"{name} {state} in /v1/models",
    )
