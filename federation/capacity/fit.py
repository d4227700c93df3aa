"""Whether a pod may run on a node, as kube-scheduler's filters judge it (pure, compact).

Reclaim makes room for online pods that wait without preempting; a victim helps such a pod
only on a node the scheduler would give it. This module owns that judgement, beside the
resources: the pod's nodeSelector over all of the node's labels, its required node affinity
(nodeSelectorTerms, ORed; in each, matchExpressions with In, NotIn, Exists, DoesNotExist, Gt and
Lt, and matchFields on metadata.name, ANDed), and the node's taints against the pod's
tolerations (NoSchedule and NoExecute must be tolerated; PreferNoSchedule is only a preference).

A member may have thousands of nodes and many waiting pods, so constraints are parsed once into
small tuples of interned strings, shared between equal ones (`Interner`): most nodes of a pool
carry the same labels, and most waiting pods of a workload the same constraints. A node's
`kubernetes.io/hostname` label is left out of its shared tuple when it equals the node's name
(else no two nodes would share one) and put back by `label_map`.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

HOSTNAME = "kubernetes.io/hostname"
#: The only field a matchFields requirement may name.
NODE_NAME_FIELD = "metadata.name"
#: Taint effects that keep a pod off a node unless tolerated.
HARD_EFFECTS = ("NoSchedule", "NoExecute")

Labels = tuple[tuple[str, str], ...]  # sorted (key, value)
Taint = tuple[str, str, str]  # (key, value, effect)
Toleration = tuple[str, str, str, str]  # (key, operator, value, effect); "" effect: every effect
Requirement = tuple[str, str, tuple[str, ...]]  # (key, operator, values)
Term = tuple[tuple[Requirement, ...], tuple[Requirement, ...]]  # (matchExpressions, matchFields)

_T = TypeVar("_T")


class Interner:
    """One shared copy of each equal tuple (labels, taints, constraints), strings interned."""

    def __init__(self) -> None:
        self._seen: dict[object, object] = {}

    def share(self, value: _T) -> _T:
        return self._seen.setdefault(value, value)  # type: ignore[return-value]


def _s(value: Any) -> str:
    return sys.intern(str(value)) if value is not None else ""


@dataclass(frozen=True, slots=True)
class Constraints:
    """Where a pod may run, beside resources. The empty value: any ready, schedulable node
    without NoSchedule/NoExecute taints."""

    node_selector: Labels = ()
    #: The required node affinity's terms; None: the pod has none (every node matches).
    affinity: tuple[Term, ...] | None = None
    tolerations: tuple[Toleration, ...] = ()

    def fits(self, name: str, labels: Mapping[str, str], taints: tuple[Taint, ...]) -> bool:
        """Whether the scheduler's filters let the pod onto the node (resources aside)."""
        return (
            all(labels.get(k) == v for k, v in self.node_selector)
            and (self.affinity is None or any(term_matches(t, name, labels) for t in self.affinity))
            and all(tolerated(self.tolerations, t) for t in taints)
        )


#: No constraints: any ready, schedulable node without NoSchedule/NoExecute taints.
ANYWHERE = Constraints()


# -- parsing (from raw API dicts) ------------------------------------------------------------------


def node_labels(name: str, labels: Mapping[str, Any] | None, interner: Interner) -> Labels:
    """A node's labels as a shared sorted tuple (hostname left out when it is the node's name)."""
    pairs = tuple(sorted((_s(k), _s(v)) for k, v in (labels or {}).items() if not (k == HOSTNAME and v == name)))
    return interner.share(pairs)


def label_map(name: str, labels: Labels) -> dict[str, str]:
    """All of a node's labels, the hostname put back."""
    out = dict(labels)
    out.setdefault(HOSTNAME, name)
    return out


def node_taints(spec: Mapping[str, Any], interner: Interner) -> tuple[Taint, ...]:
    """The taints that keep pods off (NoSchedule, NoExecute), as a shared tuple."""
    taints = tuple(
        (_s(t.get("key", "")), _s(t.get("value", "")), _s(t.get("effect", "")))
        for t in spec.get("taints") or []
        if t.get("effect") in HARD_EFFECTS
    )
    return interner.share(taints)


def _requirements(items: Any) -> tuple[Requirement, ...]:
    return tuple(
        (_s(r.get("key", "")), _s(r.get("operator", "")), tuple(_s(v) for v in r.get("values") or ()))
        for r in items or ()
    )


def pod_constraints(spec: Mapping[str, Any], interner: Interner) -> Constraints:
    """A pod's nodeSelector, required node affinity and tolerations, compactly."""
    selector = tuple(sorted((_s(k), _s(v)) for k, v in (spec.get("nodeSelector") or {}).items()))
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    ) or None
    affinity = None
    if required is not None:
        affinity = tuple(
            (_requirements(t.get("matchExpressions")), _requirements(t.get("matchFields")))
            for t in required.get("nodeSelectorTerms") or ()
        )
    tolerations = tuple(
        (_s(t.get("key", "")), _s(t.get("operator") or "Equal"), _s(t.get("value", "")), _s(t.get("effect", "")))
        for t in spec.get("tolerations") or ()
    )
    return interner.share(Constraints(selector, affinity, tolerations))


# -- matching --------------------------------------------------------------------------------------


def _integer(value: str) -> int | None:
    try:
        return int(value)
    except ValueError:
        return None


def requirement_matches(requirement: Requirement, value: str | None) -> bool:
    """One matchExpressions requirement against the value of its key on the node (None: the
    node has no such label)."""
    _, operator, values = requirement
    if operator == "In":
        return value is not None and value in values
    if operator == "NotIn":
        return value is None or value not in values
    if operator == "Exists":
        return value is not None
    if operator == "DoesNotExist":
        return value is None
    if operator in ("Gt", "Lt") and value is not None and len(values) == 1:
        have, bound = _integer(value), _integer(values[0])
        if have is None or bound is None:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False  # an unknown operator matches nothing, as the API server would reject it


def term_matches(term: Term, name: str, labels: Mapping[str, str]) -> bool:
    """A nodeSelectorTerm: all its requirements hold; a term with none matches no node."""
    expressions, fields = term
    if not expressions and not fields:
        return False
    return all(requirement_matches(r, labels.get(r[0])) for r in expressions) and all(
        r[0] == NODE_NAME_FIELD and r[1] in ("In", "NotIn") and requirement_matches(r, name) for r in fields
    )


def tolerated(tolerations: tuple[Toleration, ...], taint: Taint) -> bool:
    """Whether any toleration tolerates the taint (an empty key with Exists tolerates all)."""
    key, value, effect = taint
    for tol_key, operator, tol_value, tol_effect in tolerations:
        if tol_effect and tol_effect != effect:
            continue
        if operator == "Exists" and (not tol_key or tol_key == key):
            return True
        if operator == "Equal" and tol_key == key and tol_value == value:
            return True
    return False
