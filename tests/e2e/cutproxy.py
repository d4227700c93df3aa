"""A TCP proxy in front of a lab apiserver that a test can cut and mend: a member outage for one
provider only, without stopping an apiserver every other test shares.

TLS passes through untouched (the lab's serving certificates name 127.0.0.1, whatever the
port). Cut: open connections are closed and new ones are closed at once, as a refused or
partitioned apiserver looks to a client; mend: connections pass again.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from urllib.parse import urlsplit

import yaml


class CutProxy:
    def __init__(self, kubeconfig: Path, *, listen: str = "127.0.0.1") -> None:
        self._source = kubeconfig
        self._listen = listen
        config = yaml.safe_load(kubeconfig.read_text())
        server = urlsplit(config["clusters"][0]["cluster"]["server"])
        self._target = (server.hostname or "127.0.0.1", server.port or 443)
        self._server: asyncio.Server | None = None
        self._open = True
        self._pipes: set[asyncio.Task[None]] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.port = 0

    async def start(self) -> None:
        self._server = await asyncio.start_server(self._accept, self._listen, 0)
        self.port = self._server.sockets[0].getsockname()[1]

    def kubeconfig(self, path: Path) -> Path:
        """A copy of the apiserver's kubeconfig that goes through this proxy."""
        config = yaml.safe_load(self._source.read_text())
        for cluster in config["clusters"]:
            cluster["cluster"]["server"] = f"https://127.0.0.1:{self.port}"
        path.write_text(yaml.safe_dump(config))
        return path

    def cut(self) -> None:
        self._open = False
        for writer in list(self._writers):
            writer.close()

    def mend(self) -> None:
        self._open = True

    async def stop(self) -> None:
        self.cut()
        if self._server is not None:
            self._server.close()
        for task in list(self._pipes):
            task.cancel()
        await asyncio.gather(*self._pipes, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._open:
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self._target)
        except OSError:
            writer.close()
            return
        self._writers |= {writer, up_writer}
        for src, dst in ((reader, up_writer), (up_reader, writer)):
            task = asyncio.create_task(self._pipe(src, dst), name=f"cutproxy/{self.port}")
            self._pipes.add(task)
            task.add_done_callback(self._pipes.discard)

    async def _pipe(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
        try:
            while chunk := await src.read(65536):
                dst.write(chunk)
                await dst.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass  # the other side went (or the proxy was cut): the pair ends
        finally:
            self._writers.discard(dst)
            dst.close()
            with contextlib.suppress(OSError):
                await dst.wait_closed()
