"""Property-based fuzzing of the SPDY/3.1 decoder (vkprovider.httpapi.spdy.Decoder, issue 35):
Hypothesis generates arbitrary bytes, valid frame sequences and mutated ones (length fields,
flags, header blocks: zlib bombs, truncated, finished or garbage blocks), from a few bytes to a
few hundred KiB, and feeds them split anywhere. Whatever comes in:
- the decoder returns frames or raises ProtocolError, nothing else;
- it never holds more than `max_frame` + 8 bytes between two reads;
- the outcome does not depend on how the input was split: a valid stream decodes to the frames
  it was made of, an invalid one fails at the same frame with the same error, and what a split
  feed returned before failing is a prefix of the frames before that error.

Pure (no I/O). Reproducible: derandomized, no example database; 5 to 10 s on a busy 2-core
machine.
"""

from __future__ import annotations

import itertools
import random
import struct
import zlib
from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vkprovider.httpapi import spdy
from vkprovider.httpapi.spdy import Decoder, Encoder, ProtocolError

settings.register_profile(
    "spdy-fuzz",
    max_examples=100,
    deadline=None,  # a busy CI machine; each example is bounded by its size instead
    derandomize=True,
    database=None,
    print_blob=False,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example],
)
FUZZ = settings.get_profile("spdy-fuzz")

MAX_FRAMES = (16, 300, 4096, 64 * 1024, 1024 * 1024, spdy.MAX_FRAME)
KiB = 1024

# -- strategies -----------------------------------------------------------------------------------

u31 = st.integers(0, 2**31 - 1)
u32 = st.integers(0, 2**32 - 1)
flags = st.integers(0, 255)
names = st.text("abcdefghijklmnopqrstuvwxyz0123456789-:", min_size=1, max_size=16)
values = st.lists(
    st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=24), min_size=1, max_size=3
)
headers = st.dictionaries(names, values, max_size=5)


@st.composite
def big_bytes(draw: st.DrawFn, low: int = 0, high: int = 300 * KiB) -> bytes:
    """Up to a few hundred KiB: random (from a drawn seed, so Hypothesis need not draw each
    byte), or a drawn pattern repeated."""
    size = draw(st.integers(low, high))
    if draw(st.booleans()):
        return random.Random(draw(st.integers(0, 2**32))).randbytes(size)
    pattern = draw(st.binary(min_size=1, max_size=16))
    return (pattern * (size // len(pattern) + 1))[:size]


small_data = st.binary(max_size=2 * KiB)
frames_st: st.SearchStrategy[spdy.Frame] = st.one_of(
    st.builds(spdy.DataFrame, u31, st.one_of(small_data, big_bytes(high=200 * KiB)), flags),
    st.builds(spdy.SynStream, st.integers(1, 2**31 - 1), headers, u31, st.integers(0, 7), flags),
    st.builds(spdy.SynReply, u31, headers, flags),
    st.builds(spdy.HeadersFrame, u31, headers, flags),
    st.builds(spdy.RstStream, u31, u32),
    st.builds(spdy.Settings, st.dictionaries(st.integers(0, 2**24 - 1), u32, max_size=4), flags),
    st.builds(spdy.Ping, u32),
    st.builds(spdy.GoAway, u31, u32),
    st.builds(spdy.WindowUpdate, u31, u31),
)


def splits(size: int) -> st.SearchStrategy[list[int]]:
    """Cut points: a few anywhere, or many small steps, or none."""
    return st.one_of(
        st.lists(st.integers(0, size), max_size=12),
        st.integers(1, 64).map(lambda step: list(range(step, size, step)) if size <= 64 * KiB else []),
    )


def pieces(wire: bytes, cuts: list[int]) -> list[bytes]:
    points = [0, *sorted(set(cuts)), len(wire)]
    return [wire[a:b] for a, b in itertools.pairwise(points)]


# -- helpers -------------------------------------------------------------------------------------


@dataclass
class Outcome:
    frames: list[spdy.Frame]
    error: str | None  # "<class>: <message>" of the ProtocolError, if one was raised


def feed(decoder: Decoder, chunks: list[bytes]) -> Outcome:
    """Feed the chunks in order; ProtocolError is the only exception allowed, and between two
    reads the decoder holds at most `max_frame` + 8 bytes."""
    got: list[spdy.Frame] = []
    for chunk in chunks:
        try:
            got += decoder.feed(chunk)
        except ProtocolError as exc:
            return Outcome(got, f"{type(exc).__name__}: {exc}")
        assert len(decoder._buffer) <= decoder.max_frame + 8
    return Outcome(got, None)


def frame_by_frame(wire: bytes, max_frame: int) -> Outcome:
    """The reference: each frame fed on its own (cut at the length its header gives), so the
    frames before an error are all returned."""
    cuts, at = [], 0
    while at + 8 <= len(wire):
        at += 8 + (struct.unpack_from(">I", wire, at + 4)[0] & 0xFFFFFF)
        cuts.append(min(at, len(wire)))
    return feed(Decoder(max_frame), pieces(wire, cuts))


def control(kind: int, payload: bytes, frame_flags: int = 0, version: int = spdy.VERSION) -> bytes:
    return struct.pack(">HHI", 0x8000 | version, kind, (frame_flags << 24) | len(payload)) + payload


def block_of(raw: bytes, deflate: zlib._Compress, end: int = zlib.Z_SYNC_FLUSH) -> bytes:
    return deflate.compress(raw) + deflate.flush(end)


def check_split_invariance(wire: bytes, cuts: list[int], max_frame: int) -> Outcome:
    reference = frame_by_frame(wire, max_frame)
    split = feed(Decoder(max_frame), pieces(wire, cuts))
    assert split.error == reference.error
    assert split.frames == reference.frames[: len(split.frames)]
    if reference.error is None:
        assert split.frames == reference.frames
    return reference


# -- properties ----------------------------------------------------------------------------------


@FUZZ
@given(st.one_of(st.binary(max_size=4 * KiB), big_bytes()), st.data(), st.sampled_from(MAX_FRAMES))
def test_arbitrary_bytes_split_anywhere(wire: bytes, data: st.DataObject, max_frame: int) -> None:
    check_split_invariance(wire, data.draw(splits(len(wire))), max_frame)


@FUZZ
@given(st.lists(frames_st, max_size=12), st.data())
def test_a_valid_stream_split_anywhere_decodes_to_its_frames(frames: list[spdy.Frame], data: st.DataObject) -> None:
    encoder = Encoder()
    wire = b"".join(encoder.encode(f) for f in frames)
    assert feed(Decoder(), pieces(wire, data.draw(splits(len(wire))))) == Outcome(frames, None)
    # Under a smaller limit the first frame over it ends the stream, however it was split.
    max_frame = data.draw(st.sampled_from(MAX_FRAMES))
    outcome = check_split_invariance(wire, data.draw(splits(len(wire))), max_frame)
    if outcome.error is not None:
        assert outcome.error.startswith("FrameTooLarge")


# Header blocks a peer can send in place of a well-formed one.
def bomb(size: int) -> bytes:
    """A block that inflates to `size` bytes (a valid header count, then zeros)."""
    return block_of(struct.pack(">I", 1) + bytes(size), zlib.compressobj(9, zdict=spdy.DICTIONARY))


@st.composite
def odd_block(draw: st.DrawFn, deflate: zlib._Compress) -> bytes:
    """A header block made with the connection's compressor (so the contexts stay in step
    unless the block itself breaks them) or a standalone one."""
    raw = spdy._pack_block(draw(headers))
    kind = draw(st.sampled_from(["bomb", "near-limit", "truncated", "finished", "trailing", "garbage", "raw"]))
    if kind == "bomb":
        return bomb(draw(st.integers(spdy.MAX_HEADERS, 8 * spdy.MAX_HEADERS)))
    if kind == "near-limit":  # one header whose value brings the block to about MAX_HEADERS
        size = spdy.MAX_HEADERS + draw(st.integers(-16, 16)) - 13
        return block_of(struct.pack(">II", 1, 1) + b"x" + struct.pack(">I", size) + b"v" * size, deflate)
    if kind == "truncated":
        whole = block_of(raw, deflate)
        return whole[: draw(st.integers(0, max(0, len(whole) - 1)))]
    if kind == "finished":  # the peer's zlib stream ends: its later blocks cannot be read
        return block_of(raw, deflate.copy(), zlib.Z_FINISH)
    if kind == "trailing":
        return block_of(raw, deflate) + draw(st.binary(min_size=1, max_size=8))
    if kind == "garbage":
        return draw(st.binary(max_size=64))
    return raw  # uncompressed


@st.composite
def mutated_streams(draw: st.DrawFn) -> bytes:
    """Valid frames (one compression context), crafted control frames and garbage, then byte
    mutations: lengths, flags, versions, types, bytes set, inserted, deleted, truncated."""
    deflate = zlib.compressobj(zdict=spdy.DICTIONARY)
    encoder = Encoder()
    encoder._deflate = deflate  # crafted blocks share the valid frames' context
    segments: list[bytes] = []
    for _ in range(draw(st.integers(1, 10))):
        kind = draw(st.sampled_from(["frame", "frame", "block", "control", "garbage"]))
        if kind == "frame":
            segments.append(encoder.encode(draw(frames_st)))
        elif kind == "block":
            which = draw(st.sampled_from([spdy.SYN_STREAM, spdy.SYN_REPLY, spdy.HEADERS]))
            head = (
                struct.pack(">IIBB", draw(u31), 0, 0, 0) if which == spdy.SYN_STREAM else struct.pack(">I", draw(u31))
            )
            segments.append(control(which, head + draw(odd_block(deflate)), draw(flags)))
        elif kind == "control":  # any type, version and payload
            version = draw(st.sampled_from([spdy.VERSION, spdy.VERSION, 2, 0x7FFF]))
            segments.append(control(draw(st.integers(0, 0xFFFF)), draw(st.binary(max_size=40)), draw(flags), version))
        else:
            segments.append(draw(st.one_of(st.binary(max_size=32), big_bytes(high=64 * KiB))))
    wire = bytearray(b"".join(segments))
    for _ in range(draw(st.integers(0, 6))):
        if not wire:
            break
        at = draw(st.integers(0, len(wire) - 1))
        how = draw(st.sampled_from(["byte", "length", "flags", "insert", "delete", "truncate"]))
        if how == "byte":
            wire[at] = draw(st.integers(0, 255))
        elif how == "length" and at + 8 <= len(wire):  # a 24-bit length field, anything
            wire[at + 5 : at + 8] = draw(st.integers(0, 0xFFFFFF)).to_bytes(3, "big")
        elif how == "flags" and at + 8 <= len(wire):
            wire[at + 4] = draw(st.integers(0, 255))
        elif how == "insert":
            wire[at:at] = draw(st.binary(min_size=1, max_size=16))
        elif how == "delete":
            del wire[at : at + draw(st.integers(1, 64))]
        elif how == "truncate":
            del wire[at:]
    return bytes(wire)


@FUZZ
@given(mutated_streams(), st.data(), st.sampled_from(MAX_FRAMES))
def test_mutated_streams_fail_the_same_way_however_split(wire: bytes, data: st.DataObject, max_frame: int) -> None:
    check_split_invariance(wire, data.draw(splits(len(wire))), max_frame)


@FUZZ
@given(st.integers(spdy.MAX_HEADERS, 16 * spdy.MAX_HEADERS), st.integers(1, 64), st.sampled_from(MAX_FRAMES[2:]))
def test_zlib_bombs_are_refused_before_they_inflate(size: int, step: int, max_frame: int) -> None:
    """A SYN_STREAM whose few KiB of header block inflate to megabytes: refused as over
    MAX_HEADERS (or, under a small frame limit, as too large), however the bytes arrive."""
    wire = control(spdy.SYN_STREAM, struct.pack(">IIBB", 1, 0, 0, 0) + bomb(size))
    outcome = check_split_invariance(wire, list(range(step, len(wire), step)), max_frame)
    assert outcome.error is not None
    assert "over" in outcome.error
    assert outcome.frames == []
