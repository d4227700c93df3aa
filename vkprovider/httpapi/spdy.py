"""SPDY/3.1 framing, sans I/O: what a kube-apiserver speaks to a kubelet for exec, attach and
port-forward (it upgrades the HTTP/1.1 connection with `Upgrade: SPDY/3.1` and opens one stream
per channel). No maintained Python library exists; this module owns the wire format only.

- `Decoder.feed(bytes)` returns whole frames; malformed input raises `ProtocolError` naming what
  is wrong, never more than `MAX_FRAME` bytes buffered and never more than `MAX_HEADERS` bytes
  of decompressed header block (a zlib bomb is refused).
- `Encoder` turns frames into bytes.
- Header blocks are compressed with zlib and the preset dictionary of the SPDY/3 draft, one
  compression context per direction for the whole connection (the receiver's inflater must see
  every block, in order).

Flow control (WINDOW_UPDATE) is framed here; the Go implementation Kubernetes uses sends none
and honours none beyond its initial window, so the session layer treats it as advisory.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

VERSION = 3
MAX_FRAME = 1 << 24  # the length field is 24 bits
MAX_HEADERS = 256 * 1024

# Control frame types.
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = 1, 2, 3, 4, 6, 7, 8, 9
# Flags.
FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02
# RST_STREAM status codes.
PROTOCOL_ERROR, INVALID_STREAM, REFUSED_STREAM, CANCEL, INTERNAL_ERROR = 1, 2, 3, 5, 6

#: The preset dictionary of SPDY/3 header compression (draft-mbelshe-httpbis-spdy-00, 2.6.10.1),
#: built from its listing: length-prefixed words ("_" stands for a space), then a run of common
#: value fragments. 1,423 bytes; a unit test pins its SHA-256.
# fmt: off
_WORDS = (
    "options", "head", "post", "put", "delete", "trace", "accept", "accept-charset", "accept-encoding",
    "accept-language", "accept-ranges", "age", "allow", "authorization", "cache-control", "connection",
    "content-base", "content-encoding", "content-language", "content-length", "content-location",
    "content-md5", "content-range", "content-type", "date", "etag", "expect", "expires", "from",
    "host", "if-match", "if-modified-since", "if-none-match", "if-range", "if-unmodified-since",
    "last-modified", "location", "max-forwards", "pragma", "proxy-authenticate", "proxy-authorization",
    "range", "referer", "retry-after", "server", "te", "trailer", "transfer-encoding", "upgrade",
    "user-agent", "vary", "via", "warning", "www-authenticate", "method", "get", "status", "200_OK",
    "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive", "origin",
)
# fmt: on
_TAIL = (
    b"100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    b"203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 "
    b"Unauthorized403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 "
    b"Service UnavailableJan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, "
    b"Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,image/png,image/jpg,image/gif,"
    b"application/xml,application/xhtml+xml,text/plain,text/javascript,publicprivatemax-age="
    b"gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0."
)
DICTIONARY = b"".join(struct.pack(">I", len(w)) + w.replace("_", " ").encode() for w in _WORDS) + _TAIL


class ProtocolError(Exception):
    """The peer sent something that is not SPDY/3.1; the connection cannot go on."""


Headers = dict[str, list[str]]


@dataclass
class DataFrame:
    stream_id: int
    data: bytes
    flags: int = 0

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


@dataclass
class SynStream:
    stream_id: int
    headers: Headers
    associated_id: int = 0
    priority: int = 0
    flags: int = 0

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


@dataclass
class SynReply:
    stream_id: int
    headers: Headers
    flags: int = 0


@dataclass
class RstStream:
    stream_id: int
    status: int


@dataclass
class Settings:
    entries: dict[int, int] = field(default_factory=dict)
    flags: int = 0


@dataclass
class Ping:
    ping_id: int


@dataclass
class GoAway:
    last_good_stream_id: int
    status: int = 0


@dataclass
class HeadersFrame:
    stream_id: int
    headers: Headers
    flags: int = 0

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


@dataclass
class WindowUpdate:
    stream_id: int
    delta: int


Frame = DataFrame | SynStream | SynReply | RstStream | Settings | Ping | GoAway | HeadersFrame | WindowUpdate


# -- header blocks -------------------------------------------------------------------------------


def _pack_block(headers: Headers) -> bytes:
    out = [struct.pack(">I", len(headers))]
    for name, values in headers.items():
        raw_name = name.lower().encode()
        raw_value = b"\x00".join(v.encode() for v in values)
        out += [struct.pack(">I", len(raw_name)), raw_name, struct.pack(">I", len(raw_value)), raw_value]
    return b"".join(out)


def _unpack_block(raw: bytes) -> Headers:
    def take(at: int, size: int) -> tuple[bytes, int]:
        if at + size > len(raw):
            raise ProtocolError("header block ends early")
        return raw[at : at + size], at + size

    count_raw, at = take(0, 4)
    (count,) = struct.unpack(">I", count_raw)
    if count > len(raw) // 8:
        raise ProtocolError(f"header block claims {count} headers in {len(raw)} bytes")
    headers: Headers = {}
    for _ in range(count):
        size_raw, at = take(at, 4)
        name_raw, at = take(at, struct.unpack(">I", size_raw)[0])
        size_raw, at = take(at, 4)
        value_raw, at = take(at, struct.unpack(">I", size_raw)[0])
        if not name_raw:
            raise ProtocolError("empty header name")
        try:
            name, value = name_raw.decode(), value_raw.decode()
        except UnicodeDecodeError as exc:
            raise ProtocolError("header is not UTF-8") from exc
        if name != name.lower():
            raise ProtocolError(f"header name {name!r} is not lower case")
        if name in headers:
            raise ProtocolError(f"header {name!r} given twice")
        headers[name] = value.split("\x00")
    if at != len(raw):
        raise ProtocolError("bytes after the last header")
    return headers


# -- encoder -------------------------------------------------------------------------------------


def _control(kind: int, flags: int, payload: bytes) -> bytes:
    if len(payload) >= MAX_FRAME:
        raise ValueError("frame too long")
    return struct.pack(">HHI", 0x8000 | VERSION, kind, (flags << 24) | len(payload)) + payload


class Encoder:
    """Frames to bytes; one per connection (the header compressor is shared)."""

    def __init__(self) -> None:
        self._deflate = zlib.compressobj(zdict=DICTIONARY)

    def _block(self, headers: Headers) -> bytes:
        return self._deflate.compress(_pack_block(headers)) + self._deflate.flush(zlib.Z_SYNC_FLUSH)

    def encode(self, frame: Frame) -> bytes:
        if isinstance(frame, DataFrame):
            if len(frame.data) >= MAX_FRAME:
                raise ValueError("frame too long")
            return struct.pack(">II", frame.stream_id & 0x7FFFFFFF, (frame.flags << 24) | len(frame.data)) + frame.data
        if isinstance(frame, SynStream):
            head = struct.pack(">IIBB", frame.stream_id, frame.associated_id, (frame.priority & 7) << 5, 0)
            return _control(SYN_STREAM, frame.flags, head + self._block(frame.headers))
        if isinstance(frame, SynReply):
            return _control(SYN_REPLY, frame.flags, struct.pack(">I", frame.stream_id) + self._block(frame.headers))
        if isinstance(frame, HeadersFrame):
            return _control(HEADERS, frame.flags, struct.pack(">I", frame.stream_id) + self._block(frame.headers))
        if isinstance(frame, RstStream):
            return _control(RST_STREAM, 0, struct.pack(">II", frame.stream_id, frame.status))
        if isinstance(frame, Settings):
            body = struct.pack(">I", len(frame.entries))
            body += b"".join(struct.pack(">II", key & 0xFFFFFF, value) for key, value in frame.entries.items())
            return _control(SETTINGS, frame.flags, body)
        if isinstance(frame, Ping):
            return _control(PING, 0, struct.pack(">I", frame.ping_id))
        if isinstance(frame, GoAway):
            return _control(GOAWAY, 0, struct.pack(">II", frame.last_good_stream_id, frame.status))
        return _control(WINDOW_UPDATE, 0, struct.pack(">II", frame.stream_id, frame.delta))


# -- decoder -------------------------------------------------------------------------------------


class FrameTooLarge(ProtocolError):
    """A frame longer than the decoder accepts (refused from its header, before it is read)."""


class Decoder:
    """Bytes to frames; one per connection (the header decompressor is shared). `max_frame`
    bounds a frame's payload, so what is buffered stays under it plus one read."""

    def __init__(self, max_frame: int = MAX_FRAME) -> None:
        self._buffer = bytearray()
        self._at = 0  # where the next frame starts in `_buffer`
        self._inflate = zlib.decompressobj(zdict=DICTIONARY)
        self.max_frame = max_frame

    @property
    def pending(self) -> int:
        """Bytes received and not yet made into frames."""
        return len(self._buffer) - self._at

    def push(self, data: bytes) -> None:
        """Take bytes; `next` makes frames of them."""
        if self._at:
            del self._buffer[: self._at]  # once per read, not once per frame
            self._at = 0
        self._buffer += data

    def next(self) -> Frame | None:
        """The next whole frame, or None until more bytes come. Raises ProtocolError (and
        FrameTooLarge from a frame's header, before its payload is awaited)."""
        while len(self._buffer) - self._at >= 8:
            first, second = struct.unpack_from(">II", self._buffer, self._at)
            flags, length = second >> 24, second & 0xFFFFFF
            if length > self.max_frame:
                raise FrameTooLarge(f"frame of {length} bytes, over the limit of {self.max_frame}")
            start = self._at + 8
            if len(self._buffer) < start + length:
                return None
            payload = bytes(self._buffer[start : start + length])
            self._at = start + length
            if not first & 0x80000000:
                return DataFrame(first & 0x7FFFFFFF, payload, flags)
            frame = self._control((first >> 16) & 0x7FFF, first & 0xFFFF, flags, payload)
            if frame is not None:
                return frame  # else an unknown control frame: ignored, as the draft asks
        return None

    def feed(self, data: bytes) -> list[Frame]:
        """Every whole frame `data` completes."""
        self.push(data)
        frames: list[Frame] = []
        while (frame := self.next()) is not None:
            frames.append(frame)
        self.push(b"")
        return frames

    def _headers(self, raw: bytes) -> Headers:
        try:
            plain = self._inflate.decompress(raw, MAX_HEADERS)
        except zlib.error as exc:
            raise ProtocolError(f"header block does not decompress: {exc}") from exc
        if self._inflate.unconsumed_tail or len(plain) >= MAX_HEADERS:
            raise ProtocolError(f"header block over {MAX_HEADERS} bytes")
        return _unpack_block(plain)

    def _control(self, version: int, kind: int, flags: int, payload: bytes) -> Frame | None:
        if version != VERSION:
            raise ProtocolError(f"SPDY version {version}, not {VERSION}")

        def need(size: int, what: str) -> None:
            if len(payload) < size:
                raise ProtocolError(f"{what} frame of {len(payload)} bytes, at least {size} needed")

        if kind == SYN_STREAM:
            need(10, "SYN_STREAM")
            stream_id, associated, priority = struct.unpack_from(">IIB", payload)
            stream_id &= 0x7FFFFFFF
            if stream_id == 0:
                raise ProtocolError("SYN_STREAM for stream 0")
            return SynStream(stream_id, self._headers(payload[10:]), associated & 0x7FFFFFFF, priority >> 5, flags)
        if kind in (SYN_REPLY, HEADERS):
            need(4, "SYN_REPLY" if kind == SYN_REPLY else "HEADERS")
            stream_id = struct.unpack_from(">I", payload)[0] & 0x7FFFFFFF
            headers = self._headers(payload[4:])
            return SynReply(stream_id, headers, flags) if kind == SYN_REPLY else HeadersFrame(stream_id, headers, flags)
        if kind == RST_STREAM:
            need(8, "RST_STREAM")
            stream_id, status = struct.unpack_from(">II", payload)
            return RstStream(stream_id & 0x7FFFFFFF, status)
        if kind == SETTINGS:
            need(4, "SETTINGS")
            (count,) = struct.unpack_from(">I", payload)
            if len(payload) != 4 + 8 * count:
                raise ProtocolError(f"SETTINGS with {count} entries in {len(payload)} bytes")
            entries = {}
            for i in range(count):
                key, value = struct.unpack_from(">II", payload, 4 + 8 * i)
                entries[key & 0xFFFFFF] = value
            return Settings(entries, flags)
        if kind == PING:
            need(4, "PING")
            return Ping(struct.unpack_from(">I", payload)[0])
        if kind == GOAWAY:
            need(4, "GOAWAY")
            last = struct.unpack_from(">I", payload)[0] & 0x7FFFFFFF
            status = struct.unpack_from(">I", payload, 4)[0] if len(payload) >= 8 else 0
            return GoAway(last, status)
        if kind == WINDOW_UPDATE:
            need(8, "WINDOW_UPDATE")
            stream_id, delta = struct.unpack_from(">II", payload)
            return WindowUpdate(stream_id & 0x7FFFFFFF, delta & 0x7FFFFFFF)
        return None  # unknown control frames are ignored, as the draft asks
