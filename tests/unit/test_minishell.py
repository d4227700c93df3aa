"""The in-memory provider's exec built-ins, over in-memory streams (the SPDY path to them is
tested end to end in tests/e2e/test_exec.py)."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator

import pytest

from vkprovider.minishell import Shell
from vkprovider.provider import ExecStreams, TermSize


class Sink:
    def __init__(self) -> None:
        self.data = b""

    async def write(self, data: bytes) -> None:
        self.data += data


class Source:
    def __init__(self, *chunks: bytes) -> None:
        self.chunks = list(chunks)

    async def read(self) -> bytes:
        return self.chunks.pop(0) if self.chunks else b""


async def sizes() -> AsyncIterator[TermSize]:
    yield TermSize(width=120, height=40)


@pytest.mark.asyncio
async def test_a_script_writes_both_streams_and_ends_with_its_status() -> None:
    out, err = Sink(), Sink()
    code = await Shell(ExecStreams(stdin=None, stdout=out, stderr=err)).run(
        ["sh", "-c", "echo out; echo err >&2; exit 3; echo never"]
    )
    assert (code, out.data, err.data) == (3, b"out\n", b"err\n")


@pytest.mark.asyncio
async def test_stdin_is_read_to_its_end() -> None:
    out = Sink()
    streams = ExecStreams(stdin=Source(b"abc", b"def"), stdout=out, stderr=None)
    assert await Shell(streams).run(["sha256sum"]) == 0
    assert out.data.decode() == f"{hashlib.sha256(b'abcdef').hexdigest()}  -\n"
    out = Sink()
    assert await Shell(ExecStreams(stdin=Source(b"xy"), stdout=out, stderr=None)).run(["cat"]) == 0
    assert out.data == b"xy"


@pytest.mark.asyncio
async def test_a_tty_merges_the_streams_and_sees_its_size() -> None:
    out = Sink()
    streams = ExecStreams(stdin=None, stdout=out, stderr=None, tty=True, resizes=sizes())
    assert await Shell(streams).run(["sh", "-c", "stty size; echo e >&2"]) == 0
    assert out.data == b"40 120\r\ne\r\n"


@pytest.mark.asyncio
async def test_an_unknown_command_is_not_found() -> None:
    err = Sink()
    assert await Shell(ExecStreams(stdin=None, stdout=None, stderr=err)).run(["vim"]) == 127
    assert err.data == b"vim: not found\n"
