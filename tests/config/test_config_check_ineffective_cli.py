"""`veloxd check` (a real process) prints a key that does nothing as a located warning: exit 0, 1 with --strict."""

from __future__ import annotations

import json
from pathlib import Path

from tests.config_support import write_config
from tests.support import run_veloxd

TEXT = (
    "version: 1\nservers:\n  coder:\n    model: ./model\n    port: 8081\n    method: fp16\n    aliases: [assistant]\n"
)
WARNING = (
    "{path}:7:5: warning: aliases do nothing without a gateway: block "
    "(only the gateway routes requests by model name) (at $.servers.coder.aliases)"
)


def test_an_ineffective_key_warns_and_fails_only_under_strict(tmp_path: Path) -> None:
    path = write_config(tmp_path, TEXT, dedent=False)
    done = run_veloxd("check", str(path))
    assert done.returncode == 0 and done.stdout.startswith(f"{path}: valid;")
    assert done.stderr.splitlines() == [WARNING.format(path=path)]
    strict = run_veloxd("check", "--strict", str(path))
    assert strict.returncode == 1
    assert strict.stderr.splitlines() == [
        WARNING.format(path=path),
        f"{path}: --strict: failing on 1 warning (above); without --strict the file is valid",
    ]
    report = json.loads(run_veloxd("check", "--json", str(path)).stdout)
    assert report["valid"] and report["warnings"] == [WARNING.format(path=path)]
