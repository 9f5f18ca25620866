"""The `veloxd methods` subcommand: the registry as a table or JSON."""

from __future__ import annotations

import argparse
import json
import sys

from veloxd.kv import registry
from veloxd.kv.config import field_named, fields_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "methods",
        help="list the KV-cache methods, or show one: its fields with defaults and ranges, paper, deviations",
    )
    p.add_argument("name", nargs="?", metavar="NAME", help="one method to describe in full (default: the table)")
    p.add_argument("--json", action="store_true", help="print the registry (or the method NAME) as JSON")
    p.set_defaults(func=run)


def describe_field(name: str) -> dict:
    meta = field_named(name).metadata
    return {
        "name": name,
        "type": meta["kind"].__name__,
        "default": field_named(name).default,
        "choices": list(meta["choices"]) if meta["choices"] else None,
        "minimum": meta["minimum"],
        "maximum": meta["maximum"],
        "help": meta["help"],
    }


def method_json(info: registry.MethodInfo) -> dict:
    entry = info.to_dict()
    entry["fields"] = [describe_field(n) for n in fields_for(info.name)]
    return entry


def value_range(field: dict) -> str:
    """A field's valid values as a person reads them: its choices, or its bounds."""
    if field["choices"]:
        return "one of " + ", ".join(map(str, field["choices"]))
    low, high = field["minimum"], field["maximum"]
    if low is None and high is None:
        return "-"
    return f"{'' if low is None else low}..{'' if high is None else high}"


def describe(info: registry.MethodInfo) -> str:
    """One method in full, from the registry and KVCacheConfig's field metadata (the one source)."""
    lines = [f"{info.name}: {info.summary}", ""]
    facts = [
        ("family", info.family + (f" ({' over '.join(info.parts)})" if info.parts else "")),
        ("storage", info.storage),
        (
            "bits",
            ", ".join(map(str, info.bits_choices)) + f" (default {info.default_bits})" if info.bits_choices else "-",
        ),
        ("batchable", "yes" if info.batchable else "no"),
        ("trimmable", str(info.trimmable)),
        ("paper", info.paper or "-"),
        ("deviations", info.deviations or "none"),
    ]
    lines += [f"  {label + ':':<12}{text}" for label, text in facts]
    fields = [describe_field(n) for n in fields_for(info.name) if n != "bits"]  # bits: above
    if not fields:
        lines += ["", "fields: none (no overrides)"]
        return "\n".join(lines)
    rows = [("field", "type", "default", "range", "meaning")]
    rows += [(f["name"], f["type"], _shown(f["default"]), value_range(f), f["help"]) for f in fields]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines.append("")
    for row in rows:
        lines.append("  " + "  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4])
    lines += [
        "",
        f"Set a field under `overrides:` in veloxd.yaml, or `veloxd serve --method {info.name} --set FIELD=VALUE`.",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    if args.name is not None:
        try:
            info = registry.get(args.name)
        except ValueError as err:  # names the valid methods and a near miss
            print(f"veloxd methods: error: {err}", file=sys.stderr)
            return 2
        print(json.dumps({"schema_version": 1, **method_json(info)}, indent=2) if args.json else describe(info))
        return 0
    methods = [registry.get(name) for name in registry.names()]
    if args.json:
        data = []
        for info in methods:
            data.append(method_json(info))
        print(json.dumps({"schema_version": 1, "methods": data}, indent=2))
        return 0
    width = max(16, *(len(info.name) + 1 for info in methods))  # hybrids: streaming_llm_affine
    print(f"{'method':<{width}} {'family':<13} {'storage':<8} {'bits':<14} {'batchable':<10} {'trimmable':<15} fields")
    for info in methods:
        bits = ",".join(map(str, info.bits_choices)) or "-"
        if info.default_bits is not None:
            bits += f" ({info.default_bits})"
        fields = ", ".join(n for n in fields_for(info.name) if n != "bits") or "-"  # bits: own column
        batch = "yes" if info.batchable else "no"
        print(
            f"{info.name:<{width}} {info.family:<13} {info.storage:<8} {bits:<14} {batch:<10} {info.trimmable:<15} {fields}"
        )
    print("\nstorage: packed = resident bytes really shrink; evicted = bounded token count; fp16 = baseline.")
    print("hybrid: an eviction policy whose retained tokens are stored as a quantizer's codes (<policy>_<quantizer>).")
    print("Every method listed is servable; none falls back to fp16. `veloxd methods NAME` shows one in full.")
    return 0


def _shown(default: object) -> str:
    return "unset" if default is None else str(default)
