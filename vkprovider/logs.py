"""Structured logging: structlog, JSON in a cluster and readable on a terminal.

Loggers are bound to what a line is about (`node=`, `pod=`, `cluster=`) by the code that owns
that context; this module only configures the output once per process.
"""

from __future__ import annotations

import logging
import sys
from typing import Any

import structlog

from vkprovider.settings import LogSettings


def configure(settings: LogSettings) -> None:
    json_output = settings.format == "json" or (settings.format == "auto" and not sys.stderr.isatty())
    renderer: Any = structlog.processors.JSONRenderer() if json_output else structlog.dev.ConsoleRenderer(colors=False)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, settings.level.upper())),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )


def get(name: str, **bound: Any) -> Any:
    """A logger for component `name`, bound to the given context."""
    return structlog.get_logger(name).bind(component=name, **bound)
