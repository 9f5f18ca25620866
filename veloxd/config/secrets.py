"""Secrets never leave the daemon's memory: redaction of `env:` values in what it writes.

An entry's `env:` may carry a bearer token, a hub token or a password. The state file (and so
`veloxd status --json` and `veloxd plan`) shows such values as REDACTED: values of keys whose
name looks like a secret, and the value of the entry's `api_key_env` variable whatever its name.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "<redacted>"
SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE)", re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name))


def redact_env(env: Mapping[str, str], api_key_env: str | None = None) -> dict[str, str]:
    """`env` with the values of secret-looking keys (and of `api_key_env`) replaced by REDACTED."""
    return {name: REDACTED if is_secret_name(name) or name == api_key_env else value for name, value in env.items()}


def redact_config(data: Mapping[str, Any]) -> dict[str, Any]:
    """A `config_to_dict` document with every entry's env redacted (the input is not changed)."""
    servers = {}
    for name, entry in (data.get("servers") or {}).items():
        entry = dict(entry)
        if entry.get("env"):
            entry["env"] = redact_env(entry["env"], entry.get("api_key_env"))
        servers[name] = entry
    return {**data, "servers": servers}


def redact_text(text: str, secrets: list[str]) -> str:
    """`text` with each secret value (at least 4 characters) replaced by REDACTED."""
    for secret in secrets:
        if len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    return text
