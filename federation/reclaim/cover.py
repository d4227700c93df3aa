"""Step 3 of a plan (pure): the member-wide deficit freed with a minimal set of victims, greedy
in the order of the rules, then given back newest first where the need does not require them.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping

from federation.reclaim.ledger import Ledger
from federation.reclaim.planmodel import BAND_RANK, GANG, NOTICED, SURPLUS, TIERS, Unit, members_of

#: How many subsets of a gang to try when looking for a smaller part of it that would do.
SUBSETS_TRIED = 4096


# -- 3. the member deficit ----------------------------------------------------------------------------


class Cover:
    """Victims until the member-wide need is freed, then back what it does not require. Works on
    the resources the need names only, as columns of per-pod amounts."""

    def __init__(self, state: Ledger, need: Mapping[str, int]) -> None:
        self.state = state
        self.names = [k for k, v in need.items() if v > 0]
        self.need = [need[k] for k in self.names]
        self.amounts = [[p.requests.get(k, 0) for p in state.pods] for k in self.names]
        self.freed = [0] * len(self.names)
        for entry in state.order:
            if entry is not None:
                self._add(members_of(entry), +1)
        self.buckets: list[list[int]] = [[] for _ in range(TIERS)]
        self.tiers = bytearray(len(state.pods))  # each pod's tier when sorted out; TIERS: frees nothing needed
        self._open: list[str] = []  # nodes that may be emptied at the tier reached
        self._reached: list[str] = []  # all nodes whose pods are all at the tier reached or below
        self._by_tier: list[list[str]] = [[] for _ in range(TIERS + 1)]
        self._totals: dict[str, tuple[int, list[int]]] = {}

    # Loops rather than any()/all() over generators in what runs once per pod: a generator costs
    # more than the test it makes.
    def covered(self) -> bool:
        for f, n in zip(self.freed, self.need, strict=True):  # noqa: SIM110
            if f < n:
                return False
        return True

    def remaining(self) -> dict[str, int]:
        return {k: n - f for k, n, f in zip(self.names, self.need, self.freed, strict=True) if n > f}

    def _add(self, members: Iterable[int], sign: int) -> None:
        for j, col in enumerate(self.amounts):
            self.freed[j] += sign * sum(col[k] for k in members)

    def useful(self, i: int) -> bool:
        for col, f, n in zip(self.amounts, self.freed, self.need, strict=True):  # noqa: SIM110
            if col[i] > 0 and f < n:
                return True
        return False

    def run(self) -> None:
        if self.covered():
            return
        self.sort_out()
        for tier in range(TIERS):
            if self.covered():
                break
            self.whole_nodes(tier)
            self.one_by_one(tier)
        self.prune()

    def sort_out(self) -> None:
        """Each pod left into its tier's bucket (the tier inlined: this runs for every pod)."""
        state = self.state
        taken, tiers, buckets = state.taken, self.tiers, self.buckets
        gang_min, job_left, gang_band = state.gang_min, state.job_left, state.gang_band
        rank = BAND_RANK.get
        cols = self.amounts
        useful: list[int] | list[bool] = cols[0] if len(cols) == 1 else [any(v) for v in zip(*cols, strict=True)]
        node_tier: dict[str, int] = {}
        spare_nodes: set[str] = set()  # with a pod that frees nothing needed: never emptied (an extra victim)
        for i, p in enumerate(state.pods):
            if taken[i]:
                continue
            if not useful[i]:
                tiers[i] = TIERS
                spare_nodes.add(p.node)
                continue
            if p.noticed:
                t = NOTICED + rank(p.band, 1)
            else:
                m = gang_min.get(p.job)
                t = SURPLUS + rank(p.band, 1) if m is None or job_left[p.job] > m else GANG + gang_band[p.job]
            tiers[i] = t
            buckets[t].append(i)
            if t > node_tier.get(p.node, -1):
                node_tier[p.node] = t
        for node, t in node_tier.items():
            if node not in spare_nodes:
                self._by_tier[t].append(node)

    # -- whole machines ------------------------------------------------------------------------------

    def _nodes_by_tier(self) -> list[list[str]]:
        """Nodes by the tier of their dearest pod of ours (`sort_out`)."""
        return self._by_tier

    def _node_total(self, node: str) -> list[int]:
        """What our pods left on the node free of each needed resource (kept while it is unchanged)."""
        version = self.state.version.get(node, 0)
        cached = self._totals.get(node)
        if cached is None or cached[0] != version:
            left = self.state.left_on(node)
            cached = self._totals[node] = (version, [sum(col[i] for i in left) for col in self.amounts])
        return cached[1]

    def _takeable(self, node: str, tier: int) -> list[list[int]] | None:
        """The node's pods as units, if all are takeable at this tier without a job limping."""
        state = self.state
        per_job: dict[str, list[int]] = {}
        for i in state.left_on(node):
            if state.tier(i) > tier:
                return None
            per_job.setdefault(state.pods[i].job, []).append(i)
        units: list[list[int]] = []
        for job, members in per_job.items():
            m = state.gang_min.get(job)
            if m is None or len(members) <= state.job_left[job] - m:
                units.extend([i] for i in members)
            elif len(members) == state.job_left[job]:
                units.append(members)  # the whole gang is here
            else:
                return None
        return units

    def whole_nodes(self, tier: int) -> None:
        """Empty whole nodes whose pods all fit within what is still needed, most first; then
        perhaps one that frees the rest alone (`_last_node`)."""
        self._open.extend(self._nodes_by_tier()[tier])
        self._reached.extend(self._nodes_by_tier()[tier])
        if self.covered() or not self._open:
            return
        state = self.state
        sized = []
        for node in self._open:
            total = self._node_total(node)
            if state.node_left[node] and all(t <= n - f for t, n, f in zip(total, self.need, self.freed, strict=True)):
                sized.append((-sum(t / n for t, n in zip(total, self.need, strict=True)), node, total))
        self._open = [node for _, node, _ in sized]  # the others are worth more than is still needed
        for _, node, total in sorted(sized):
            if any(t > n - f for t, n, f in zip(total, self.need, self.freed, strict=True)):
                continue  # more than is still needed: extra victims
            units = self._takeable(node, tier)
            if units is None:
                continue
            self._empty(node, units)
        if not self.covered():
            self._last_node(tier)

    def _empty(self, node: str, units: list[list[int]]) -> None:
        for members in units:
            reason = f"empties node {node}; {self.state.why(members[0])}"
            self.state.take_exactly(members, reason, whole=len(members) > 1)
            self._add(members, +1)

    def _last_node(self, tier: int) -> None:
        """A node that frees all that is still needed alone, when each of its pods is needed for
        it and it takes no more victims than any choice could (no pod frees more than the
        biggest left): of those, the one that gives back least beyond the need."""
        rem = [n - f for n, f in zip(self.need, self.freed, strict=True)]
        options = []
        for node in self._reached:
            total = self._node_total(node)
            if not self.state.node_left[node] or any(t < r for t, r in zip(total, rem, strict=True)):
                continue
            units = self._takeable(node, tier)
            if units is None or any(self._covers_without(total, members, rem) for members in units):
                continue
            beyond = sum(t / r for t, r in zip(total, rem, strict=True) if r > 0)
            options.append((sum(len(u) for u in units), beyond, node, units))
        if not options:
            return
        fewest = self._fewest_victims(tier, rem)
        best = min((o for o in options if o[0] <= fewest), key=lambda o: (o[1], o[2]), default=None)
        if best is None or (best[0] == 1 and self._smaller_single(tier, rem, best[1])):
            return  # a machine bigger than the need is not bought when one smaller pod would do
        self._empty(best[2], best[3])

    def _smaller_single(self, tier: int, rem: list[int], beyond: float) -> bool:
        """Whether one pod that may go alone at this tier frees `rem` and less beyond it."""
        taken, tiers = self.state.taken, self.tiers
        for t in range(min(tier, GANG - 1) + 1):
            for i in self.buckets[t]:
                if taken[i] or tiers[i] > tier:
                    continue
                amounts = [col[i] for col in self.amounts]
                covers = all(a >= r for a, r in zip(amounts, rem, strict=True))
                if covers and sum(a / r for a, r in zip(amounts, rem, strict=True) if r > 0) < beyond:
                    return True
        return False

    def _covers_without(self, total: list[int], members: list[int], rem: list[int]) -> bool:
        return all(t - sum(col[k] for k in members) >= r for t, col, r in zip(total, self.amounts, rem, strict=True))

    def _fewest_victims(self, tier: int, rem: list[int]) -> int:
        """A lower bound on the pods any choice at this tier takes to free `rem`."""
        taken, tiers = self.state.taken, self.tiers
        biggest = [0] * len(rem)
        for t in range(tier + 1):
            for i in self.buckets[t]:
                if not taken[i] and tiers[i] <= tier:
                    for j, col in enumerate(self.amounts):
                        biggest[j] = max(biggest[j], col[i])
        return max((-(-r // b) if b else 1 << 30) for r, b in zip(rem, biggest, strict=True) if r > 0)

    # -- one by one ----------------------------------------------------------------------------------

    def one_by_one(self, tier: int) -> None:
        """Single pods (or whole gangs) of this tier in the order of the rules until covered; in
        no order when all of the tier is needed."""
        state = self.state
        taken, pods = state.taken, state.pods
        entries = [i for i in self.buckets[tier] if not taken[i]]
        if not entries or self.covered():
            return
        short = [n - f for n, f in zip(self.need, self.freed, strict=True)]
        if not any(r > 0 and sum(col[i] for i in entries) >= r for col, r in zip(self.amounts, short, strict=True)):
            took, later = state.take_all(entries, tier)  # all of the tier cannot cover the rest: all goes
            self._add(took, +1)
            for i in later:
                self.buckets[state.tier(i)].append(i)  # its job reached its minimum: its gang comes later
            return
        if tier >= GANG:  # one entry per gang: taking any of its pods takes all of it
            entries = list({pods[i].job: i for i in reversed(entries)}.values())
        entries = state.ranked(entries, self.remaining())  # the tier can cover the rest: in order
        freed, cols, gangs = self.freed, self.amounts, state.gang_min
        for i in entries:
            if self.covered():
                return
            if taken[i]:
                continue
            if pods[i].job in gangs:  # only a gang's pods change tier (as it reaches its minimum)
                t = state.tier(i)
                if t > tier:
                    self.buckets[t].append(i)  # its gang comes later
                    continue
            if state.below_minimum(pods[i].job):
                if any(self.useful(k) for k in state.unit_of(i)):  # the gang frees what is needed
                    self._add(members_of(state.order[state.take(i)] or 0), +1)
            elif self.useful(i):
                state.take_single(i)
                for j, col in enumerate(cols):
                    freed[j] += col[i]

    # -- no more than needed -------------------------------------------------------------------------

    def _spare(self, members: list[int]) -> bool:
        """Whether the need stays covered without these pods."""
        for col, f, n in zip(self.amounts, self.freed, self.need, strict=True):
            if f - sum(col[k] for k in members) < n:
                return False
        return True

    def prune(self) -> None:
        """Give back, newest first, what the need does not require; a gang taken whole may be
        cut back to a part above its minimum that does."""
        state = self.state
        order, pods = state.order, state.pods
        single = self.amounts[0] if len(self.amounts) == 1 else None
        for at in range(len(order) - 1, -1, -1):
            entry = order[at]
            if entry is None or (isinstance(entry, Unit) and entry.forced):
                continue
            if isinstance(entry, int):
                spare = single[entry] <= self.freed[0] - self.need[0] if single else self._spare([entry])
                if spare and not state.limps(pods[entry].job, 1):
                    state.give_back(at)
                    self._add([entry], -1)
            elif self._spare(entry.pods) and not state.limps(entry.job, len(entry.pods)):
                state.give_back(at)
                self._add(entry.pods, -1)
            elif entry.whole:
                self._cut_gang(entry.job)

    def _cut_gang(self, job: str) -> None:
        """A gang taken whole when a part of it above its minimum would do: that part instead."""
        state = self.state
        most = len(state.job_pods[job]) - state.gang_min[job]  # the most it may lose one by one
        if most <= 0 or state.job_left[job] > 0:
            return
        mine = [at for at, e in enumerate(state.order) if e is not None and state.pods[members_of(e)[0]].job == job]
        if any(isinstance(state.order[at], Unit) and state.order[at].forced for at in mine):  # type: ignore[union-attr]
            return
        members = state.job_pods[job]
        base = [f - sum(col[k] for k in members) for col, f in zip(self.amounts, self.freed, strict=True)]
        part = self._part(members, most, base)
        if part is None:
            return
        for at in mine:
            state.give_back(at)
        self._add(members, -1)
        for k in part:
            state.take_single(k)
            self._add([k], +1)
        for at in range(len(state.order) - len(part), len(state.order)):
            entry = state.order[at]
            if isinstance(entry, int) and self._spare([entry]):
                state.give_back(at)
                self._add([entry], -1)

    def _part(self, members: list[int], most: int, base: list[int]) -> list[int] | None:
        """The fewest of the gang's pods (no more than `most`) that, with `base` freed, cover."""
        state = self.state
        order = sorted(members, key=lambda k: (state.tier(k), state.pods[k].deletion_cost, state.pods[k].key))
        tried = 0
        for size in range(1, most + 1):
            for combo in itertools.combinations(order, size):
                tried += 1
                if tried > SUBSETS_TRIED:
                    return None
                if all(
                    b + sum(col[k] for k in combo) >= n for col, b, n in zip(self.amounts, base, self.need, strict=True)
                ):
                    return list(combo)
        return None
