"""`veloxd pull` against the hub stand-in: what it fetches, resuming, each failure's reason, the bar."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pty
import select
import signal
import struct
import subprocess
import sys
import termios
import threading
from pathlib import Path

from tests.download.conftest import GATED, MODEL, TINY, TOKEN
from tests.fixtures.hub_standin import HubStandIn
from tests.support import REPO, wait_until
from veloxd.download import cache
from veloxd.download.hub import CHUNK_BYTES
from veloxd.download.protocol import EXIT_FATAL, EXIT_RETRY, parse_line

WANTED = {p.name: p.stat().st_size for p in TINY.iterdir() if cache.wanted(p.name)}


def pull(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "veloxd", "pull", *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


def events(stdout: str) -> list[dict]:
    return [e for line in stdout.splitlines() if (e := parse_line(line)) is not None]


def test_pull_fetches_what_mlx_lm_loads_once(hub: HubStandIn, hub_env: dict[str, str]) -> None:
    """Plan, progress and done lines; only the files mlx_lm loads; a second pull transfers nothing."""
    done = pull("--progress-json", "--model", MODEL, env=hub_env)
    assert done.returncode == 0, done.stderr
    seen = events(done.stdout)
    assert seen[0]["event"] == "plan" and seen[-1]["event"] == "done"
    assert seen[0]["total_bytes"] == sum(WANTED.values()) and seen[0]["local_bytes"] == 0
    assert any(e["event"] == "progress" for e in seen)
    snapshot = Path(seen[-1]["path"])
    assert sorted(p.name for p in snapshot.iterdir()) == sorted(WANTED)  # no MODEL_CARD.md
    assert (snapshot / "model.safetensors").read_bytes() == (TINY / "model.safetensors").read_bytes()
    assert hub.served_bytes(MODEL) == sum(WANTED.values()) == seen[-1]["fetched_bytes"]
    assert cache.local_snapshot(MODEL, hub_env) == snapshot

    again = pull("--progress-json", "--model", MODEL, env=hub_env)
    assert again.returncode == 0 and events(again.stdout)[-1]["fetched_bytes"] == 0
    assert hub.served_bytes(MODEL) == sum(WANTED.values())  # no byte of content twice


def test_an_interrupted_pull_continues_where_it_stopped(hub: HubStandIn, hub_env: dict[str, str]) -> None:
    hub.rate_bps = 1_000_000  # ~8 s for the weights: time to kill it half-way
    weights = WANTED["model.safetensors"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "veloxd", "pull", "--progress-json", "--model", MODEL],
        env=hub_env,
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_until(lambda: hub.served_bytes(MODEL, "model.safetensors") >= 2_000_000, 120, what="2 MB served")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    first = hub.served_bytes(MODEL, "model.safetensors")
    partials = list((Path(hub_env["HF_HOME"]) / "hub").rglob("*.incomplete"))
    assert len(partials) == 1 and 0 < partials[0].stat().st_size <= first < weights
    kept = partials[0].stat().st_size

    hub.rate_bps = None
    done = pull("--progress-json", "--model", MODEL, env=hub_env)
    assert done.returncode == 0, done.stderr
    assert events(done.stdout)[0]["local_bytes"] >= kept  # the plan counts what is already here
    first_try, second_try = hub.transfers_of(MODEL, "model.safetensors")
    assert first_try.start == 0 and first_try.sent >= first
    assert kept > 0 and second_try.start == kept and second_try.sent == weights - kept < weights  # continued
    blob = Path(events(done.stdout)[-1]["path"]) / "model.safetensors"
    assert (
        hashlib.sha256(blob.read_bytes()).digest() == hashlib.sha256((TINY / "model.safetensors").read_bytes()).digest()
    )
    assert not list((Path(hub_env["HF_HOME"]) / "hub").rglob("*.incomplete"))


def test_progress_counts_bytes_as_they_arrive(hub: HubStandIn, hub_env: dict[str, str]) -> None:
    """Every byte the hub sent shows in done_bytes, not only whole write blocks: with the weights
    held at ~0.5 MB (half a block), a progress line counts all of them."""
    hub.hold(500_000)
    seen: list[dict] = []

    def counts_every_byte_sent() -> int:
        sent = hub.served_bytes(MODEL, "model.safetensors")
        lines = [e for e in list(seen) if e["event"] == "progress" and e["done_bytes"] == hub.served_bytes(MODEL)]
        return sent if sent >= 500_000 and lines else 0

    with subprocess.Popen(
        [sys.executable, "-m", "veloxd", "pull", "--progress-json", "--model", MODEL],
        env=hub_env,
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as proc:
        out = proc.stdout
        assert out is not None
        reader = threading.Thread(target=lambda: seen.extend(e for line in out for e in events(line)))
        reader.start()
        try:
            held = wait_until(counts_every_byte_sent, 120, what="a progress line counting every byte sent so far")
            assert held < CHUNK_BYTES  # the weights are held inside their first write block
            hub.release()
            assert proc.wait(120) == 0
        finally:
            hub.release()
            if proc.poll() is None:
                proc.kill()
        reader.join(30)
    assert seen[-1]["event"] == "done" and seen[-1]["fetched_bytes"] == sum(WANTED.values())


def test_a_body_broken_off_half_way_continues_in_the_same_pull(hub: HubStandIn, hub_env: dict[str, str]) -> None:
    hub.break_at = 3_000_000  # the first body of every file stops there and the connection drops
    weights = WANTED["model.safetensors"]
    kept = hub.break_at  # every byte received before the break is kept (the write buffer is flushed)
    done = pull("--progress-json", "--model", MODEL, env=hub_env)
    assert done.returncode == 0, done.stderr
    first_try, second_try = hub.transfers_of(MODEL, "model.safetensors")
    assert (first_try.start, first_try.sent) == (0, 3_000_000)
    assert kept > 0 and (second_try.start, second_try.sent) == (kept, weights - kept)  # a Range, not byte 0
    blob = Path(events(done.stdout)[-1]["path"]) / "model.safetensors"
    assert blob.read_bytes() == (TINY / "model.safetensors").read_bytes()
    assert events(done.stdout)[-1]["fetched_bytes"] == sum(WANTED.values())


def test_a_server_that_ignores_the_range_restarts_the_file(hub: HubStandIn, hub_env: dict[str, str]) -> None:
    hub.break_at, hub.ignore_ranges = 3_000_000, True
    weights = WANTED["model.safetensors"]
    done = pull("--progress-json", "--model", MODEL, env=hub_env)
    assert done.returncode == 0, done.stderr
    first_try, second_try = hub.transfers_of(MODEL, "model.safetensors")
    assert (first_try.sent, second_try.start, second_try.sent) == (3_000_000, 0, weights)  # the whole file again
    blob = Path(events(done.stdout)[-1]["path"]) / "model.safetensors"
    assert blob.read_bytes() == (TINY / "model.safetensors").read_bytes()  # not the first MB twice
    assert events(done.stdout)[-1]["fetched_bytes"] == sum(WANTED.values())  # the restart was counted back


def _failed(done: subprocess.CompletedProcess[str]) -> dict:
    last = events(done.stdout)[-1]
    assert last["event"] == "failed" and last["message"] in done.stderr
    return last


def test_unknown_model_is_not_found(hub: HubStandIn, hub_env: dict[str, str]) -> None:
    done = pull("--progress-json", "--model", "tiny/nope", env=hub_env)
    assert done.returncode == EXIT_FATAL
    failed = _failed(done)
    assert (
        failed["reason"] == "not_found" and "tiny/nope" in failed["message"] and "check `model:`" in failed["message"]
    )


def test_gated_model_needs_a_token(hub: HubStandIn, hub_env: dict[str, str]) -> None:
    done = pull("--progress-json", "--model", GATED, env=hub_env)
    assert done.returncode == EXIT_FATAL
    failed = _failed(done)
    assert failed["reason"] == "gated" and f"{hub.url}/{GATED}" in failed["message"] and "HF_TOKEN" in failed["message"]
    assert hub.served_bytes(GATED) == 0
    assert pull("--model", GATED, env={**hub_env, "HF_TOKEN": TOKEN}).returncode == 0


def test_too_little_disk_fails_before_any_transfer(hub: HubStandIn, hub_env: dict[str, str]) -> None:
    done = pull("--progress-json", "--model", MODEL, env={**hub_env, "VELOXD_TEST_DISK_FREE_BYTES": "1000000"})
    assert done.returncode == EXIT_FATAL
    failed = _failed(done)
    assert failed["reason"] == "no_space" and "1.0 MB free" in failed["message"] and "HF_HUB_CACHE" in failed["message"]
    assert hub.served_bytes(MODEL) == 0


def test_offline_fails_without_asking_the_hub(hub: HubStandIn, hub_env: dict[str, str]) -> None:
    done = pull("--progress-json", "--model", MODEL, env={**hub_env, "HF_HUB_OFFLINE": "1"})
    assert done.returncode == EXIT_FATAL
    assert _failed(done)["reason"] == "offline" and hub.requests == []
    assert pull("--model", MODEL, env=hub_env).returncode == 0
    offline = pull("--progress-json", "--model", MODEL, env={**hub_env, "HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 0 and events(offline.stdout)[-1]["event"] == "done"  # complete: fine offline


def test_unreachable_hub_is_a_network_error_to_retry(hub_env: dict[str, str], tmp_path: Path) -> None:
    from tests.support import free_port

    env = {**hub_env, "HF_ENDPOINT": f"http://127.0.0.1:{free_port()}"}
    done = pull("--progress-json", "--model", MODEL, env=env)
    assert done.returncode == EXIT_RETRY
    assert _failed(done)["reason"] == "network"
    # A person running it (by id, or by entry name through a child) is told what to do, not "retrying".
    for by_person in (pull("--model", MODEL, env=env), pull("--config", str(_config(tmp_path)), "tiny", env=env)):
        assert by_person.returncode == EXIT_RETRY
        [line] = by_person.stderr.splitlines()
        assert line.startswith(f"veloxd pull: cannot reach {env['HF_ENDPOINT']} to download {MODEL}")
        assert "retrying" not in line and line.endswith(
            "check the network connection (and a proxy or HF_ENDPOINT if you use one), then run `veloxd pull` "
            "again; the files already fetched are kept and it continues where it stopped "
            "(the daemon retries by itself with backoff)"
        )


def test_pull_checks_model_ids_as_check_does_before_any_request(hub: HubStandIn, hub_env: dict[str, str]) -> None:
    done = pull("--model", "not-an-id", env=hub_env)
    assert done.returncode == EXIT_FATAL and hub.requests == []
    assert done.stderr == (
        f"veloxd pull: error: --model not-an-id: model 'not-an-id' is neither an existing directory "
        f"({REPO / 'not-an-id'}) nor a Hugging Face id like 'mlx-community/Qwen2.5-7B-Instruct-4bit'\n"
    )
    local = pull("--model", str(TINY), env=hub_env)
    assert local.returncode == 0 and local.stdout == f"{TINY}: {TINY} is a local directory: nothing to download\n"


def _config(tmp_path: Path, model: str = MODEL) -> Path:
    path = tmp_path / "veloxd.yaml"
    path.write_text(
        f"version: 1\nservers:\n  tiny: {{model: {model}, port: 18181, method: fp16}}\n"
        f"  local: {{model: {TINY}, port: 18182, method: fp16}}\n"
    )
    return path


def test_pull_shows_a_progress_bar_on_a_terminal(hub: HubStandIn, hub_env: dict[str, str], tmp_path: Path) -> None:
    hub.rate_bps = 4_000_000
    primary, secondary = pty.openpty()
    fcntl.ioctl(secondary, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # a 100-column terminal
    proc = subprocess.Popen(
        [sys.executable, "-m", "veloxd", "pull", "--config", str(_config(tmp_path))],
        env=hub_env,
        cwd=REPO,
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
    )
    os.close(secondary)
    output = b""
    while True:
        ready, _, _ = select.select([primary], [], [], 120)
        if not ready:
            break
        try:
            chunk = os.read(primary, 65536)
        except OSError:  # EIO: the child side closed
            break
        if not chunk:
            break
        output += chunk
    os.close(primary)
    assert proc.wait(60) == 0, output.decode(errors="replace")
    text = output.decode(errors="replace")
    assert "local: " in text and "nothing to download" in text
    assert "tiny (tiny/llama):" in text and "100%|" in text and "\r" in text  # tqdm redraws in place
    assert "downloaded 8.3 MB" in text


def test_pull_prints_plain_lines_when_not_on_a_terminal(
    hub: HubStandIn, hub_env: dict[str, str], tmp_path: Path
) -> None:
    done = pull("--config", str(_config(tmp_path)), "tiny", env=hub_env)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("tiny (tiny/llama): 7 files, 8.3 MB, revision ")
    assert lines[-1].startswith("tiny (tiny/llama): downloaded 8.3 MB in ")
    assert "\r" not in done.stdout and "VELOXD_DOWNLOAD" not in done.stdout
    again = pull("--config", str(_config(tmp_path)), "tiny", env=hub_env)
    assert again.stdout.splitlines()[-1].startswith("tiny (tiny/llama): complete in the cache: ")
    unknown = pull("--config", str(_config(tmp_path)), "nope", env=hub_env)
    assert unknown.returncode == 2 and "no server named 'nope'" in unknown.stderr and "tiny, local" in unknown.stderr
    assert json.loads(json.dumps(hub.served))  # the stand-in counted what it sent
