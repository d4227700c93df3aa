"""The dashboard: one self-contained page (dashboard/index.html, no external asset; its charts
are drawn as SVG by its own script from /view and /history), read from the package once."""

from __future__ import annotations

import functools
import importlib.resources


@functools.cache
def dashboard() -> bytes:
    return importlib.resources.files("federation.view").joinpath("dashboard/index.html").read_bytes()
