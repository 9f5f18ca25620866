"""The `distributed:` block: schema, located errors, what a change restarts, and the group's command line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.config_support import entry, issues, only_issue, write_config
from tests.support import run_veloxd
from veloxd import protocol
from veloxd.config import inspect_config
from veloxd.config.model import ServerEntry
from veloxd.config.plan import diff
from veloxd.config.roundtrip import config_from_dict, config_to_dict
from veloxd.distributed.command import describe, group_argv
from veloxd.distributed.rank_lines import split_rank, tag


def heads_model(directory: Path, heads: int = 4, kv_heads: int = 2, index: bool = False) -> None:
    model = directory / "model"
    model.mkdir(parents=True, exist_ok=True)
    (model / "config.json").write_text(
        json.dumps(
            {
                "model_type": "llama",
                "num_attention_heads": heads,
                "num_key_value_heads": kv_heads,
                "num_hidden_layers": 4,
            }
        )
    )
    if index:
        (model / "model.safetensors.index.json").write_text('{"weight_map": {}}')


def config_with(tmp_path: Path, block: str, *, heads: int = 4, kv_heads: int = 2, index: bool = False) -> Path:
    path = write_config(tmp_path, entry(f"model: ./model\nport: 8081\nmethod: affine\ndistributed:\n{block}"))
    heads_model(tmp_path, heads, kv_heads, index)
    return path


def test_a_local_pair_is_valid_and_round_trips_through_the_state_file(tmp_path: Path) -> None:
    path = config_with(tmp_path, "  hosts: [127.0.0.1, 127.0.0.1]\n  env: {MLX_METAL_FAST_SYNCH: '1'}\n")
    config = inspect_config(path).config
    assert config is not None
    block = config.servers["coder"].distributed
    assert block is not None and block.hosts == ("127.0.0.1", "127.0.0.1") and block.backend == "ring"
    assert block.parallelism == "tensor" and block.port == 32323 and describe(block) == "2 ranks (ring, tensor)"
    assert config_from_dict(json.loads(json.dumps(config_to_dict(config)))) == config
    plain = ServerEntry.from_dict("x", {"model": "a/b", "port": 1, "method": "fp16"})
    assert plain.distributed is None and plain.to_dict()["distributed"] is None


TWO = "  hosts: [127.0.0.1, 127.0.0.1]\n"  # a valid two-rank group on this machine
AT = "$.servers.coder.distributed"  # where the distributed block's mistakes are located


@pytest.mark.parametrize(
    ("block", "where", "says"),
    [
        ("  backend: ring\n", AT, "exactly one of hosts"),
        ("  hosts: [127.0.0.1]\n", f"{AT}.hosts", "too short"),
        ("  hosts: [127.0.0.1, myhost]\n", f"{AT}.hosts[1]", "needs an IP address for rank 1"),
        ("  hosts: [192.0.2.7, 127.0.0.1]\n", f"{AT}.hosts[0]", "must be this machine"),
        ("  hosts: [127.0.0.1, 192.0.2.7]\n", f"{AT}.hosts[0]", "reachable only on loopback"),
        (TWO + "  backend: jaccl\n", f"{AT}.backend", "needs a hostfile"),
        (TWO + "  backend: mpi\n", f"{AT}.backend", "choose one of"),
        ("  hosts: [127.0.0.1, 127.0.0.1, 127.0.0.1]\n", f"{AT}.hosts", "does not divide by 3"),
        (TWO + "  parallelism: pipeline\n", f"{AT}.hosts", "model.safetensors.index.json"),
        (TWO + "  parallelism: pipeline\n", f"{AT}.parallelism", "serves only method fp16"),
        (TWO + "  python: venv/bin/python\n", f"{AT}.python", "absolute path"),
        (TWO + "  hostfile: hosts.json\n", AT, "exactly one"),
        ("  hostfile: missing.json\n", f"{AT}.hostfile", "cannot read hostfile"),
        (TWO + "  porrt: 4000\n", f"{AT}.porrt", "did you mean 'port'"),
    ],
)
def test_each_mistake_is_located_at_its_key(tmp_path: Path, block: str, where: str, says: str) -> None:
    found = issues(config_with(tmp_path, block))
    assert any(path == where and says in message for _, _, path, message in found), found


def test_hostfile_in_mlx_format_and_jaccl_rdma_shape(tmp_path: Path) -> None:
    hosts = [
        {"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "rdma": [None, "rdma_en3"]},
        {"ssh": "127.0.0.1", "ips": ["127.0.0.1"], "rdma": ["rdma_en3", None]},
    ]
    (tmp_path / "hosts.json").write_text(json.dumps({"backend": "jaccl", "envs": [], "hosts": hosts}))
    config = inspect_config(config_with(tmp_path, "  hostfile: hosts.json\n  backend: jaccl\n")).config
    assert config is not None
    distributed = config.servers["coder"].distributed
    assert distributed is not None and distributed.hostfile == str(tmp_path / "hosts.json")
    hosts[1]["rdma"] = ["rdma_en3"]
    (tmp_path / "hosts.json").write_text(json.dumps({"hosts": hosts}))
    _, _, path, message = only_issue(config_with(tmp_path, "  hostfile: hosts.json\n  backend: jaccl\n"))
    assert path == "$.servers.coder.distributed.hostfile" and "host 1 needs 'rdma' with 2 entries" in message


def test_adapters_cannot_be_sharded(tmp_path: Path) -> None:
    (tmp_path / "adapter").mkdir()
    path = write_config(
        tmp_path,
        entry(
            "model: ./model\nport: 8081\nmethod: fp16\nadapter_path: ./adapter\n"
            "distributed: {hosts: [127.0.0.1, 127.0.0.1]}"
        ),
    )
    heads_model(tmp_path)
    assert [(p, "adapter" in m) for _, _, p, m in issues(path)] == [("$.servers.coder.distributed", True)]


def test_changing_the_block_restarts_only_that_entry_and_plan_shows_it(tmp_path: Path) -> None:
    before = inspect_config(config_with(tmp_path, "  hosts: [127.0.0.1, 127.0.0.1]\n")).config
    after = inspect_config(config_with(tmp_path, "  hosts: [127.0.0.1, 127.0.0.1]\n  port: 40000\n")).config
    assert before is not None and after is not None
    assert dict(diff(before, after).changed) == {"coder": ("distributed.port",)}
    done = run_veloxd("plan", str(tmp_path / "veloxd.yaml"), "--state-dir", str(tmp_path / "none"))
    assert done.returncode == 0 and "2 ranks (ring, tensor)" in done.stdout, done.stdout


def test_group_argv_runs_mlx_launcher_with_the_rank_command(tmp_path: Path) -> None:
    config = inspect_config(
        config_with(
            tmp_path, "  hosts: [127.0.0.1, 127.0.0.1]\n  python: /opt/py/bin/python\n  cwd: /srv\n  env: {A: b}\n"
        )
    ).config
    assert config is not None
    argv = group_argv(config.servers["coder"], [sys.executable, "-m", "veloxd", "serve"], 7)
    split = argv.index("--")
    launcher, ranks = argv[:split], argv[split + 1 :]
    assert launcher[:6] == [sys.executable, "-P", "-m", "veloxd.distributed.launcher", "--lifeline-fd", "7"]
    for flag, value in (
        ("--backend", "ring"),
        ("--hosts", "127.0.0.1,127.0.0.1"),
        ("--starting-port", "32323"),
        ("--cwd", "/srv"),
    ):
        assert launcher[launcher.index(flag) + 1] == value
    assert "A=b" in launcher and "PYTHONUNBUFFERED=1" in launcher
    assert ranks[:4] == ["/opt/py/bin/python", "-m", "veloxd", "serve"]
    assert ranks[4:] == [protocol.ENTRY_JSON_FLAG, ranks[5], protocol.LIFELINE_FLAG, "0"]
    document = protocol.read_entry_document(ranks[5])
    assert (document["distributed"], document["served_name"]) == ("tensor", ["coder"])


def test_rank_tags_round_trip() -> None:
    assert split_rank(tag(1, "VELOXD_READY {}")) == (1, "VELOXD_READY {}")
    assert split_rank(tag(12, "")) == (12, "")
    assert split_rank("veloxd launcher: rank 1 exited") == (None, "veloxd launcher: rank 1 exited")


def test_ranks_ports_must_not_overlap_other_entries(tmp_path: Path) -> None:
    heads_model(tmp_path)
    path = write_config(
        tmp_path,
        """\
        version: 1
        servers:
          a: {model: ./model, port: 40001, method: fp16, distributed: {hosts: [127.0.0.1, 127.0.0.1], port: 40000}}
          b: {model: ./model, port: 8081, method: fp16, distributed: {hosts: [127.0.0.1, 127.0.0.1], port: 40000}}
        """,
    )
    heads_model(tmp_path)
    found = issues(path)
    assert [(p, m.rsplit("of ", 1)[1]) for _, _, p, m in found] == [
        ("$.servers.a.distributed.port", "this server's own port"),
        ("$.servers.b.distributed.port", "server 'a'"),
    ]


@pytest.mark.slow
def test_a_rank_outside_a_group_refuses_before_loading() -> None:
    done = run_veloxd(
        "serve",
        "--model",
        str(Path(__file__).parents[2] / "veloxd" / "assets" / "tiny-llama"),
        "--method",
        "fp16",
        "--port",
        "1",
        "--distributed",
        "tensor",
        timeout=120,
    )
    assert done.returncode == 2 and "not one rank of a group" in done.stderr, done.stderr


def test_a_hostfile_ip_that_is_not_an_address_is_located_not_a_traceback(tmp_path: Path) -> None:
    """From an audit: `"ips": ["foo"]` raised in `veloxd check` (a traceback) and in the daemon's
    reload (daemon_step_failed); it is a located error on the entry's hostfile."""
    hosts = [{"ssh": "127.0.0.1", "ips": ["foo"]}, {"ssh": "127.0.0.1", "ips": ["127.0.0.1"]}]
    (tmp_path / "hosts.json").write_text(json.dumps(hosts))
    _, _, path, message = only_issue(config_with(tmp_path, "  hostfile: hosts.json\n"))
    assert path == "$.servers.coder.distributed.hostfile"
    assert "host 0 'ips' entry 'foo' is not an IP address" in message, message
