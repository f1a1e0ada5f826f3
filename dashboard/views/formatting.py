"""How numbers and times read on the page. Presentation only: the numbers come from analysis."""

from __future__ import annotations

from datetime import datetime


def ago(then: datetime | None, now: datetime) -> str:
    """'12 s ago', '4 min ago', '3 h ago', '2 d ago'; '—' when never."""
    if then is None:
        return "—"
    seconds = max(0, int((now - then).total_seconds()))
    if seconds < 60:
        return f"{seconds} s ago"
    if seconds < 3600:
        return f"{seconds // 60} min ago"
    if seconds < 86400:
        return f"{seconds // 3600} h ago"
    return f"{seconds // 86400} d ago"


def exact(ts: datetime | None) -> str:
    return "" if ts is None else ts.strftime("%Y-%m-%d %H:%M:%S %Z")


def rate(value: float | None) -> str:
    """About three significant digits with k/M/G suffixes: 0.912, 12.4, 3.41k, 1.20M."""
    if value is None:
        return "—"
    suffix = ""
    for limit, name in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= limit:
            value, suffix = value / limit, name
            break
    if abs(value) >= 100:
        return f"{value:.0f}{suffix}"
    if abs(value) >= 10:
        return f"{value:.1f}{suffix}"
    if abs(value) >= 1 or suffix:
        return f"{value:.2f}{suffix}"
    return f"{value:.3g}"


def integer(value: int | None) -> str:
    return "—" if value is None else f"{value:,}"


def number(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"
