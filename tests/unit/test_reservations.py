"""Room a member's capacity summary does not count yet (federation.capacity.reservations)."""

from __future__ import annotations

import time

from federation.capacity.reservations import Reservations


def test_a_pod_counts_until_a_summary_computed_after_its_bind() -> None:
    held = Reservations()
    held.hold("ns/a", {"cpu": 100, "pods": 1})
    held.hold("ns/a", {"cpu": 100, "pods": 1})  # seen again: counted once
    held.hold("ns/b", {"cpu": 200, "pods": 1})
    before = time.monotonic()
    assert held.uncounted(before) == {"cpu": 300, "pods": 2}
    held.release("ns/a", bound=True)  # on a node now: a summary from before does not count it
    assert "ns/a" not in held and "ns/b" in held
    assert held.uncounted(before) == {"cpu": 300, "pods": 2}
    assert held.uncounted(time.monotonic()) == {"cpu": 200, "pods": 1}  # a later summary does
    held.release("ns/b")  # gone without binding
    assert held.uncounted(before) == {"cpu": 0, "pods": 0}
