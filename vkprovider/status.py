"""`vkprovider status`: the provider's resource view (GET /capacity on the plain port) as tables;
with `--since`, what each member lent and offline work used over that time (GET /history); with
`--reclaims`, the pods given back over that time (GET /reclaims)."""

from __future__ import annotations

import datetime
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


def fetch(url: str, timeout: float = 5.0) -> dict[str, Any]:
    with urllib.request.urlopen(url.rstrip("/") + "/capacity", timeout=timeout) as resp:
        return dict(json.load(resp))


def _gib(value: str) -> str:
    try:
        return f"{int(value) / 2**30:.0f}Gi"
    except ValueError:
        return value


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip() for r in rows)


def render(view: dict[str, Any]) -> str:
    members = [
        [
            "MEMBER",
            "SOURCE",
            "REACHABLE",
            "NODES",
            "LENT CPU",
            "USED CPU",
            "FREE CPU",
            "ONLINE CPU",
            "FREE MEMORY",
            "LENT GPU",
            "USED GPU",
            "GPU MODELS (FREE)",
        ]
    ]
    for name, m in view.get("members", {}).items():
        lent, used, free = m.get("lent", {}), m.get("used", {}), m.get("free", {})
        nodes = m.get("nodes", {})
        members.append(
            [
                name,
                m.get("source", "-"),
                ("yes" if m.get("reachable") else "NO")
                + ("" if m.get("enabled", True) else " (disabled)")
                + (" (draining)" if m.get("draining") else ""),
                f"{nodes.get('eligible', 0)}/{nodes.get('total', 0)}" if nodes else "-",
                lent.get("cpu", "0"),
                used.get("cpu", "0"),
                free.get("cpu", "0"),
                m.get("online", {}).get("cpu", "0"),
                _gib(free.get("memory", "0")),
                lent.get("nvidia.com/gpu", "0"),
                used.get("nvidia.com/gpu", "0"),
                ", ".join(f"{k}={v}" for k, v in m.get("gpusByModel", {}).items()) or "-",
            ]
        )
    nodes = [["VIRTUAL NODE", "MEMBERS", "CPU", "MEMORY", "GPU", "PODS", "MEMBERS REACHABLE"]]
    for name, n in view.get("virtualNodes", {}).items():
        cap = n.get("capacity", {})
        reach: dict[str, Any] = next((c for c in n.get("conditions", []) if c.get("type") == "MembersReachable"), {})
        nodes.append(
            [
                name,
                ",".join(n.get("members", [])),
                cap.get("cpu", "0"),
                _gib(cap.get("memory", "0")),
                cap.get("nvidia.com/gpu", "0"),
                cap.get("pods", "0"),
                reach.get("status", "-") + (f" ({reach.get('message')})" if reach.get("status") == "False" else ""),
            ]
        )
    text = _table(members) + "\n\n" + _table(nodes)
    jobs = [["JOB", "MEMBER", "PODS", "GANG MIN", "STATE", "NETWORK POD"]]
    for key, job in view.get("jobs", {}).items():
        jobs.append(
            [
                key,
                job.get("member") or "-",
                str(job.get("pods", 0)),
                str(job.get("gangMin", 1)),
                job.get("state", "-"),
                job.get("networkPod") or "-",
            ]
        )
    if len(jobs) > 1:
        text += "\n\n" + _table(jobs)
    reclaims = [["RECLAIM", "MEMBER", "NODE", "BAND", "AT", "WHY"]]
    reclaims.extend(
        [
            victim.get("pod", "-"),
            member,
            victim.get("node", "-"),
            victim.get("band", "-"),
            victim.get("reclaimAt") or "(next round)",
            str(victim.get("why", ""))[:90],
        ]
        for member, victims in view.get("reclaims", {}).items()
        for victim in victims
    )
    if len(reclaims) > 1:
        text += "\n\n" + _table(reclaims)
    return text


def render_summary(history: dict[str, Any], since: str) -> str:
    """The daily summary: "member-2 lent 4,100 V100-hours, offline used 3,650 (89 %)"."""
    rows = [["MEMBER", "RESOURCE", "LENT", "USED", "USED %"]]
    for entry in history.get("summary", []):
        resource = str(entry["resource"])
        unit = "core-h" if resource == "cpu" else f"{resource.removeprefix('gpu/')} GPU-h"
        share = entry.get("usedShare")
        rows.append(
            [
                str(entry["member"]),
                resource,
                f"{entry['lentHours']:,.1f} {unit}",
                f"{entry['usedHours']:,.1f} {unit}",
                "-" if share is None else f"{share * 100:.0f} %",
            ]
        )
    if len(rows) == 1:
        return f"no history over the last {since} (the provider keeps it from its start)"
    return f"over the last {since}:\n" + _table(rows)


def render_reclaims(body: dict[str, Any], since: str) -> str:
    """The pods given back: when, where, why, and whether their job had (and used) a notice."""
    rows = [["TIME (UTC)", "MEMBER", "NODE", "POD", "BAND", "CAUSE", "NOTICE", "ACKNOWLEDGED"]]
    for r in body.get("reclaims", []):
        notice = r.get("notice_seconds")
        rows.append(
            [
                datetime.datetime.fromtimestamp(float(r["at"]), datetime.UTC).strftime("%Y-%m-%d %H:%M:%S"),
                str(r.get("member", "-")),
                str(r.get("node") or "-"),
                str(r.get("pod", "-")),
                str(r.get("band", "-")),
                str(r.get("cause", "-")),
                "none" if notice is None else f"{float(notice):.0f}s",
                "yes" if r.get("acknowledged") else "no",
            ]
        )
    if len(rows) == 1:
        return f"no pod was given back over the last {since} (the provider keeps them from its start)"
    summary = body.get("summary") or {}
    head = (
        f"over the last {since}: {summary.get('count', len(rows) - 1)} pods given back, "
        f"{summary.get('with_notice', 0)} with notice, {summary.get('acknowledged', 0)} acknowledged"
    )
    return head + "\n" + _table(rows)


def main(url: str, since: str | None = None, reclaims: str | None = None) -> int:
    if reclaims is not None:
        path = f"/reclaims?since={urllib.parse.quote(reclaims)}"
    else:
        path = "/capacity" if since is None else f"/history?since={urllib.parse.quote(since)}"
    try:
        with urllib.request.urlopen(url.rstrip("/") + path, timeout=10.0) as resp:
            body = dict(json.load(resp))
    except urllib.error.HTTPError as exc:
        print(f"error: {url}{path}: {exc.code} {exc.read().decode(errors='replace').strip()}")
        return 1
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"error: cannot read {url}{path}: {exc}")
        return 1
    if reclaims is not None:
        print(render_reclaims(body, reclaims))
    else:
        print(render(body) if since is None else render_summary(body, since))
    return 0
