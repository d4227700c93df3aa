"""Reading a process's /metrics the way Prometheus does, for tests and benchmarks.

The exposition is parsed with prometheus_client's own parser, not by matching line prefixes:
a metric that is renamed or no longer exposed must fail the test that reads it, not read as 0
(a prefix match sums nothing and says 0.0, which an `== 0` check then accepts). A family that
is declared but has no child yet (a labelled counter nothing has counted) does read as 0: its
HELP and TYPE lines say it exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

#: The suffixes a sample's name adds to its family's (counters, histograms, summaries).
SUFFIXES = ("_total", "_created", "_bucket", "_count", "_sum", "_gsum", "_gcount", "_info")

_SELECTOR = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?$")
_LABEL = re.compile(r'\s*(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"\s*(?:,|$)')


class MetricMissing(AssertionError):
    """The metric asked for is not exposed at all, or a label asked for is not one of its."""


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


@dataclass
class Scrape:
    """One exposition, parsed: the families declared and every sample by its own name."""

    families: dict[str, str] = field(default_factory=dict)  # name -> type
    samples: dict[str, list[Sample]] = field(default_factory=dict)

    def _declared(self, name: str) -> bool:
        return name in self.names()

    def series(self, name: str, **labels: str) -> list[Sample]:
        """The samples named `name` whose labels include `labels`; MetricMissing when no family
        declares `name`, or when its samples do not carry a label asked for."""
        if not self._declared(name):
            raise MetricMissing(f"{name} is not exposed (families: {len(self.families)})")
        found = self.samples.get(name, [])
        for key in labels:
            if found and all(key not in s.labels for s in found):
                raise MetricMissing(f"{name} has no label {key!r} (it has {sorted(found[0].labels)})")
        return [s for s in found if all(s.labels.get(k) == v for k, v in labels.items())]

    def names(self) -> set[str]:
        """Every sample name the declared families can carry, samples or not (a counter's
        `_total`, a histogram's `_bucket`, `_sum` and `_count`)."""
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}
        out = set(self.samples)
        for name, kind in self.families.items():
            out |= {name + s for s in suffixes.get(kind, ("",))}
        return out

    def value(self, name: str, **labels: str) -> float:
        """The sum of the samples `series` finds (0 for a declared family without them)."""
        return sum(s.value for s in self.series(name, **labels))

    def get(self, selector: str) -> float:
        """`value` from a PromQL-like selector: `name` or `name{key="value",...}`."""
        name, labels = parse_selector(selector)
        return self.value(name, **labels)

    def by_label(self, name: str, label: str, **labels: str) -> dict[str, float]:
        """The samples of `name` summed by the value of one of their labels."""
        out: dict[str, float] = {}
        for s in self.series(name, **labels):
            if label not in s.labels:
                raise MetricMissing(f"{name} has no label {label!r} (it has {sorted(s.labels)})")
            out[s.labels[label]] = out.get(s.labels[label], 0.0) + s.value
        return out

    def histograms(self, family: str | None = None) -> dict[str, dict[float, float]]:
        """Cumulative bucket counts of every histogram (or of `family`), by
        `name{labels but le}` (labels sorted): `{le: count}`."""
        out: dict[str, dict[float, float]] = {}
        names = [f"{family}_bucket"] if family is not None else [n for n in self.samples if n.endswith("_bucket")]
        for bucket in names:
            base = bucket[: -len("_bucket")]
            for s in self.series(bucket):
                others = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()) if k != "le")
                out.setdefault(f"{base}{{{others}}}", {})[float(s.labels["le"])] = s.value
        return out


def parse_selector(selector: str) -> tuple[str, dict[str, str]]:
    """`name{key="value",...}` as its name and labels."""
    match = _SELECTOR.match(selector.strip())
    if match is None:
        raise ValueError(f"not a metric selector: {selector!r}")
    labels: dict[str, str] = {}
    rest = match["labels"] or ""
    while rest.strip():
        label = _LABEL.match(rest)
        if label is None:
            raise ValueError(f"not a metric selector: {selector!r}")
        labels[label["key"]] = label["value"].replace('\\"', '"').replace("\\\\", "\\")
        rest = rest[label.end() :]
    return match["name"], labels


def parse(text: str) -> Scrape:
    """An exposition in Prometheus's text format, parsed (ValueError on a malformed one)."""
    scrape = Scrape()
    for family in text_string_to_metric_families(text):
        scrape.families[family.name] = family.type
        for s in family.samples:
            scrape.samples.setdefault(s.name, []).append(Sample(s.name, dict(s.labels), float(s.value)))
    return scrape


async def scrape(url: str) -> Scrape:
    """GET `url` (a /metrics endpoint) and parse it; a status other than 200 fails."""
    async with aiohttp.ClientSession() as session, session.get(url) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise AssertionError(f"GET {url}: {resp.status} {text[:200]}")
    return parse(text)
