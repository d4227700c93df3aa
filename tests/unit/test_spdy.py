"""SPDY/3.1 framing (vkprovider.httpapi.spdy): every frame type round-trips, header blocks share
one compression context per direction, input split anywhere decodes the same, and malformed or
random input raises ProtocolError, never anything else (a fuzz with a fixed seed)."""

from __future__ import annotations

import contextlib
import hashlib
import random
import struct
import zlib

import pytest

from vkprovider.httpapi import spdy
from vkprovider.httpapi.spdy import (
    DataFrame,
    Decoder,
    Encoder,
    GoAway,
    HeadersFrame,
    Ping,
    ProtocolError,
    RstStream,
    Settings,
    SynReply,
    SynStream,
    WindowUpdate,
)

FRAMES: list[spdy.Frame] = [
    SynStream(1, {"streamtype": ["error"]}, priority=0),
    SynStream(3, {"streamtype": ["stdin"], "x-multi": ["a", "b"]}, associated_id=1, priority=7, flags=spdy.FLAG_FIN),
    SynReply(1, {"streamtype": ["error"]}),
    HeadersFrame(3, {"x": ["y"]}, flags=spdy.FLAG_FIN),
    DataFrame(3, b"hello", flags=spdy.FLAG_FIN),
    DataFrame(5, b""),
    RstStream(3, spdy.CANCEL),
    Settings({spdy.SETTINGS: 100, 7: 65536}),
    Ping(2),
    GoAway(7, 0),
    WindowUpdate(3, 1 << 20),
]


def test_the_dictionary_is_the_spdy3_one() -> None:
    # 1,423 bytes; digest of the listing in the SPDY/3 draft (checked against the Go framer's).
    assert len(spdy.DICTIONARY) == 1423
    assert hashlib.sha256(spdy.DICTIONARY).hexdigest() == (
        "51d27341373f923f3cd88e1eb7162aeaa3723d7585ff2399201dc06498407f02"
    )


def test_every_frame_round_trips_through_one_connection_context() -> None:
    encoder, decoder = Encoder(), Decoder()
    wire = b"".join(encoder.encode(f) for f in FRAMES)
    assert decoder.feed(wire) == FRAMES


def test_input_split_anywhere_decodes_the_same() -> None:
    encoder = Encoder()
    wire = b"".join(encoder.encode(f) for f in FRAMES * 3)
    decoder = Decoder()
    got: list[spdy.Frame] = []
    rng = random.Random(7)
    at = 0
    while at < len(wire):
        step = rng.randint(1, 9)
        got += decoder.feed(wire[at : at + step])
        at += step
    assert got == FRAMES * 3


def test_header_blocks_need_the_shared_context() -> None:
    encoder = Encoder()
    first = encoder.encode(SynStream(1, {"streamtype": ["stdout"]}))
    second = encoder.encode(SynStream(3, {"streamtype": ["stdout"]}))
    assert len(second) < len(first)  # the second block refers back to the first
    with pytest.raises(ProtocolError):
        Decoder().feed(second)  # a fresh inflater cannot read it


def test_a_data_frame_of_the_largest_size() -> None:
    data = bytes(spdy.MAX_FRAME - 1)
    (frame,) = Decoder().feed(Encoder().encode(DataFrame(1, data)))
    assert isinstance(frame, DataFrame) and len(frame.data) == len(data)
    with pytest.raises(ValueError):
        Encoder().encode(DataFrame(1, bytes(spdy.MAX_FRAME)))


def _control(kind: int, payload: bytes, version: int = 3, flags: int = 0) -> bytes:
    return struct.pack(">HHI", 0x8000 | version, kind, (flags << 24) | len(payload)) + payload


def _block(raw: bytes) -> bytes:
    deflate = zlib.compressobj(zdict=spdy.DICTIONARY)
    return deflate.compress(raw) + deflate.flush(zlib.Z_SYNC_FLUSH)


def _reply(block: bytes) -> bytes:
    """A SYN_REPLY for stream 1 carrying this (uncompressed) header block."""
    return _control(spdy.SYN_REPLY, struct.pack(">I", 1) + _block(block))


@pytest.mark.parametrize(
    ("wire", "said"),
    [
        (_control(spdy.PING, b"\x00\x00\x00\x01", version=2), "version 2"),
        (_control(spdy.PING, b"\x00\x01"), "PING frame of 2 bytes"),
        (_control(spdy.RST_STREAM, b"\x00" * 4), "RST_STREAM"),
        (_control(spdy.SETTINGS, struct.pack(">I", 3) + b"\x00" * 8), "SETTINGS with 3 entries"),
        (_control(spdy.SYN_STREAM, struct.pack(">IIBB", 0, 0, 0, 0) + _block(struct.pack(">I", 0))), "stream 0"),
        (_control(spdy.SYN_STREAM, struct.pack(">IIBB", 1, 0, 0, 0) + b"not zlib"), "does not decompress"),
        (
            _reply(struct.pack(">II", 1, 50) + b"a"),
            "ends early",
        ),
        (_reply(struct.pack(">I", 1000)), "claims 1000 headers"),
        (
            _reply(struct.pack(">II", 1, 1) + b"A" + bytes(4)),
            "not lower case",
        ),
        (
            _control(
                spdy.SYN_REPLY,
                struct.pack(">I", 1) + _block(struct.pack(">I", 2) + (struct.pack(">I", 1) + b"a" + bytes(4)) * 2),
            ),
            "given twice",
        ),
        (
            _reply(struct.pack(">II", 1, 1) + b"a" + bytes(4) + b"x"),
            "after the last header",
        ),
        # A zlib bomb: a small block that inflates past the limit.
        (
            _reply(struct.pack(">I", 1) + bytes(spdy.MAX_HEADERS * 4)),
            "over",
        ),
    ],
)
def test_malformed_frames_are_refused_with_a_reason(wire: bytes, said: str) -> None:
    with pytest.raises(ProtocolError, match=said):
        Decoder().feed(wire)


def test_unknown_control_frames_are_skipped() -> None:
    wire = _control(42, b"whatever") + Encoder().encode(Ping(4))
    assert Decoder().feed(wire) == [Ping(4)]


def test_random_and_mutated_input_raises_protocol_errors_only() -> None:
    rng = random.Random(20261130)
    encoder = Encoder()
    valid = b"".join(encoder.encode(f) for f in FRAMES)
    for trial in range(3000):
        if trial % 2:
            wire = bytes(rng.getrandbits(8) for _ in range(rng.randint(0, 200)))
        else:
            mutated = bytearray(valid)
            for _ in range(rng.randint(1, 8)):
                mutated[rng.randrange(len(mutated))] = rng.getrandbits(8)
            wire = bytes(mutated)
        decoder = Decoder()
        with contextlib.suppress(ProtocolError):  # refusing a mangled frame is the expected answer
            decoder.feed(wire)
