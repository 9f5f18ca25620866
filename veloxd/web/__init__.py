"""The dashboard and Prometheus /metrics: an aiohttp route installer (app.py) and the `veloxd web` process.

Never imported by the daemon (which runs no HTTP stack): the daemon starts `veloxd web` as a
supervised child for a `dashboard:` block, and a gateway process can install the same routes.
"""
