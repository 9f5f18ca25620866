"""What applying a config does to the running servers: a pure diff of two Configs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from veloxd.config.model import Config

_ABSENT = object()


@dataclass(frozen=True)
class Plan:
    """Servers to start, stop, restart (`changed`), update in place (`updated`) or leave alone.

    `changed` and `updated` map a server to the keys that differ, e.g. ("overrides.kivi_group_size", "port").
    A server is `changed` when any key needing a new process differs (its live keys are listed too);
    `updated` when only live keys differ (description, timeouts, restart policy, allow_unauthenticated).
    """

    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    changed: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    updated: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    unchanged: tuple[str, ...] = ()

    @property
    def is_noop(self) -> bool:
        return not (self.added or self.removed or self.changed or self.updated)

    def summary(self) -> str:
        """One line, e.g. "1 to start, 1 to restart, 0 to update, 1 to stop, 2 unchanged"."""
        if self.is_noop:
            return f"no changes ({len(self.unchanged)} unchanged)"
        return (
            f"{len(self.added)} to start, {len(self.changed)} to restart, {len(self.updated)} to update, "
            f"{len(self.removed)} to stop, {len(self.unchanged)} unchanged"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "added": list(self.added),
            "removed": list(self.removed),
            "changed": {name: list(keys) for name, keys in self.changed.items()},
            "updated": {name: list(keys) for name, keys in self.updated.items()},
            "unchanged": list(self.unchanged),
            "is_noop": self.is_noop,
            "summary": self.summary(),
        }


def diff(current: Config | None, desired: Config) -> Plan:
    """The plan that turns `current` (None: nothing running) into `desired`; names are identities."""
    old = current.supervised() if current is not None else {}
    new = desired.supervised()
    changed: dict[str, tuple[str, ...]] = {}
    updated: dict[str, tuple[str, ...]] = {}
    unchanged = []
    for name, entry in new.items():
        if name not in old:
            continue
        restart_keys = changed_keys(old[name].process_key(), entry.process_key())
        live_keys = changed_keys(old[name].live_key(), entry.live_key())
        if restart_keys:
            changed[name] = restart_keys + live_keys
        elif live_keys:
            updated[name] = live_keys
        else:
            unchanged.append(name)
    return Plan(
        added=tuple(name for name in new if name not in old),
        removed=tuple(name for name in old if name not in new),
        changed=changed,
        updated=updated,
        unchanged=tuple(unchanged),
    )


def changed_keys(before: Mapping[str, Any], after: Mapping[str, Any]) -> tuple[str, ...]:
    """Keys whose values differ, or that exist on one side only, in `after`'s order."""
    keys = dict.fromkeys([*after, *before])
    return tuple(k for k in keys if before.get(k, _ABSENT) != after.get(k, _ABSENT))
