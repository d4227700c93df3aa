"""A command on a pseudo-terminal that a test types into, resizes and reads, as a person at a
terminal would drive `kubectl exec -it` (kubectl reads the size of its terminal on SIGWINCH)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import struct
import subprocess
import termios
import time


class Terminal:
    def __init__(self, argv: list[str], rows: int = 40, cols: int = 120) -> None:
        self._leader, follower = pty.openpty()
        self._follower = follower
        self.resize(rows, cols, notify=False)
        self.child = subprocess.Popen(argv, stdin=follower, stdout=follower, stderr=follower, close_fds=True)
        self.output = b""
        self._cursor = 0  # where the next expect starts looking

    def resize(self, rows: int, cols: int, *, notify: bool = True) -> None:
        fcntl.ioctl(self._follower, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
        if notify:  # the terminal is not the child's controlling one: tell it as the kernel would
            self.child.send_signal(signal.SIGWINCH)

    def send(self, data: bytes) -> None:
        os.write(self._leader, data)

    def expect(self, text: str, timeout: float = 30.0) -> str:
        """Read until `text` appears after what earlier calls matched; all read so far."""
        deadline = time.monotonic() + timeout
        while (at := self.output.find(text.encode(), self._cursor)) < 0:
            left = deadline - time.monotonic()
            if left <= 0 or not self._read(left):
                raise AssertionError(f"no {text!r} on the terminal; it shows {self.output.decode(errors='replace')!r}")
        self._cursor = at + len(text)
        return self.output.decode(errors="replace")

    def ask_until(self, command: bytes, answer: str, timeout: float = 30.0, every: float = 0.5) -> str:
        """Send `command` until `answer` appears after what earlier calls matched (something that
        happens on its own, such as a resize reaching the far side, is waited on by asking again,
        not by sleeping); all read so far."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.send(command)
            until = min(deadline, time.monotonic() + every)
            while (at := self.output.find(answer.encode(), self._cursor)) < 0:
                left = until - time.monotonic()
                if left <= 0 or not self._read(left):
                    break
            else:
                self._cursor = at + len(answer)
                return self.output.decode(errors="replace")
        raise AssertionError(f"no {answer!r} on the terminal; it shows {self.output.decode(errors='replace')!r}")

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self._leader], [], [], timeout)
        if not ready:
            return False
        try:
            chunk = os.read(self._leader, 4096)
        except OSError:  # the terminal closed with the child
            return False
        self.output += chunk
        return bool(chunk)

    def wait(self, timeout: float = 30.0) -> int:
        os.close(self._follower)
        try:
            while self._read(0.2):
                pass
            return self.child.wait(timeout=timeout)
        finally:
            os.close(self._leader)
            if self.child.poll() is None:
                self.child.kill()
                self.child.wait()
