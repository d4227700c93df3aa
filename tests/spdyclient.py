"""A raw SPDY/3.1 client on loopback, as the kube-apiserver speaks to a kubelet: the HTTP
upgrade by hand, then frames from `vkprovider.httpapi.spdy`. The tests of the kubelet port's
streaming side (port-forward, remote command, the limits) drive the server with it."""

from __future__ import annotations

import asyncio

from vkprovider.httpapi import spdy


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.encoder, self.decoder = spdy.Encoder(), spdy.Decoder()
        self.frames: list[spdy.Frame] = []

    def send(self, *frames: spdy.Frame) -> None:
        for frame in frames:
            self.writer.write(self.encoder.encode(frame))

    def open(self, stream_id: int, kind: str, port: int, request: str | None, fin: bool = False) -> None:
        headers = {"streamtype": [kind], "port": [str(port)]}
        if request is not None:
            headers["requestid"] = [request]
        self.send(spdy.SynStream(stream_id, headers, flags=spdy.FLAG_FIN if fin else 0))

    async def read_more(self) -> bool:
        """Frames of the next bytes the server sent; False once it closed the connection."""
        try:
            chunk = await self.reader.read(65536)
        except ConnectionError:
            return False
        self.frames += self.decoder.feed(chunk)
        return bool(chunk)

    async def until_closed(self, stream_id: int) -> bytes:
        """The data of `stream_id` up to its FIN."""
        async with asyncio.timeout(10):
            while True:
                for frame in self.frames:
                    if isinstance(frame, spdy.DataFrame) and frame.stream_id == stream_id and frame.fin:
                        return b"".join(
                            f.data for f in self.frames if isinstance(f, spdy.DataFrame) and f.stream_id == stream_id
                        )
                assert await self.read_more(), "the server closed the connection"

    async def until_frame(self, kind: type[spdy.Frame], stream_id: int) -> spdy.Frame:
        """The first frame of this kind about `stream_id` (PING: its id)."""
        async with asyncio.timeout(10):
            while True:
                for frame in self.frames:
                    if (
                        isinstance(frame, kind)
                        and getattr(frame, "stream_id", getattr(frame, "ping_id", None)) == stream_id
                    ):
                        return frame
                assert await self.read_more(), "the server closed the connection"

    async def until_eof(self) -> None:
        async with asyncio.timeout(10):
            while await self.read_more():
                pass


async def connect(
    port: int, path: str, protocol: str, *, host: str = "127.0.0.1", local: str | None = None
) -> tuple[Client, bytes]:
    """Upgrade a new connection to SPDY on `path`: the client and the response's head."""
    reader, writer = await asyncio.open_connection(host, port, local_addr=(local, 0) if local else None)
    writer.write(
        (
            f"POST {path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
            f"X-Stream-Protocol-Version: {protocol}\r\nContent-Length: 0\r\n\r\n"
        ).encode()
    )
    head = await reader.readuntil(b"\r\n\r\n")
    return Client(reader, writer), head
