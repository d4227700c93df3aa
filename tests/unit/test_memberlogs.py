"""The member `pods/log` query built from what kubectl asked our kubelet port for."""

from __future__ import annotations

from federation.streams.logs import log_params
from vkprovider.provider import LogOptions


def test_every_option_is_passed_on_and_unset_ones_are_left_out() -> None:
    assert log_params("main", LogOptions()) == {"container": "main"}
    options = LogOptions(
        follow=True,
        tail_lines=3,
        limit_bytes=40,
        since_seconds=60,
        timestamps=True,
        previous=True,
    )
    assert log_params("c", options) == {
        "container": "c",
        "follow": "true",
        "previous": "true",
        "timestamps": "true",
        "tailLines": 3,
        "limitBytes": 40,
        "sinceSeconds": 60,
    }
    since = log_params("c", LogOptions(since_time="2026-11-30T19:00:00Z"))
    assert since == {"container": "c", "sinceTime": "2026-11-30T19:00:00Z"}
