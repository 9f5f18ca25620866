"""`diff(current, desired)`: which servers start, stop, restart or update in place, and which keys changed."""

from __future__ import annotations

from pathlib import Path

from tests.config_support import model_dir
from veloxd.config import Config, load_config
from veloxd.config.plan import Plan, diff

BASE = {
    "coder": "{model: ./model, port: 8081, method: kivi, overrides: {kivi_group_size: 32}}",
    "chat": "{model: ./model, port: 8082, method: h2o, description: chat}",
    "old": "{model: ./model, port: 8083, method: fp16}",
}


def config(tmp_path: Path, servers: dict[str, str], name: str = "veloxd.yaml") -> Config:
    model_dir(tmp_path)
    path = tmp_path / name
    path.write_text("version: 1\nservers:\n" + "".join(f"  {k}: {v}\n" for k, v in servers.items()))
    path.chmod(0o644)
    return load_config(path)


def test_from_nothing_everything_is_added(tmp_path: Path) -> None:
    plan = diff(None, config(tmp_path, BASE))
    assert plan == Plan(added=("coder", "chat", "old"))
    assert not plan.is_noop
    assert plan.summary() == "3 to start, 0 to restart, 0 to update, 0 to stop, 0 unchanged"


def test_same_file_again_is_a_noop(tmp_path: Path) -> None:
    first = config(tmp_path, BASE)
    again = config(tmp_path, {**BASE, "coder": BASE["coder"].replace("}}", "}, bits: 4}")}, "again.yaml")
    plan = diff(first, again)  # bits: 4 is kivi's default: the effective config is the same
    assert plan.is_noop and plan.unchanged == ("coder", "chat", "old")
    assert plan.summary() == "no changes (3 unchanged)"


def test_added_removed_changed_updated_unchanged(tmp_path: Path) -> None:
    current = config(tmp_path, BASE)
    desired = config(
        tmp_path,
        {
            "coder": "{model: ./model, port: 9081, method: kivi, overrides: {kivi_group_size: 64}, description: new}",
            "chat": "{model: ./model, port: 8082, method: h2o, description: renamed, restart: {max_failures: 9}}",
            "fresh": "{model: ./model, port: 8084, method: affine}",
        },
        "desired.yaml",
    )
    plan = diff(current, desired)
    assert plan.added == ("fresh",) and plan.removed == ("old",) and plan.unchanged == ()
    assert dict(plan.changed) == {"coder": ("port", "overrides.kivi_group_size", "description")}
    assert dict(plan.updated) == {"chat": ("description", "restart.max_failures")}
    assert plan.to_dict() == {
        "added": ["fresh"],
        "removed": ["old"],
        "changed": {"coder": ["port", "overrides.kivi_group_size", "description"]},
        "updated": {"chat": ["description", "restart.max_failures"]},
        "unchanged": [],
        "is_noop": False,
        "summary": "1 to start, 1 to restart, 1 to update, 1 to stop, 0 unchanged",
    }


def test_method_env_and_sampling_changes_name_their_keys(tmp_path: Path) -> None:
    current = config(
        tmp_path,
        {
            "a": "{model: ./model, port: 8081, method: kivi, bits: 2, env: {A: '1', B: x}}",
            "b": "{model: ./model, port: 8082, method: affine, sampling: {temp: 0.2}}",
        },
    )
    desired = config(
        tmp_path,
        {
            "a": "{model: ./model, port: 8081, method: h2o, overrides: {h2o_budget: 512}, env: {A: '2', C: y}}",
            "b": "{model: ./model, port: 8082, method: affine, seed: 3, sampling: {temp: 0.2, top_p: 0.9}}",
        },
        "desired.yaml",
    )
    plan = diff(current, desired)
    assert dict(plan.changed) == {
        "a": ("method", "bits", "overrides.h2o_budget", "env.A", "env.C", "env.B"),
        "b": ("seed", "sampling.top_p"),
    }
    assert plan.added == plan.removed == plan.unchanged == () and not plan.updated


def test_live_only_changes_never_restart(tmp_path: Path) -> None:
    current = config(tmp_path, {"a": "{model: ./model, port: 8081, method: fp16}"})
    desired = config(
        tmp_path,
        {
            "a": "{model: ./model, port: 8081, method: fp16, ready_timeout_s: 5, "
            "stop_timeout_s: 2, allow_unauthenticated: true}"
        },
        "desired.yaml",
    )
    plan = diff(current, desired)
    assert dict(plan.updated) == {"a": ("allow_unauthenticated", "ready_timeout_s", "stop_timeout_s")}
    assert not plan.changed
