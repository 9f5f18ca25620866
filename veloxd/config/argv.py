"""The worker command line of a server entry: the flags of `veloxd serve` that run it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from veloxd import protocol

if TYPE_CHECKING:
    from veloxd.config.model import ServerEntry


def serve_argv(entry: ServerEntry) -> list[str]:
    """The flags of `veloxd serve` that run `entry` (without the program name)."""
    s, pc, lim = entry.sampling, entry.prompt_cache, entry.limits
    argv = ["--model", entry.model, protocol.KV_JSON_FLAG, protocol.kv_document(entry.kv.to_dict())]
    argv += ["--host", entry.host, "--port", str(entry.port)]
    if entry.adapter_path:
        argv += ["--adapter-path", entry.adapter_path]
    argv += ["--max-tokens", str(s.max_tokens), "--temp", str(s.temp), "--top-p", str(s.top_p)]
    argv += ["--prompt-cache-size", str(pc.size)]
    if pc.bytes is not None:
        argv += ["--prompt-cache-bytes", str(pc.bytes)]
    if lim.max_tokens is not None:
        argv += ["--limit-max-tokens", str(lim.max_tokens)]
    if lim.max_prompt_tokens is not None:
        argv += ["--limit-max-prompt-tokens", str(lim.max_prompt_tokens)]
    argv += ["--request-body-timeout", str(lim.request_body_timeout_s), "--max-body-bytes", str(lim.max_body_bytes)]
    if entry.api_key_env:
        argv += ["--api-key-env", entry.api_key_env]
    argv += ["--served-name", entry.name]  # the gateway forwards requests under the entry's name
    return argv
