"""vkprovider.settle: when a new pod's first status write is due (pure bookkeeping)."""

from __future__ import annotations

import pytest

from vkprovider.settings import PodSettings
from vkprovider.settle import Settling


def test_a_pending_pod_waits_the_settle_and_a_running_one_is_written_at_once() -> None:
    settling = Settling(PodSettings(workers=2, status_settle=1.0, status_settle_burst=10.0))
    settling.created("ns/a", 100.0)
    assert settling.wait("ns/a", {"phase": "Pending"}, 100.4) == pytest.approx(0.6)
    assert settling.wait("ns/a", {"phase": "Running"}, 100.5) == 0.0
    assert settling.wait("ns/a", {"phase": "Pending"}, 100.6) == 0.0  # written once: forgotten


def test_in_a_burst_a_pending_pod_waits_the_burst_settle() -> None:
    settling = Settling(PodSettings(workers=2, status_settle=1.0, status_settle_burst=10.0))
    for i in range(3):  # more new pods waiting than workers
        settling.created(f"ns/p{i}", 100.0)
    assert settling.wait("ns/p0", {"phase": "Pending"}, 102.0) == 8.0
    settling.forget("ns/p2")  # no burst any more: the plain settle, long over
    assert settling.wait("ns/p0", {"phase": "Pending"}, 102.0) == 0.0


def test_no_settle_writes_every_first_status_at_once() -> None:
    settling = Settling(PodSettings(status_settle=0.0))
    settling.created("ns/a", 100.0)
    assert settling.wait("ns/a", {"phase": "Pending"}, 100.0) == 0.0


def test_a_pod_is_settling_until_its_first_write() -> None:
    settling = Settling(PodSettings(status_settle=1.0))
    assert not settling.settling("ns/a")
    settling.created("ns/a", 100.0)
    assert settling.settling("ns/a")
    assert settling.wait("ns/a", {"phase": "Pending"}, 100.5) > 0
    assert settling.settling("ns/a")
    assert settling.wait("ns/a", {"phase": "Running"}, 100.6) == 0.0
    assert not settling.settling("ns/a")
