"""The routes install into any aiohttp Application under a prefix (as a gateway will mount them),
and say so plainly when no daemon answers."""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import ClientSession, web
from aiohttp.test_utils import TestServer
from prometheus_client.parser import text_string_to_metric_families

from veloxd.web.app import add_routes
from veloxd.web.monitor import DaemonClient, Monitor


def test_routes_mount_under_a_prefix_without_a_daemon(tmp_path: Path) -> None:
    async def scenario() -> None:
        app = web.Application()
        add_routes(app, Monitor(DaemonClient(tmp_path / "no-daemon"), interval_s=0.2), prefix="/dashboard")
        server = TestServer(app, host="127.0.0.1")
        await server.start_server()
        try:
            async with ClientSession() as session:
                async with session.get(server.make_url("/dashboard/")) as page:
                    html = await page.text()
                    assert page.status == 200 and 'src="static/app.js"' in html  # relative: works under any prefix
                async with session.get(server.make_url("/dashboard/static/app.js")) as script:
                    assert script.status == 200 and "EventSource" in await script.text()
                async with session.get(server.make_url("/dashboard/api/state")) as state:
                    body = await state.json()
                    assert body["reachable"] is False and "no veloxd daemon" in body["error"]
                    assert body["servers"] == [] and body["actions"] is False
                async with session.get(server.make_url("/dashboard/metrics")) as metrics:
                    text = await metrics.text()
                samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
                assert samples == {"veloxd_daemon_up": 0.0}
                async with session.post(server.make_url("/dashboard/api/reload")) as refused:
                    assert refused.status == 403
                async with session.get(server.make_url("/metrics")) as outside:
                    assert outside.status == 404  # nothing installed outside the prefix
        finally:
            await server.close()

    asyncio.run(scenario())
