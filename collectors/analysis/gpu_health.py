"""GPU health of a run: which GPUs run hot, which throttle, which report XID or ECC errors — so a
bad GPU can be named before it fails. Pure: per-GPU aggregates and events in, rankings out.

Input is the GpuMinute rollup re-aggregated per (host, gpu, time bucket) — sums and counts, so
buckets of any width merge exactly: ``GpuCell``. A GPU is named ``host:gpu`` (gpu = its index on the
host, as NVML numbers it).

- **Heatmap**: mean temperature (and power) per GPU per bucket: temp_sum / temp_n. Rows are GPUs,
  by host and index or hottest first; columns are buckets; a bucket without samples is empty.
- **Hottest**: per GPU, the mean of all its temperature samples and its maximum, beside the fleet
  median of the GPUs' means (median, so that a few hot GPUs do not move the reference). Ranked by
  mean − fleet median: a GPU that runs 14 °C above its peers every hour is the one to swap, even if
  it never reached the limit.
- **Throttling**: NVML reports clock event ("throttle") reasons as bits. GPU_IDLE (0x1), the
  applications-clocks setting (0x2), sync boost (0x10) and the display clock (0x100) are normal
  operation, not throttling; the power cap (0x4), hardware slowdown (0x8), software/hardware
  thermal slowdown (0x20/0x40) and the power brake (0x80) cost throughput. The rollup counts the
  samples of a minute with a throttling reason bit (``THROTTLING_MASK``) and ORs all the bits, so
  a GPU's throttled fraction is exact. Rows ingested before migration 0008 counted samples with
  *any* bit; reading only minutes whose bits include a throttling reason keeps those an upper
  bound (exact after ``rebuild_rollups``).
- **XID/ECC history**: the run's ``xid`` and ``ecc`` events per GPU (the payload's ``gpu`` index on
  the event's host), newest first, with counts per GPU; an event without a GPU index is kept under
  the host alone.
"""

from __future__ import annotations

import math
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: NVML clock event reasons (nvmlClocksEventReason*; formerly nvmlClocksThrottleReason*).
THROTTLE_REASONS: dict[int, str] = {
    0x1: "GPU idle",
    0x2: "Applications clocks setting",
    0x4: "SW power cap",
    0x8: "HW slowdown",
    0x10: "Sync boost",
    0x20: "SW thermal slowdown",
    0x40: "HW thermal slowdown",
    0x80: "HW power brake slowdown",
    0x100: "Display clock setting",
}
#: Reasons that mean the GPU runs slower than it could under its load.
THROTTLING_MASK = 0x4 | 0x8 | 0x20 | 0x40 | 0x80

_DIGITS = re.compile(r"(\d+)")


def decode_throttle(bits: int | None) -> list[str]:
    """NVML reason names of the bits set, lowest bit first; unknown bits as hex."""
    if not bits:
        return []
    names = []
    for bit in range(64):
        value = 1 << bit
        if bits & value:
            names.append(THROTTLE_REASONS.get(value, f"0x{value:x}"))
    return names


@dataclass(frozen=True)
class GpuCell:
    """One GPU's samples within one time bucket (sums and counts from GpuMinute)."""

    host: str
    gpu: int
    bucket: float  # Unix seconds of the bucket's start
    samples: int
    temp_n: int
    temp_sum: float
    temp_max: float | None
    power_n: int
    power_sum: float
    power_max: float | None
    throttled: int = 0  # samples with a throttling reason bit
    throttle_bits: int = 0


@dataclass(frozen=True)
class GpuSummary:
    host: str
    gpu: int
    samples: int
    mean_temp_c: float | None
    max_temp_c: float | None
    mean_power_w: float | None
    max_power_w: float | None
    throttled_samples: int
    throttle_bits: int
    #: Set by ``rank_hottest``: mean temperature minus the fleet median of means.
    above_median_c: float | None = None

    @property
    def name(self) -> str:
        return f"{self.host}:{self.gpu}"

    @property
    def throttled_fraction(self) -> float:
        return self.throttled_samples / self.samples if self.samples else 0.0

    @property
    def throttle_reasons(self) -> list[str]:
        return decode_throttle(self.throttle_bits & THROTTLING_MASK)


def gpu_summaries(cells: Iterable[GpuCell]) -> list[GpuSummary]:
    """One summary per GPU, by host and index."""
    totals: dict[tuple[str, int], dict[str, Any]] = {}
    for c in cells:
        t = totals.setdefault((c.host, c.gpu), {"samples": 0, "temp_n": 0, "temp_sum": 0.0,
                                                "temp_max": None, "power_n": 0, "power_sum": 0.0,
                                                "power_max": None, "throttled": 0, "bits": 0})
        t["samples"] += c.samples
        t["temp_n"] += c.temp_n
        t["temp_sum"] += c.temp_sum
        t["temp_max"] = _max(t["temp_max"], c.temp_max)
        t["power_n"] += c.power_n
        t["power_sum"] += c.power_sum
        t["power_max"] = _max(t["power_max"], c.power_max)
        t["throttled"] += c.throttled
        t["bits"] |= c.throttle_bits
    return [
        GpuSummary(host=host, gpu=gpu, samples=t["samples"],
                   mean_temp_c=t["temp_sum"] / t["temp_n"] if t["temp_n"] else None,
                   max_temp_c=t["temp_max"],
                   mean_power_w=t["power_sum"] / t["power_n"] if t["power_n"] else None,
                   max_power_w=t["power_max"], throttled_samples=t["throttled"],
                   throttle_bits=t["bits"])
        for (host, gpu), t in sorted(totals.items(), key=lambda kv: _gpu_order(kv[0]))
    ]


def fleet_median_temp(summaries: Sequence[GpuSummary]) -> float | None:
    means = [s.mean_temp_c for s in summaries if s.mean_temp_c is not None]
    return statistics.median(means) if means else None


def rank_hottest(summaries: Sequence[GpuSummary]) -> list[GpuSummary]:
    """Every GPU with a temperature, hottest above the fleet median first (module doc)."""
    median = fleet_median_temp(summaries)
    if median is None:
        return []
    ranked = [
        GpuSummary(**{**s.__dict__, "above_median_c": s.mean_temp_c - median})
        for s in summaries if s.mean_temp_c is not None
    ]
    ranked.sort(key=lambda s: (-s.above_median_c, -(s.max_temp_c or -math.inf), s.host, s.gpu))
    return ranked


def rank_throttling(summaries: Sequence[GpuSummary]) -> list[GpuSummary]:
    """GPUs with throttled samples, the largest fraction first."""
    found = [s for s in summaries if s.throttled_samples > 0 and s.throttle_bits & THROTTLING_MASK]
    found.sort(key=lambda s: (-s.throttled_fraction, -s.throttled_samples, s.host, s.gpu))
    return found


@dataclass(frozen=True)
class Heatmap:
    """``temp_c[i][j]`` / ``power_w[i][j]``: GPU ``gpus[i]`` in the bucket starting at
    ``buckets[j]`` (Unix seconds); None where it had no samples."""

    gpus: list[str]
    buckets: list[float]
    bucket_s: float
    temp_c: list[list[float | None]] = field(default_factory=list)
    power_w: list[list[float | None]] = field(default_factory=list)


@dataclass(frozen=True)
class GpuMeans:
    """One GPU's buckets (Unix seconds of their start) with its mean temperature and power in
    each; NaN where the bucket has no sample of it."""

    bucket: np.ndarray
    temp_c: np.ndarray
    power_w: np.ndarray


def means_of_cells(cells: Iterable[GpuCell]) -> dict[tuple[str, int], GpuMeans]:
    """Each GPU's per-bucket means from its cells."""
    found: dict[tuple[str, int], list[tuple[float, float, float]]] = {}
    for c in cells:
        found.setdefault((c.host, c.gpu), []).append(
            (c.bucket, c.temp_sum / c.temp_n if c.temp_n else math.nan,
             c.power_sum / c.power_n if c.power_n else math.nan))
    return {key: GpuMeans(*np.array(rows, dtype=np.float64).reshape(-1, 3).T)
            for key, rows in found.items()}


def heatmap(cells: Sequence[GpuCell], bucket_s: float, *, order: str = "name",
            summaries: Sequence[GpuSummary] | None = None) -> Heatmap:
    """GPUs × buckets of mean temperature and power. ``order``: "name" (host, then index) or
    "hottest" (by mean temperature over the run, hottest first)."""
    if order == "hottest" and summaries is None:
        summaries = gpu_summaries(cells)
    return heatmap_of_means(means_of_cells(cells), bucket_s, order=order, summaries=summaries)


def heatmap_of_means(means: Mapping[tuple[str, int], GpuMeans], bucket_s: float, *,
                     order: str = "name",
                     summaries: Sequence[GpuSummary] | None = None) -> Heatmap:
    """``heatmap`` from each GPU's per-bucket means; "hottest" needs the GPUs' ``summaries``."""
    if order not in ("name", "hottest"):
        raise ValueError("order must be 'name' or 'hottest'.")
    if not means:
        return Heatmap([], [], bucket_s)
    keys = sorted(means, key=_gpu_order)
    if order == "hottest":
        mean = {(s.host, s.gpu): s.mean_temp_c for s in summaries or ()}
        keys.sort(key=lambda k: -(mean.get(k) if mean.get(k) is not None else -math.inf))
    first = min(float(m.bucket.min()) for m in means.values())
    last = max(float(m.bucket.max()) for m in means.values())
    columns = int(round((last - first) / bucket_s)) + 1
    temp = np.full((len(keys), columns), np.nan)
    watts = np.full((len(keys), columns), np.nan)
    for i, key in enumerate(keys):
        m = means[key]
        j = np.round((m.bucket - first) / bucket_s).astype(np.int64)
        temp[i, j] = m.temp_c
        watts[i, j] = m.power_w
    return Heatmap(
        gpus=[f"{host}:{gpu}" for host, gpu in keys],
        buckets=[first + j * bucket_s for j in range(columns)],
        bucket_s=bucket_s,
        temp_c=_rounded(temp, 2), power_w=_rounded(watts, 1),
    )


def bucket_seconds(span_s: float, max_buckets: int) -> int:
    """The bucket width for a span: whole minutes, then a round number (5, 10, 15, 30 min, 1, 2,
    3, 6, 12 h, days), so that at most ``max_buckets`` columns cover it."""
    for minutes in (1, 2, 5, 10, 15, 30, 60, 120, 180, 360, 720, 1440):
        if span_s / (minutes * 60) <= max_buckets:
            return minutes * 60
    return int(math.ceil(span_s / max_buckets / 86_400)) * 86_400


# --- XID / ECC ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuEvent:
    ts: float
    host: str
    gpu: int | None
    kind: str  # "xid" or "ecc"
    code: int | None  # the XID
    detail: str  # description, or ECC counts


@dataclass(frozen=True)
class GpuErrors:
    host: str
    gpu: int | None
    xids: int
    ecc: int
    last_ts: float
    codes: list[int]

    @property
    def name(self) -> str:
        return self.host if self.gpu is None else f"{self.host}:{self.gpu}"


def gpu_event(ts: float, host: str, kind: str, payload: dict[str, Any] | None) -> GpuEvent:
    """One stored xid/ecc Event as a GpuEvent (payload as the plugin sends it)."""
    payload = payload if isinstance(payload, dict) else {}
    gpu = payload.get("gpu")
    gpu = int(gpu) if isinstance(gpu, int | float) and not isinstance(gpu, bool) else None
    if kind == "xid":
        code = payload.get("xid")
        code = int(code) if isinstance(code, int | float) and not isinstance(code, bool) else None
        detail = str(payload.get("description") or "")
    else:
        code = None
        parts = [f"{label} +{payload[key]}" for key, label in (("delta_dbe", "double-bit"),
                                                                ("delta_sbe", "single-bit"))
                 if isinstance(payload.get(key), int | float) and payload.get(key)]
        detail = ", ".join(parts) or "ECC error count rose"
    return GpuEvent(ts=ts, host=host, gpu=gpu, kind=kind, code=code, detail=detail)


def errors_per_gpu(events: Iterable[GpuEvent]) -> list[GpuErrors]:
    """XID and ECC counts per GPU, the most events first."""
    grouped: dict[tuple[str, int | None], list[GpuEvent]] = defaultdict(list)
    for e in events:
        grouped[(e.host, e.gpu)].append(e)
    rows = [
        GpuErrors(host=host, gpu=gpu, xids=sum(e.kind == "xid" for e in found),
                  ecc=sum(e.kind == "ecc" for e in found), last_ts=max(e.ts for e in found),
                  codes=sorted({e.code for e in found if e.code is not None}))
        for (host, gpu), found in grouped.items()
    ]
    rows.sort(key=lambda r: (-(r.xids + r.ecc), -r.last_ts, r.host, -1 if r.gpu is None else r.gpu))
    return rows


# --- helpers ------------------------------------------------------------------------------------


def _gpu_order(key: tuple[str, int]) -> tuple:
    # Natural order of host names: node2 before node10.
    parts = tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in _DIGITS.split(key[0]) if p)
    return (parts, key[1])


def _max(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return max(a, b)


def _rounded(matrix: np.ndarray, digits: int) -> list[list[float | None]]:
    # Rounded and nulled in NumPy: a 512-GPU heatmap has 60k values, a Python round() each was
    # a fifth of the page.
    return np.where(np.isnan(matrix), None, np.round(matrix, digits)).tolist()
