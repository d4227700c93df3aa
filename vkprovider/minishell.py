"""The commands the in-memory provider runs for `kubectl exec`: a handful of built-ins, enough to
test the streaming path end to end without a member cluster (issue 12: "the in-memory provider
implements exec with a small built-in command set").

  echo ARGS...           ARGS to stdout
  cat                    stdin to stdout until stdin closes
  sha256sum              the digest of stdin, as coreutils prints it ("<hex>  -")
  stty size              the terminal's last size, "ROWS COLS" (a tty session's resizes)
  exit N                 ends with status N
  sh -c 'A; B; ...'      the above, one after the other; `echo X >&2` writes to stderr

Anything else ends with status 127 and "<name>: not found" on stderr, as a shell would.
"""

from __future__ import annotations

import hashlib
import shlex

from vkprovider.provider import ExecStreams, TermSize


class _Exit(Exception):
    def __init__(self, code: int) -> None:
        self.code = code


class Shell:
    def __init__(self, streams: ExecStreams) -> None:
        self.io = streams
        self.size = TermSize(width=0, height=0)

    async def _out(self, text: str | bytes, *, err: bool = False) -> None:
        data = text.encode() if isinstance(text, str) else text
        if self.io.tty and self.io.stdout is not None:
            await self.io.stdout.write(data.replace(b"\n", b"\r\n"))  # a terminal's line ends
            return
        target = self.io.stderr if err else self.io.stdout
        if target is not None:
            await target.write(data)

    async def _stdin(self) -> bytes:
        if self.io.stdin is None:
            return b""
        return await self.io.stdin.read()

    async def run(self, argv: list[str]) -> int:
        try:
            await self._command(argv)
        except _Exit as exc:
            return exc.code
        return 0

    async def _command(self, argv: list[str]) -> None:
        if not argv:
            return
        name, args = argv[0], argv[1:]
        if name == "sh" and len(args) == 2 and args[0] == "-c":
            for statement in args[1].split(";"):
                await self._command(shlex.split(statement))
        elif name == "echo":
            to_err = bool(args) and args[-1] == ">&2"
            words = args[:-1] if to_err else args
            await self._out(" ".join(words) + "\n", err=to_err)
        elif name == "cat":
            while chunk := await self._stdin():
                await self._out(chunk)
        elif name == "sha256sum":
            digest = hashlib.sha256()
            while chunk := await self._stdin():
                digest.update(chunk)
            await self._out(f"{digest.hexdigest()}  -\n")
        elif name == "stty" and args == ["size"]:
            await self._resized()
            await self._out(f"{self.size.height} {self.size.width}\n")
        elif name == "exit":
            raise _Exit(int(args[0]) if args else 0)
        else:
            await self._out(f"{name}: not found\n", err=True)
            raise _Exit(127)

    async def _resized(self) -> None:
        """Take the sizes the client has sent so far (the first comes with the session)."""
        if self.io.resizes is None:
            return
        self.size = await anext(self.io.resizes, self.size)
