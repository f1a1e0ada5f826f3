"""What a run's Power and GPU health pages show: collectors.cluster_reads reads, the analyses
(collectors.analysis.power, .gpu_health) judge, dashboard.charts_power / charts_gpu_health draw.
This module wires them together and formats; it computes nothing of its own.

Whole-run reads come from the per-minute rollup. The Power page measures swings per second: from
raw samples outright when the range holds at most RAW_SAMPLES_LIMIT of them, otherwise only inside
the regions the rollup's bounds say can hold a swing (collectors.analysis.power.candidate_regions),
so a 512-GPU, three-day run reads minutes of raw samples, not days."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from collectors import cluster_reads
from collectors.analysis import gpu_health, power
from collectors.models import Run
from dashboard import charts_gpu_health, charts_power
from dashboard.views import formatting

#: Above this many raw samples in the range, swings are refined only where they can be. Reading
#: 100k samples takes ~0.2 s on a quiet machine (the (run, ts) index scan dominates).
RAW_SAMPLES_LIMIT = 100_000
#: Candidate regions refined per second in the rollup path (largest possible swing first).
MAX_REGIONS = 16
#: Swings listed in the table and marked on the chart.
MAX_SWINGS = 25
#: The per-minute series' own swings (for the whole-run histogram) span up to two minutes.
MINUTE_WINDOW_S = 120.0
#: GPU health: the heatmap's cells (GPUs × buckets) stay under this.
MAX_HEATMAP_CELLS = 50_000
TOP_GPUS = 20
EVENT_ROWS = 200


class RangeError(ValueError):
    """A start/end the user gave that cannot be read."""


def parse_range(params) -> tuple[float | None, float | None]:
    """``start``/``end`` from a query string: Unix seconds, or ISO 8601 (UTC if no offset)."""
    bounds = []
    for name in ("start", "end"):
        raw = (params.get(name) or "").strip()
        if not raw:
            bounds.append(None)
            continue
        try:
            value = float(raw)
        except ValueError:
            try:
                when = datetime.fromisoformat(raw.replace("Z", "+00:00"))
            except ValueError:
                raise RangeError(f"'{name}' must be Unix seconds or an ISO 8601 time "
                                 f"(got {raw[:40]!r}).") from None
            value = (when if when.tzinfo else when.replace(tzinfo=UTC)).timestamp()
        if not math.isfinite(value):
            raise RangeError(f"'{name}' must be a finite time.")
        bounds.append(value)
    start, end = bounds
    if start is not None and end is not None and end <= start:
        raise RangeError("'end' must be after 'start'.")
    return start, end


@dataclass(frozen=True)
class PowerView:
    """The Power page's numbers: the series drawn, the swings listed, how they were measured."""

    series: power.PowerSeries
    swings: list[power.Swing]
    histogram: power.SwingHistogram
    detail: list[power.PowerSeries]
    per_minute: bool
    min_kw: float
    window_s: float
    stale_after_s: float
    tolerance_s: float
    start: float
    end: float


def power_view(run: Run, start: float | None = None, end: float | None = None, *,
               window_s: float = power.DEFAULT_WINDOW_S) -> PowerView | None:
    """Cluster power and its largest swings over [start, end] (default: the whole run)."""
    rows = cluster_reads.minute_power(run)
    minutes = rows.minutes
    if not len(minutes.series):
        return None
    run_lo = minutes.series.start
    run_hi = run_lo + 60.0 * len(minutes.series)
    lo = max(run_lo, start) if start is not None else run_lo
    hi = min(run_hi, end) if end is not None else run_hi
    if hi <= lo:
        lo, hi = run_lo, run_hi
    first = max(0, int((lo - run_lo) // 60))
    last = min(len(minutes.series), int(math.ceil((hi - run_lo) / 60)))
    in_range = minutes.series.kw[first:last]
    peak = float(np.nanmax(in_range)) if np.any(np.isfinite(in_range)) else 0.0
    min_kw = max(power.DEFAULT_MIN_FRACTION * peak, 1e-3)
    # Raw samples are read from one staleness limit before a range, so that values carried into
    # it are known; the limit follows from the sample interval the rollup implies.
    interval = power.rollup_interval(rows.samples, minutes.series.gpus)
    stale = power.STALE_INTERVALS * interval if interval else power.DEFAULT_STALE_S
    if int(rows.samples[first:last].sum()) <= RAW_SAMPLES_LIMIT:
        raw = cluster_reads.raw_power(run, lo - stale, hi)
        series = power.cluster_power(raw.ts, raw.gpu, raw.power_w, stale_after_s=stale,
                                     start=lo, end=hi)
        every = power.find_swings(series, window_s=window_s, min_kw=min_kw)
        histogram = power.swing_histogram(every)
        swings, detail, per_minute = every[:MAX_SWINGS], [], False
    else:
        regions = [(r0, r1) for r0, r1 in power.candidate_regions(
            minutes, min_kw=min_kw, window_s=window_s, carry_s=stale, margin_s=window_s / 2,
            limit=MAX_REGIONS * 4) if r1 >= lo and r0 <= hi][:MAX_REGIONS]
        regions = [(max(r0, lo), min(r1, hi)) for r0, r1 in regions]
        raws = cluster_reads.raw_power_windows(run, [(r0 - stale, r1) for r0, r1 in regions])
        found, detail = [], []
        for (r0, r1), raw in zip(regions, raws, strict=True):
            piece = power.cluster_power(raw.ts, raw.gpu, raw.power_w, start=r0, end=r1,
                                        stale_after_s=stale)
            detail.append(piece)
            found.append(power.find_swings(piece, window_s=window_s, min_kw=min_kw))
        swings = power.merge_swings(found, limit=MAX_SWINGS)
        series = power.PowerSeries(run_lo + 60.0 * first, 60.0, minutes.series.kw[first:last],
                                   minutes.series.gpus[first:last])
        histogram = power.swing_histogram(
            power.find_swings(series, window_s=MINUTE_WINDOW_S, min_kw=min_kw))
        per_minute = True
    tolerance = power.default_tolerance(stale)
    happenings = cluster_reads.happenings(run, lo - window_s - tolerance, hi + tolerance)
    swings = power.annotate(swings, happenings, tolerance)
    unexplained = [s for s in swings if s.cause is None]
    if unexplained:  # only then look for a stall: two index lookups per swing
        median_step = cluster_reads.median_step_s(run)
        # Both ends: a stall's fall ends inside the gap, its recovery starts inside it.
        stalls = cluster_reads.stalls(run, [t for s in unexplained for t in (s.start, s.end)],
                                      max(60.0, 10 * (median_step or 0.0)), happenings)
        swings = power.annotate(swings, happenings + stalls, tolerance)
    return PowerView(series=series, swings=swings, histogram=histogram, detail=detail,
                     per_minute=per_minute, min_kw=min_kw, window_s=window_s,
                     stale_after_s=stale, tolerance_s=tolerance, start=lo, end=hi)


def power_figures(view: PowerView) -> dict[str, Any]:
    return {
        "power": charts_power.power_figure(view.series, view.swings, detail=view.detail,
                                           per_minute=view.per_minute),
        "histogram": charts_power.histogram_figure(view.histogram, per_minute=view.per_minute),
    }


def swing_rows(view: PowerView) -> list[dict[str, Any]]:
    return [{
        "direction": s.direction,
        "start": _at(s.start), "end": _at(s.end),
        "start_epoch": round(s.start, 3), "end_epoch": round(s.end, 3),
        "delta_kw": round(s.delta_kw, 1),
        "delta": f"{s.delta_kw:+,.1f} kW",
        "from_to": f"{s.from_kw:,.1f} → {s.to_kw:,.1f} kW",
        "duration": f"{s.duration_s:.1f} s",
        "rate_kw_s": round(s.rate_kw_s, 2),
        "rate": f"{s.rate_kw_s:+,.2f} kW/s",
        "peak_rate": f"{s.peak_rate_kw_s:+,.2f} kW/s",
        "cause": s.cause or "",
        "coincided": [h.label or h.kind for h in s.happenings],
    } for s in view.swings]


def power_summary(view: PowerView) -> dict[str, str]:
    kw = view.series.kw
    finite = kw[np.isfinite(kw)]
    rises = [s for s in view.swings if s.delta_kw > 0]
    falls = [s for s in view.swings if s.delta_kw < 0]
    steepest = max(view.swings, key=lambda s: abs(s.rate_kw_s), default=None)
    return {
        "peak": f"{finite.max():,.1f} kW" if len(finite) else "—",
        "low": f"{finite.min():,.1f} kW" if len(finite) else "—",
        "largest_fall": f"{min(s.delta_kw for s in falls):+,.1f} kW" if falls else "—",
        "largest_rise": f"{max(s.delta_kw for s in rises):+,.1f} kW" if rises else "—",
        "steepest": f"{steepest.rate_kw_s:+,.2f} kW/s" if steepest else "—",
        "swings": formatting.integer(sum(view.histogram.rises) + sum(view.histogram.falls)),
    }


def power_context(run: Run, start: float | None = None, end: float | None = None) -> dict[str, Any]:
    view = power_view(run, start, end)
    if view is None:
        return {"empty": True}
    return {
        "empty": False,
        "figures": power_figures(view),
        "swings": swing_rows(view),
        "summary": power_summary(view),
        "method": {
            "per_minute": view.per_minute,
            "window": f"{view.window_s:.0f} s",
            "min_kw": f"{view.min_kw:,.1f} kW",
            "stale": f"{view.stale_after_s:.0f} s",
            "tolerance": f"{view.tolerance_s:.0f} s",
            "range": f"{_at(view.start)} – {_at(view.end)}",
        },
    }


# --- GPU health ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuHealthView:
    heatmap: gpu_health.Heatmap
    hottest: list[gpu_health.GpuSummary]
    throttling: list[gpu_health.GpuSummary]
    fleet_median_c: float | None
    errors: list[gpu_health.GpuErrors]
    events: list[gpu_health.GpuEvent]
    gpus: int


def gpu_health_view(run: Run, order: str = "name") -> GpuHealthView | None:
    span = cluster_reads.gpu_span(run)
    if span is None:
        return None
    max_buckets = max(24, min(360, MAX_HEATMAP_CELLS // max(1, run.world_size)))
    bucket_s = gpu_health.bucket_seconds(span[1] - span[0], max_buckets)
    # The summaries from each GPU's run totals and the heatmap from its bucket means, both
    # summed in SQL: 30k cells as Python objects were 2/3 of the 512-GPU page.
    means, totals = cluster_reads.gpu_health_rows(run, bucket_s)
    summaries = gpu_health.gpu_summaries(totals)
    events = cluster_reads.gpu_events(run)
    return GpuHealthView(
        heatmap=gpu_health.heatmap_of_means(means, bucket_s, order=order, summaries=summaries),
        hottest=gpu_health.rank_hottest(summaries)[:TOP_GPUS],
        throttling=gpu_health.rank_throttling(summaries)[:TOP_GPUS],
        fleet_median_c=gpu_health.fleet_median_temp(summaries),
        errors=gpu_health.errors_per_gpu(events),
        events=events[:EVENT_ROWS],
        gpus=len(summaries),
    )


def gpu_health_figures(view: GpuHealthView) -> dict[str, Any]:
    return {"temp": charts_gpu_health.heatmap_figure(view.heatmap, "temp"),
            "power": charts_gpu_health.heatmap_figure(view.heatmap, "power")}


def gpu_health_context(run: Run, order: str = "name") -> dict[str, Any]:
    view = gpu_health_view(run, order)
    if view is None:
        return {"empty": True, "order": order}

    def c(value: float | None, digits: int = 1) -> str:
        return "—" if value is None else f"{value:.{digits}f}"

    return {
        "empty": False,
        "order": order,
        "gpus": view.gpus,
        "fleet_median": c(view.fleet_median_c),
        "figures": gpu_health_figures(view),
        "hottest": [{"name": s.name, "mean": c(s.mean_temp_c), "max": c(s.max_temp_c),
                     "above": f"{s.above_median_c:+.1f}", "power": c(s.mean_power_w, 0),
                     "throttled": f"{100 * s.throttled_fraction:.1f}%"} for s in view.hottest],
        "throttling": [{"name": s.name, "fraction": f"{100 * s.throttled_fraction:.1f}%",
                        "samples": formatting.integer(s.throttled_samples),
                        "reasons": ", ".join(s.throttle_reasons), "mean": c(s.mean_temp_c)}
                       for s in view.throttling],
        "errors": [{"name": r.name, "xids": r.xids, "ecc": r.ecc, "last": _at(r.last_ts),
                    "codes": ", ".join(str(code) for code in r.codes)} for r in view.errors],
        "events": [{"when": _at(e.ts), "name": e.host if e.gpu is None else f"{e.host}:{e.gpu}",
                    "kind": e.kind.upper(), "code": "" if e.code is None else e.code,
                    "detail": e.detail} for e in view.events],
    }


def _at(epoch: float) -> str:
    return formatting.exact(datetime.fromtimestamp(epoch, tz=UTC))
