"""The gateway: one OpenAI-compatible endpoint in front of every server (docs/gateway.md).

`veloxd gateway` runs `app.build_app` under aiohttp. The modules here without aiohttp (`admission`,
`memory`) are also used by the daemon and the CLI, which never import aiohttp.
"""
