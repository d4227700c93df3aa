"""Kubernetes resource quantities as integers in canonical units (pure).

CPU is counted in millicores, memory and storage in bytes, everything else (GPUs, pods,
extended resources) in whole units. Integers keep sums exact and records small.
"""

from __future__ import annotations

import math
from decimal import Decimal, InvalidOperation

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {"n": Decimal("1e-9"), "u": Decimal("1e-6"), "m": Decimal("1e-3"), "k": Decimal(10**3)}
_DECIMAL.update({"M": Decimal(10**6), "G": Decimal(10**9), "T": Decimal(10**12), "P": Decimal(10**15)})
_DECIMAL["E"] = Decimal(10**18)

CPU = "cpu"
MEMORY = "memory"
GPU = "nvidia.com/gpu"
PODS = "pods"


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def parse(quantity: str | int | float) -> Decimal:
    """A quantity as an exact decimal number of base units ('1.5Gi' -> 1610612736)."""
    if isinstance(quantity, (int, float)):
        return Decimal(str(quantity))
    text = quantity.strip()
    try:
        for suffix, factor in _BINARY.items():
            if text.endswith(suffix):
                return Decimal(text[: -len(suffix)]) * factor
        if text and text[-1] in _DECIMAL and not text[-1].isdigit():
            return Decimal(text[:-1]) * _DECIMAL[text[-1]]
        return Decimal(text)
    except InvalidOperation as exc:
        raise QuantityError(f"not a quantity: {quantity!r}") from exc


def to_canonical(name: str, quantity: str | int | float) -> int:
    """Millicores for cpu (rounded up, as the scheduler does), whole units otherwise."""
    value = parse(quantity)
    if name == CPU:
        return math.ceil(value * 1000)
    return math.ceil(value)


def vector(resources: dict[str, str] | None) -> dict[str, int]:
    """A resource list (name -> quantity string) in canonical units; unparsable entries dropped."""
    out: dict[str, int] = {}
    for name, quantity in (resources or {}).items():
        try:
            out[name] = to_canonical(name, quantity)
        except QuantityError:
            continue
    return out


def format_quantity(name: str, value: int) -> str:
    """Back to a quantity string: millicores as 'NNNm', bytes and counts as plain integers."""
    if name == CPU:
        return f"{value}m" if value % 1000 else str(value // 1000)
    return str(value)


def add(a: dict[str, int], b: dict[str, int], sign: int = 1) -> dict[str, int]:
    out = dict(a)
    for name, value in b.items():
        out[name] = out.get(name, 0) + sign * value
    return out


def fits(request: dict[str, int], free: dict[str, int]) -> bool:
    """True if every requested resource is available in `free`."""
    return all(value <= free.get(name, 0) for name, value in request.items() if value > 0)
