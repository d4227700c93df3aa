"""The terms of a notice and the pure rules around it (issue 34): periods and bad values,
acknowledgements, extensions up to the maximum, the whole job's notice value, the split-gang
policy, kept logs cut as kubectl asks, and pods gone while the provider was down."""

from __future__ import annotations

import json

import pytest

from federation import labels
from federation.members import disruption
from federation.members.lastlogs import tail
from federation.reclaim import jobnotice, splitgang, terms


@pytest.mark.parametrize(
    ("value", "seconds", "problem"),
    [
        (None, 30.0, False),
        ("", 30.0, False),
        ("12", 12.0, False),
        ("12.5", 12.5, False),
        ("900", 300.0, False),  # capped by the maximum
        ("0", 0.0, False),
        ("-30", 30.0, True),
        ("nan", 30.0, True),
        ("inf", 30.0, True),
        ("30s", 30.0, True),
    ],
)
def test_notice_period_and_bad_values(value: str | None, seconds: float, problem: bool) -> None:
    annotations = {} if value is None else {labels.CHECKPOINT_SECONDS: value}
    period = terms.period(annotations, default=30.0, maximum=300.0)
    assert period.seconds == seconds
    assert (period.problem is not None) == problem
    if problem:
        assert repr(value) in (period.problem or "") and "30s applies" in (period.problem or "")


NOTICED = 1_000_000.4  # the notice's time, with milliseconds


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, False),
        ("1970-01-12T13:46:40Z", True),  # the notice's own second counts (whole-second stamps)
        ("1970-01-12T13:46:41.5Z", True),
        ("1970-01-12T13:46:39Z", False),  # before the notice: an earlier one's answer
        ("yes", "unreadable"),
    ],
)
def test_checkpoint_acknowledged(value: str | None, expected: object) -> None:
    front = {} if value is None else {labels.CHECKPOINTED_AT: value}
    got = terms.acknowledged(front, noticed_at=NOTICED)
    if expected == "unreadable":
        assert isinstance(got, str) and "RFC 3339" in got
    else:
        assert got is expected


def test_extension_granted_up_to_the_maximum_and_refused_beyond() -> None:
    def ask(value: str) -> terms.Extension | str | None:
        front = {labels.CHECKPOINT_EXTEND: value}
        return terms.extension(front, noticed_at=100.0, base=30.0, maximum=120.0, margin=2.0)

    granted = ask("60")
    assert isinstance(granted, terms.Extension)
    assert (granted.granted, granted.deadline, granted.refused) == (90.0, 192.0, False)
    refused = ask("600")
    assert isinstance(refused, terms.Extension)
    assert (refused.asked, refused.granted, refused.deadline, refused.refused) == (630.0, 120.0, 222.0, True)
    assert isinstance(ask("-5"), str) and isinstance(ask("soon"), str)
    assert terms.extension({}, noticed_at=100.0, base=30.0, maximum=120.0, margin=2.0) is None


def test_the_whole_job_notice_names_the_leaving_pods_and_the_earliest_deadline() -> None:
    assert jobnotice.value({}) is None
    value = jobnotice.value({"w2": "2026-12-03T10:00:05Z", "w1": "2026-12-03T10:00:03Z"})
    assert value is not None
    parsed = json.loads(value)
    assert parsed["deadline"] == "2026-12-03T10:00:03Z"
    assert [p["name"] for p in parsed["pods"]] == ["w1", "w2"]


def test_split_gang_policy_first_stated_wins_and_keep_is_the_default() -> None:
    group = {"metadata": {"annotations": {labels.SPLIT_GANG: "end"}}}
    pod = {"metadata": {"annotations": {labels.SPLIT_GANG: "keep"}}}
    assert splitgang.policy(group, pod) == "end"
    assert splitgang.policy(None, pod) == "keep"
    assert splitgang.policy({"metadata": {"annotations": {labels.SPLIT_GANG: "bogus"}}}) == "keep"
    assert splitgang.policy() == "keep"


def test_kept_logs_cut_as_kubectl_asks() -> None:
    text = b"a\nb\nc\nd\n"
    assert tail(text, lines=None, limit=None) == text
    assert tail(text, lines=2, limit=None) == b"c\nd\n"
    assert tail(text, lines=0, limit=None) == b""
    assert tail(text, lines=None, limit=3) == b"a\nb"
    assert tail(text, lines=2, limit=3) == b"c\nd"


def test_a_pod_gone_while_the_provider_was_down_is_a_disruption_never_lost() -> None:
    noticed = {"metadata": {"annotations": {labels.RECLAIM_AT: "2026-12-03T10:00:00.000Z"}}}
    what = disruption.gone_unseen(noticed, member="member-1")
    assert (what.cause, what.pod_reason) == (disruption.PLANNER_REASON, "Reclaimed")
    assert "2026-12-03T10:00:00.000Z" in what.message and "member-1" in what.message
    plain = disruption.gone_unseen({"metadata": {}}, member="member-2")
    assert plain.cause == disruption.GONE_UNSEEN and "while the provider was down" in plain.message
