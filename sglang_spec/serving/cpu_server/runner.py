"""Running a :class:`CPUServer`: on its own thread (tests, notebooks), loopback addresses only."""

from __future__ import annotations

import asyncio
import ipaddress
import threading
from contextlib import contextmanager

from aiohttp import web

from sglang_spec.serving.cpu_server.server import CPUServer


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ThreadedServer:
    """A :class:`CPUServer` on its own event loop in a daemon thread (for tests and notebooks)."""

    def __init__(self, server: CPUServer, host: str = "127.0.0.1", port: int = 0):
        if not is_loopback(host):
            raise ValueError(f"ThreadedServer binds loopback only, not {host!r}")
        self.server, self.host, self.port = server, host, port
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._main, name="cpu-server", daemon=True)
        self._runner: web.AppRunner | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def _main(self):
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._start())
        except BaseException as e:  # surfaced by start()
            self._error = e
            self._ready.set()
            return
        self._ready.set()
        self._loop.run_forever()
        self._loop.run_until_complete(self._runner.cleanup())
        self._loop.close()

    async def _start(self):
        self._runner = web.AppRunner(self.server.make_app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]

    def start(self, timeout: float = 10.0) -> ThreadedServer:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("cpu server did not start")
        if self._error:
            raise self._error
        return self

    def stop(self, timeout: float = 10.0) -> None:
        if self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


@contextmanager
def serve_in_thread(engine, codec=None, host: str = "127.0.0.1", port: int = 0, **kwargs):
    """``with serve_in_thread(engine) as srv: ... srv.url ... srv.server.completed``"""
    ts = ThreadedServer(CPUServer(engine, codec, **kwargs), host, port).start()
    try:
        yield ts
    finally:
        ts.stop()
