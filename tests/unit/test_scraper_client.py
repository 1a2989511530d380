"""Each engine's client and each canary used to build its own TLS context (the system's certificates loaded each
time, 0.7 MB and milliseconds per engine, for http:// too); they share the process's one."""

import asyncio
import ssl

from gpuwarden.engine import scraper


def test_engine_clients_share_one_tls_context(monkeypatch):
    made = []
    real = ssl.create_default_context

    def counted(*args, **kwargs):
        made.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ssl, "create_default_context", counted)
    monkeypatch.setattr(scraper, "_TLS", [], raising=False)
    clients = [scraper.client(2.0) for _ in range(5)]
    assert len(made) == 1

    async def close():
        for c in clients:
            await c.aclose()

    asyncio.run(close())
