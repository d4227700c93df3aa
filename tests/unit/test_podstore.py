"""vkprovider.podstore: pods kept packed read back equal, scans decode nothing they need not, a pod is
packed once when it leaves the hot set."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from vkprovider import podzip
from vkprovider.podstore import PodOverlay, PodStore, PodSubset


def _pod(name: str, *, node: str = "", phase: str = "Pending", job: str = "j") -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name, "uid": f"uid-{name}", "labels": {"job": job}},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "app:1"}]},
        "status": {"phase": phase},
    }


def test_a_pod_read_back_equals_the_one_put_once_it_has_left_the_hot_set() -> None:
    store: PodStore[dict[str, Any]] = PodStore(hot=2)
    pods = {f"ns/p{i}": _pod(f"p{i}", node="n1") for i in range(5)}
    for key, pod in pods.items():
        store[key] = pod
    assert store["ns/p0"] == pods["ns/p0"]
    assert store["ns/p0"] is not pods["ns/p0"]  # decoded again: p0 had left the hot set
    assert store["ns/p4"] is pods["ns/p4"]  # still hot: not decoded
    assert len(store) == 5 and "ns/p3" in store and "ns/p9" not in store
    assert store.get("ns/p9") is None


def test_records_answer_uid_node_phase_and_the_owners_index_without_decoding() -> None:
    store: PodStore[dict[str, Any]] = PodStore(hot=1, index=lambda pod: pod["metadata"]["labels"]["job"])
    store["ns/a"] = _pod("a", node="n1", phase="Running", job="x")
    store["ns/b"] = _pod("b", job="y")
    entry = store.entry("ns/a")
    assert entry is not None
    assert (entry.uid, entry.node, entry.phase, entry.extra) == ("uid-a", "n1", "Running", "x")
    assert store.uid("ns/b") == "uid-b" and store.node("ns/b") == "" and store.uid("ns/c") is None
    assert store.on_node("n1") == ["ns/a"]
    assert entry.raw is not None  # a left the hot set when b came: packed
    assert podzip.unpack(entry.raw) == _pod("a", node="n1", phase="Running", job="x")


def test_a_scan_decodes_every_pod_and_leaves_the_hot_set_as_it_was() -> None:
    store: PodStore[dict[str, Any]] = PodStore(hot=1)
    for i in range(3):
        store[f"ns/p{i}"] = _pod(f"p{i}")
    hot = store["ns/p2"]
    assert [k for k, _ in store.scan()] == ["ns/p0", "ns/p1", "ns/p2"]
    assert [p["metadata"]["name"] for _, p in store.scan(["ns/p1", "ns/gone"])] == ["p1"]
    assert store["ns/p2"] is hot


async def test_a_walk_gives_the_loop_a_turn_every_so_many_pods() -> None:
    store: PodStore[dict[str, Any]] = PodStore(hot=2)
    for i in range(10):
        store[f"ns/p{i}"] = _pod(f"p{i}")
    ticks: list[int] = []
    seen: list[tuple[str, int]] = []

    async def ticker() -> None:
        while True:
            ticks.append(len(seen))
            await asyncio.sleep(0)

    other = asyncio.create_task(ticker(), name="test-ticker")
    await asyncio.sleep(0)
    async for key, pod in store.walk(turn=4):
        seen.append((key, len(ticks)))
        assert pod == _pod(key.partition("/")[2])
    other.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await other
    assert [k for k, _ in seen] == [f"ns/p{i}" for i in range(10)]
    assert [t for _, t in seen] == [1] * 4 + [2] * 4 + [3] * 2  # the other task ran after pods 4 and 8


def test_forgetting_a_pod() -> None:
    store: PodStore[dict[str, Any]] = PodStore()
    store["ns/a"] = _pod("a")
    store.discard("ns/a")
    store.discard("ns/a")
    assert "ns/a" not in store and store.get("ns/a") is None
    store["ns/a"] = _pod("a")
    del store["ns/a"]
    assert len(store) == 0


def test_an_overlay_borrows_what_its_base_holds_and_keeps_it_when_the_base_lets_go() -> None:
    base: PodStore[dict[str, Any]] = PodStore()
    overlay: PodOverlay[dict[str, Any]] = PodOverlay()
    overlay.attach(base)
    base["ns/a"] = _pod("a", node="n1")
    overlay["ns/a"] = base["ns/a"]  # the very object the base handed out: borrowed, not copied
    assert overlay.borrowed() == 1 and len(overlay.own) == 0
    newer = _pod("a", node="n1", phase="Running")
    base["ns/a"] = newer  # the same pod, a newer version: read through
    assert overlay["ns/a"] is newer
    del base["ns/a"]  # the base lets it go: the overlay adopts its last record
    assert overlay.borrowed() == 0 and overlay["ns/a"] == newer
    overlay.discard("ns/a")
    assert "ns/a" not in overlay and overlay.get("ns/a") is None


def test_an_overlay_copies_what_its_base_does_not_hold_and_a_new_pod_of_the_same_name_does_not_replace_it() -> None:
    base: PodStore[dict[str, Any]] = PodStore()
    overlay: PodOverlay[dict[str, Any]] = PodOverlay()
    overlay.attach(base)
    base["ns/a"] = _pod("a")
    patched = _pod("a", phase="Pending")  # an answer of our own: not the base's object
    overlay["ns/a"] = patched
    assert overlay.borrowed() == 0 and overlay["ns/a"] is patched
    overlay["ns/a"] = base["ns/a"]
    assert overlay.borrowed() == 1 and len(overlay.own) == 0
    replacement = _pod("a")
    replacement["metadata"]["uid"] = "uid-a2"
    base["ns/a"] = replacement  # another pod took the name: the overlay keeps the one it was given
    assert overlay["ns/a"]["metadata"]["uid"] == "uid-a"


def test_a_subset_reads_and_forgets_through_its_overlay() -> None:
    overlay: PodOverlay[dict[str, Any]] = PodOverlay()  # no base: own copies
    job: PodSubset[dict[str, Any]] = PodSubset(overlay)
    job["ns/a"] = _pod("a")
    assert list(job) == ["ns/a"] and job["ns/a"]["metadata"]["name"] == "a" and "ns/a" in overlay
    job.discard("ns/a")
    assert len(job) == 0 and "ns/a" not in overlay


def test_a_pod_is_packed_when_it_leaves_the_hot_set_not_each_time_it_is_put(monkeypatch: Any) -> None:
    packed: list[str] = []
    real = podzip.pack

    def counting(pod: dict[str, Any]) -> bytes:
        packed.append(pod["metadata"]["name"])
        return real(pod)

    monkeypatch.setattr(podzip, "pack", counting)
    store: PodStore[dict[str, Any]] = PodStore(hot=2)
    for phase in ("Pending", "Pending", "Running"):  # bound, started, its status reported
        store["ns/a"] = _pod("a", phase=phase)
    assert packed == [] and store.entry("ns/a").raw is None  # type: ignore[union-attr]
    store["ns/b"] = _pod("b")
    store["ns/c"] = _pod("c")  # a leaves the hot set
    assert packed == ["a"] and store["ns/a"]["status"]["phase"] == "Running"  # its last version
    assert packed == ["a", "b"]  # a came back decoded, so b left
    store["ns/b"] = _pod("b")
    store["ns/b"] = _pod("b")  # c leaves; a, read back from its bytes, is not packed again
    store["ns/d"] = _pod("d")
    assert packed == ["a", "b", "c"]


def test_an_overlay_adopts_a_record_the_base_had_not_packed_yet() -> None:
    base: PodStore[dict[str, Any]] = PodStore()
    overlay: PodOverlay[dict[str, Any]] = PodOverlay()
    overlay.attach(base)
    base["ns/a"] = _pod("a", phase="Running")
    overlay["ns/a"] = base["ns/a"]
    base.discard("ns/a")  # still hot in the base, never packed: packed as it is handed over
    assert overlay["ns/a"] == _pod("a", phase="Running")
    replacement = _pod("b")
    base["ns/b"] = replacement
    overlay["ns/b"] = base["ns/b"]
    replacement = _pod("b", phase="Running")
    replacement["metadata"]["uid"] = "uid-b2"
    base["ns/b"] = replacement  # a new pod under the name: the overlay keeps the first, packed
    assert overlay["ns/b"]["metadata"]["uid"] == "uid-b" and base["ns/b"]["metadata"]["uid"] == "uid-b2"
