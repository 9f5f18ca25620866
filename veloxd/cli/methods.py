"""The `veloxd methods` subcommand: the registry as a table or JSON."""

from __future__ import annotations

import argparse
import json

from veloxd.kv import registry
from veloxd.kv.config import field_named, fields_for


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("methods", help="list the KV-cache methods and their fields")
    p.add_argument("--json", action="store_true", help="print the registry as JSON")
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


def run(args: argparse.Namespace) -> int:
    methods = [registry.get(name) for name in registry.names()]
    if args.json:
        data = []
        for info in methods:
            entry = info.to_dict()
            entry["fields"] = [describe_field(n) for n in fields_for(info.name)]
            data.append(entry)
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
    print("Every method listed is servable; none falls back to fp16.")
    return 0
