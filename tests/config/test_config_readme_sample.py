"""README.md's sample `veloxd check` output is what `veloxd check` prints for the file it describes."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.config_support import write_config
from tests.support import REPO

# The file behind the sample: a misspelled key (did-you-mean) and a setting of another method.
SAMPLE_FILE = """\
version: 1
servers:
  qa:
    model: ./model
    port: 8082
    hots: 127.0.0.1
    method: h2o
    overrides:
      kivi_group_size: 64
"""


def _readme_sample() -> str:
    """The fenced block after "For example:" in the `veloxd check` paragraph."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    after = text.split("`veloxd check [FILE] [--json]` reports every mistake at once", 1)[1]
    block = after.split("For example:\n\n```\n", 1)[1]
    return block.split("```", 1)[0]


def test_readme_sample_is_the_real_output(tmp_path: Path) -> None:
    write_config(tmp_path, SAMPLE_FILE, dedent=False)
    done = subprocess.run(
        [sys.executable, "-m", "veloxd", "check", "veloxd.yaml"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # the sample names the file as given: veloxd.yaml
    )
    assert done.returncode == 1 and done.stdout == ""
    sample = _readme_sample()
    assert sample.count("\n") == 2  # the block was found and holds both lines
    assert done.stderr == sample
