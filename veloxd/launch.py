"""How veloxd starts its own Python processes (workers, gateway, dashboard, downloads, MLX's launcher).

`python -P -m MODULE`: with -P (Python >= 3.11) neither the working directory nor a script's
directory goes on sys.path, so a daemon run from a folder holding a `veloxd` directory (say
`cd ~/src && veloxd run` next to a checkout) still runs the installed package in its children.
PYTHONPATH, where set, still applies (a development checkout is found through it on purpose).
"""

from __future__ import annotations

import sys


def module_argv(module: str, *args: str) -> list[str]:
    """argv running `module` of this interpreter's installed packages, whatever the working directory."""
    return [sys.executable, "-P", "-m", module, *args]


def veloxd_argv(*args: str) -> list[str]:
    """argv of a `veloxd ARGS` child: `python -P -m veloxd ARGS`."""
    return module_argv("veloxd", *args)
