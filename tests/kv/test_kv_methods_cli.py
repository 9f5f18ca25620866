"""`veloxd methods NAME` and `veloxd --help` as real processes: one method in full, from the one source."""

from __future__ import annotations

import argparse
import json

from tests.support import run_reporting_imports, run_veloxd
from veloxd.kv import registry
from veloxd.kv.config import field_named, fields_for


def test_methods_name_shows_fields_with_defaults_ranges_paper_and_deviations() -> None:
    done, heavy = run_reporting_imports("methods", "kivi")
    assert (done.returncode, heavy) == (0, []), done.stderr
    info = registry.get("kivi")
    lines = done.stdout.splitlines()
    assert lines[0] == f"kivi: {info.summary}"
    assert f"  paper:      {info.paper}" in lines and f"  deviations: {info.deviations}" in lines
    assert "  bits:       2, 4 (default 4)" in lines
    [row] = [line for line in lines if line.strip().startswith("kivi_group_size ")]
    assert (
        row.split()[:3] == ["kivi_group_size", "int", "32"]
        and "one of 32, 64, 128" in row
        and field_named("kivi_group_size").metadata["help"] in row
    )
    [row] = [line for line in lines if line.strip().startswith("kivi_residual_length ")]
    assert row.split()[:4] == ["kivi_residual_length", "int", "128", "0..8192"]


def test_methods_name_covers_every_field_of_a_hybrid_and_refuses_a_typo() -> None:
    done = run_veloxd("methods", "snapkv_affine")
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split()[:2] == ["field", "type"])
    table = lines[header + 1 : lines.index("", header)]
    assert [line.split()[0] for line in table] == [n for n in fields_for("snapkv_affine") if n != "bits"]
    assert "  family:     hybrid (snapkv over affine)" in done.stdout.splitlines()
    typo = run_veloxd("methods", "kiv")
    assert typo.returncode == 2 and typo.stdout == ""
    assert typo.stderr.startswith("veloxd methods: error: unknown method 'kiv'; did you mean 'kivi'?")


def test_methods_name_json_is_that_method_of_the_registry() -> None:
    done = run_veloxd("methods", "--json", "h2o")
    data = json.loads(done.stdout)
    assert data["name"] == "h2o" and data["paper"] == registry.get("h2o").paper
    assert [f["name"] for f in data["fields"]] == list(fields_for("h2o"))


def test_help_lists_every_command() -> None:
    from veloxd.cli import build_parser

    done = run_veloxd("--help")
    subparsers = build_parser()._subparsers
    assert subparsers is not None
    action = subparsers._group_actions[0]
    assert isinstance(action, argparse._SubParsersAction)
    commands = action.choices
    listed = {line.split()[0] for line in done.stdout.splitlines() if line.startswith("    ") and line.split()}
    assert set(commands) <= listed, set(commands) - listed
    assert "gateway" in listed
