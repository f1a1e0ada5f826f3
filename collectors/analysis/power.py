"""Cluster power over time and its swings. Pure: arrays in, numbers out.

Large runs swing the site's power draw by megawatts within seconds when every GPU waits at once
(a checkpoint save, a collective stall) or starts at once (a restart). This module measures it.

**Cluster power.** P(s), for every whole UTC second s, is the sum over GPUs (host, gpu) of that
GPU's latest ``power_w`` sample at or before s. A sample is carried forward until the GPU's next
one, but for at most ``stale_after_s`` seconds (default: 3 × the median interval between a GPU's
consecutive samples, so one lost sample is bridged and a dead sampler is not): a GPU with no fresh
sample contributes nothing, and a second in which *no* GPU has a fresh sample is a gap (NaN), not
0 W — a job that died stops telling us what its GPUs draw. Samples without a power reading are
ignored. ``cluster_power`` does this in O(samples + seconds) with a difference array.

For long ranges the same sum is read per minute from the GpuMinute rollup: ``minute_power`` gives
the cluster's mean power per minute (sum over GPUs of each GPU's mean that minute) and two bounds,
``upper`` = Σ per-GPU maxima and ``lower`` = Σ per-GPU minima, between which every per-second value
of that minute must lie. ``candidate_regions`` uses those bounds to find the only places where a
swing of a given size can be, so that per-second refinement reads raw samples for minutes, not days.

**Swings.** With window W (default 60 s), for each second b the largest rise ending at b is
P(b) − min P[b−W, b] and the largest fall is P(b) − max P[b−W, b] (NaN seconds ignored). Swings
are picked greedily by |size|, largest first, skipping any whose span [a, b) touches a swing
already picked, down to ``min_kw`` (default 5% of the range's peak power, well above the noise of
summed sensors) or ``limit`` swings. A swing reports:

- ``delta_kw`` = P(b) − P(a): signed size in kW (negative for a fall), from the level before to the
  level after, both extremes of the window;
- ``start``/``end``: the transition itself, however long the plateaus on either side: t10 and t90
  are where P (linearly interpolated between seconds) last crosses 10% and first crosses 90% of the
  way from P(a) to P(b); the transition is [t10 − (t90 − t10)/8, t90 + (t90 − t10)/8], which is
  exact for a linear ramp, 1 s for a one-second step, and 5 s for a step spread over 5 s; across a
  gap in telemetry it is the last second at the old level to the first at the new;
- ``rate_kw_s`` = delta_kw / (end − start): mean slope over the transition, kW/s;
  ``peak_rate_kw_s``: the steepest single step of P within it, in the swing's direction.

**Causes.** ``annotate`` attaches every happening whose span, widened by ``tolerance_s`` on both
sides, overlaps [start, end]: checkpoint saves/loads (their blocking span), interruptions (from the
attempt's last step before it, when the GPUs stopped computing, to its report, which may come
minutes later after a watchdog timeout), restarts (an attempt's start up to its first step, the
first attempt included: the whole cluster ramps up either way), stalls (gaps in step completions
across all ranks, less what the others explain, see ``stall_happenings``). The cause shown is the first
present of interruption, restart, stall, checkpoint — a restart also loads a checkpoint, but the
restart is why the whole cluster moved.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

DEFAULT_WINDOW_S = 60.0
#: Carry a sample forward for this many sample intervals at most.
STALE_INTERVALS = 3.0
#: When the interval cannot be measured (one sample per GPU): carry for this long.
DEFAULT_STALE_S = 30.0
#: A second needs fresh samples from this fraction of the GPUs reporting around it.
DEFAULT_MIN_COVERAGE = 0.98
DEFAULT_COVERAGE_WINDOW_S = 600.0
#: Swings smaller than this fraction of the peak power are noise of summed sensors.
DEFAULT_MIN_FRACTION = 0.05
#: A swing's transition starts/ends within this fraction of |delta| of its levels.
LEVEL_BAND = 0.1
#: Priority of causes, most telling first.
CAUSE_ORDER = ("interruption", "restart", "stall", "checkpoint")


@dataclass(frozen=True)
class PowerSeries:
    """Cluster power on a regular grid: ``kw[i]`` at ``start + i * step_s`` (Unix seconds);
    NaN where no GPU reported. ``gpus[i]``: GPUs that contributed."""

    start: float
    step_s: float
    kw: np.ndarray
    gpus: np.ndarray

    @property
    def times(self) -> np.ndarray:
        return self.start + self.step_s * np.arange(len(self.kw))

    def __len__(self) -> int:
        return len(self.kw)


@dataclass(frozen=True)
class MinutePower:
    """Per minute of a run (from GpuMinute): mean cluster power and the bounds of its seconds."""

    series: PowerSeries  # step_s = 60, the mean
    upper: np.ndarray  # Σ per-GPU max power that minute, kW
    lower: np.ndarray  # Σ per-GPU min power that minute, kW


@dataclass(frozen=True)
class Happening:
    """Something that may move the cluster's power: ``kind`` one of CAUSE_ORDER."""

    kind: str
    start: float
    end: float
    label: str = ""


@dataclass(frozen=True)
class Swing:
    start: float
    end: float
    delta_kw: float
    rate_kw_s: float
    peak_rate_kw_s: float
    from_kw: float
    to_kw: float
    #: What coincided (module doc), most telling first; empty when nothing did.
    happenings: tuple[Happening, ...] = field(default=())

    @property
    def direction(self) -> str:
        return "rise" if self.delta_kw > 0 else "fall"

    @property
    def duration_s(self) -> float:
        return self.end - self.start

    @property
    def cause(self) -> str | None:
        return self.happenings[0].kind if self.happenings else None


# --- cluster power ------------------------------------------------------------------------------


def sample_interval(ts: np.ndarray, gpu: np.ndarray) -> float | None:
    """Median interval between consecutive samples of the same GPU; None with too few samples."""
    ts, gpu = np.asarray(ts, dtype=np.float64), np.asarray(gpu)
    if len(ts) < 2:
        return None
    order = np.lexsort((ts, gpu))
    same = gpu[order][1:] == gpu[order][:-1]
    gaps = np.diff(ts[order])[same]
    gaps = gaps[gaps > 0]
    return float(np.median(gaps)) if len(gaps) else None


def rollup_interval(samples: np.ndarray, gpus: np.ndarray) -> float | None:
    """The sample interval the per-minute rollup implies: the median over minutes of
    60 s × GPUs / samples (a GPU sampled every 10 s gives 6 samples a minute)."""
    samples, gpus = np.asarray(samples, dtype=np.float64), np.asarray(gpus, dtype=np.float64)
    full = (samples > 0) & (gpus > 0)
    return float(np.median(60.0 * gpus[full] / samples[full])) if full.any() else None


def default_stale_after(ts: np.ndarray, gpu: np.ndarray) -> float:
    interval = sample_interval(ts, gpu)
    return DEFAULT_STALE_S if interval is None else STALE_INTERVALS * interval


def cluster_power(
    ts: Sequence[float] | np.ndarray, gpu: Sequence[int] | np.ndarray,
    power_w: Sequence[float | None] | np.ndarray, *, stale_after_s: float | None = None,
    start: float | None = None, end: float | None = None,
    min_coverage: float = DEFAULT_MIN_COVERAGE,
    coverage_window_s: float = DEFAULT_COVERAGE_WINDOW_S,
) -> PowerSeries:
    """P(s) per whole second from raw samples (module doc). ``gpu`` is any integer id of a
    (host, gpu) pair. ``start``/``end`` bound the grid (default: the first and last sample); pass
    samples from ``start - stale_after_s`` on so that values carried into the range are known."""
    ts = np.asarray(ts, dtype=np.float64)
    gpu = np.asarray(gpu, dtype=np.int64)
    power = np.array([np.nan if p is None else p for p in power_w], dtype=np.float64) \
        if not isinstance(power_w, np.ndarray) else power_w.astype(np.float64)
    if not (len(ts) == len(gpu) == len(power)):
        raise ValueError("ts, gpu and power_w must have the same length.")
    keep = np.isfinite(power) & np.isfinite(ts)
    ts, gpu, power = ts[keep], gpu[keep], power[keep]
    if stale_after_s is None:
        stale_after_s = default_stale_after(ts, gpu)
    if len(ts) == 0 and (start is None or end is None):
        return PowerSeries(0.0, 1.0, np.empty(0), np.empty(0, dtype=np.int64))
    first = math.ceil(start if start is not None else ts.min())
    last = math.floor(end if end is not None else ts.max())
    n = max(0, last - first + 1)
    if n == 0 or len(ts) == 0:
        return PowerSeries(float(first), 1.0, np.full(n, np.nan), np.zeros(n, dtype=np.int64))
    order = np.lexsort((ts, gpu))
    ts, gpu, power = ts[order], gpu[order], power[order]
    following = np.empty_like(ts)
    following[:-1] = ts[1:]
    following[-1] = np.inf
    following[np.flatnonzero(gpu[1:] != gpu[:-1])] = np.inf  # a GPU's last sample
    hold_until = np.minimum(following, ts + stale_after_s)
    # Sample i counts for the seconds k with ts_i <= first + k < hold_until_i.
    begin = np.clip(np.ceil(ts - first), 0, n).astype(np.int64)
    stop = np.clip(np.ceil(hold_until - first), 0, n).astype(np.int64)
    live = begin < stop
    begin, stop, power = begin[live], stop[live], power[live]
    watts = np.cumsum(np.bincount(begin, power, n + 1) - np.bincount(stop, power, n + 1))[:n]
    counts = np.cumsum(np.bincount(begin, minlength=n + 1) - np.bincount(stop, minlength=n + 1))[:n]
    kw = np.where(counts > 0, np.round(watts, 6) / 1000.0, np.nan)
    kw = mask_partial(kw, counts, min_coverage, int(coverage_window_s))
    return PowerSeries(float(first), 1.0, kw, counts.astype(np.int64))


def mask_partial(kw: np.ndarray, gpus: np.ndarray, min_coverage: float, window: int) -> np.ndarray:
    """``kw`` with NaN wherever fewer than ``min_coverage`` of the most GPUs counted within
    ``window`` grid steps either side contributed (module doc)."""
    if len(kw) == 0 or min_coverage <= 0:
        return kw
    reference = centered_max(gpus.astype(np.float64), max(0, window))
    return np.where(gpus >= min_coverage * reference, kw, np.nan)


def centered_max(values: np.ndarray, half: int) -> np.ndarray:
    """max(values[i - half .. i + half]) for every i, in O(n) whatever the window (van Herk /
    Gil-Werman: prefix and suffix maxima within blocks of the window's length)."""
    n = len(values)
    k = 2 * half + 1
    if half == 0 or n == 0:
        return values.copy()
    padded = np.concatenate((np.full(half, -np.inf), values, np.full(half, -np.inf)))
    blocks = -(-len(padded) // k)
    padded = np.concatenate((padded, np.full(blocks * k - len(padded), -np.inf))).reshape(blocks, k)
    prefix = np.maximum.accumulate(padded, axis=1).ravel()
    suffix = np.maximum.accumulate(padded[:, ::-1], axis=1)[:, ::-1].ravel()
    # Window [i, i + k - 1] of the padded array is centred on values[i].
    return np.maximum(suffix[:n], prefix[k - 1:k - 1 + n])


def minute_power(minute: Sequence[float] | np.ndarray, mean_kw: Sequence[float] | np.ndarray,
                 upper_kw: Sequence[float] | np.ndarray, lower_kw: Sequence[float] | np.ndarray,
                 gpus: Sequence[int] | np.ndarray, *, min_coverage: float = DEFAULT_MIN_COVERAGE,
                 ) -> MinutePower:
    """The per-minute series on a regular grid from rollup sums (minute = Unix seconds of the
    minute's start, ascending); minutes without rows become gaps, and so do minutes in which
    fewer than ``min_coverage`` of the GPUs reporting within ten minutes reported (a partial sum).
    The bounds stay: a swing's second may lie in a partial minute."""
    minute = np.asarray(minute, dtype=np.float64)
    if len(minute) == 0:
        empty = np.empty(0)
        return MinutePower(PowerSeries(0.0, 60.0, empty, np.empty(0, dtype=np.int64)), empty, empty)
    index = np.round((minute - minute[0]) / 60.0).astype(np.int64)
    n = int(index[-1]) + 1

    def grid(values, fill=np.nan, dtype=np.float64):
        out = np.full(n, fill, dtype=dtype)
        out[index] = np.asarray(values, dtype=dtype)
        return out

    counts = grid(gpus, 0, np.int64)
    mean = mask_partial(grid(mean_kw), counts, min_coverage, 10)
    return MinutePower(PowerSeries(float(minute[0]), 60.0, mean, counts), grid(upper_kw),
                       grid(lower_kw))


# --- swings -------------------------------------------------------------------------------------


def _window_extremes(y: np.ndarray, w: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For each i: min and max of y[i-w .. i] ignoring NaN, and where they are (NaN/-1 if none).
    Chunked so memory stays O(chunk × w) on a multi-day per-second series."""
    n = len(y)
    padded = np.concatenate((np.full(w, np.nan), y))
    lo_val, hi_val = np.full(n, np.nan), np.full(n, np.nan)
    lo_pos, hi_pos = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    chunk = max(1, 2_000_000 // (w + 1))
    for c0 in range(0, n, chunk):
        c1 = min(n, c0 + chunk)
        view = np.lib.stride_tricks.sliding_window_view(padded[c0:c1 + w], w + 1)
        empty = np.all(np.isnan(view), axis=1)
        i_lo = np.argmin(np.where(np.isnan(view), np.inf, view), axis=1)
        i_hi = np.argmax(np.where(np.isnan(view), -np.inf, view), axis=1)
        rows = np.arange(c1 - c0)
        lo_val[c0:c1] = np.where(empty, np.nan, view[rows, i_lo])
        hi_val[c0:c1] = np.where(empty, np.nan, view[rows, i_hi])
        # Window of output i starts at input index i - w.
        lo_pos[c0:c1] = np.where(empty, -1, c0 + rows - w + i_lo)
        hi_pos[c0:c1] = np.where(empty, -1, c0 + rows - w + i_hi)
    return lo_val, lo_pos, hi_val, hi_pos


def find_swings(series: PowerSeries, *, window_s: float = DEFAULT_WINDOW_S,
                min_kw: float | None = None, limit: int | None = None) -> list[Swing]:
    """The largest rises and falls of ``series`` within ``window_s`` (module doc), largest first."""
    y = series.kw
    if len(y) < 2 or np.all(np.isnan(y)):
        return []
    w = max(1, int(round(window_s / series.step_s)))
    if min_kw is None:
        min_kw = DEFAULT_MIN_FRACTION * float(np.nanmax(y))
    min_kw = max(min_kw, 1e-9)
    lo_val, lo_pos, hi_val, hi_pos = _window_extremes(y, w)
    with np.errstate(invalid="ignore"):
        rise = y - lo_val
        fall = hi_val - y
    rise = np.nan_to_num(rise, nan=0.0)
    fall = np.nan_to_num(fall, nan=0.0)
    ends = np.flatnonzero((rise >= min_kw) | (fall >= min_kw))
    candidates = []
    for b in ends.tolist():
        if rise[b] >= min_kw:
            candidates.append((rise[b], b, int(lo_pos[b])))
        if fall[b] >= min_kw:
            candidates.append((fall[b], b, int(hi_pos[b])))
    # Largest first; on ties the earliest end, so a plateau's first second wins.
    candidates.sort(key=lambda c: (-c[0], c[1]))
    taken = np.zeros(len(y) + 1, dtype=bool)
    swings: list[Swing] = []
    for _size, b, a in candidates:
        if a < 0 or a >= b or taken[a:b].any():
            continue
        swing, s, e = _tighten(series, a, b)
        taken[s:max(e, s + 1)] = True
        swings.append(swing)
        if limit is not None and len(swings) >= limit:
            break
    return swings


def _tighten(series: PowerSeries, a: int, b: int) -> tuple[Swing, int, int]:
    """The swing from a to b with its transition located (module doc); also the grid indices
    [s, e] that the transition covers, which later swings may not touch.

    On Python floats rather than numpy arrays: a segment is at most a window long, and the
    whole-run minute series of a 4.6-day run has ~430 swings, for which numpy's per-call overhead
    was 85% of find_swings (the same IEEE operations: identical results)."""
    seg = series.kw[a:b + 1].tolist()
    level0, level1 = seg[0], seg[-1]
    delta = level1 - level0
    sign = 1.0 if delta > 0 else -1.0
    lvl10, lvl90 = level0 + 0.1 * delta, level0 + 0.9 * delta
    # NaN compares false either way, as in numpy.
    i90 = next(i for i, v in enumerate(seg) if sign * (v - lvl90) >= 0)
    i10 = next(i for i in range(i90 - 1, -1, -1) if sign * (seg[i] - lvl10) < 0)
    t10, measured10 = _crossing(seg, i10, lvl10)
    t90, measured90 = _crossing(seg, i90 - 1, lvl90)
    if measured10 and measured90:
        # A linear ramp crosses 10% and 90% of the way at 1/8 of (t90 - t10) from either end.
        spread = (t90 - t10) / 8.0
        t_start, t_end = max(0.0, t10 - spread), min(float(b - a), t90 + spread)
    else:  # across a gap: from the last second known at the old level to the first at the new
        t_start, t_end = float(i10), float(i90)
    step_s = series.step_s
    duration = (t_end - t_start) * step_s
    steps = [step for step in ((seg[i + 1] - seg[i]) * sign for i in range(i10, i90))
             if math.isfinite(step)]
    swing = Swing(
        start=series.start + (a + t_start) * step_s, end=series.start + (a + t_end) * step_s,
        delta_kw=delta, rate_kw_s=delta / duration,
        peak_rate_kw_s=sign * max(steps) / step_s if steps else delta / duration,
        from_kw=level0, to_kw=level1,
    )
    return swing, a + i10, a + i90


def _crossing(seg: list[float], i: int, level: float) -> tuple[float, bool]:
    """Where the line from seg[i] to seg[i+1] crosses ``level`` (i + fraction), and whether it
    could be measured: not when either side is missing (a gap: we do not know when it crossed)."""
    here, there = seg[i], seg[i + 1]
    if not (math.isfinite(here) and math.isfinite(there)) or here == there:
        return float(i), False
    return i + min(max((level - here) / (there - here), 0.0), 1.0), True


def merge_swings(groups: Iterable[Iterable[Swing]], limit: int | None = None) -> list[Swing]:
    """Swings found in separate (possibly overlapping) regions, as one greedy list: largest first,
    dropping any that overlaps one already kept."""
    ordered = sorted((s for group in groups for s in group), key=lambda s: (-abs(s.delta_kw), s.start))
    kept: list[Swing] = []
    for swing in ordered:
        if any(swing.start < k.end and k.start < swing.end for k in kept):
            continue
        if any(swing.start == k.start and swing.end == k.end for k in kept):
            continue
        kept.append(swing)
        if limit is not None and len(kept) >= limit:
            break
    return kept


# --- rollup candidates --------------------------------------------------------------------------


def candidate_regions(minutes: MinutePower, *, min_kw: float, window_s: float = DEFAULT_WINDOW_S,
                      carry_s: float = 0.0, margin_s: float = 0.0,
                      limit: int | None = None) -> list[tuple[float, float]]:
    """Time ranges (start, end), Unix seconds, where a swing of at least ``min_kw`` within
    ``window_s`` can be, largest possible swing first (up to ``limit`` ranges).

    A swing from second a to b (b − a ≤ W) moves P between values that samples of the minutes
    around a and b set; a sample is carried for up to ``carry_s``, so P(a) may come from as far
    as k = ceil((W + carry) / 60) minutes before b's minute. Minute m can therefore end a swing of
    size D only if max(upper[m-k..m]) − lower[m] ≥ D (a fall) or upper[m] − min(lower[m-k..m]) ≥ D
    (a rise) — exact per GPU, and for the cluster sum a screen that holds when the GPUs move
    together (which is what a cluster swing is). Each candidate minute m gives the range
    [start of m−k − margin, end of m + margin]; overlapping ranges are merged."""
    upper, lower = minutes.upper, minutes.lower
    n = len(upper)
    if n == 0:
        return []
    k = max(1, math.ceil((window_s + carry_s) / 60.0))
    series_start = minutes.series.start
    pad_u = np.concatenate((np.full(k, np.nan), upper))
    pad_l = np.concatenate((np.full(k, np.nan), lower))
    view_u = np.lib.stride_tricks.sliding_window_view(pad_u, k + 1)
    view_l = np.lib.stride_tricks.sliding_window_view(pad_l, k + 1)
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN windows: minutes with no rows
        max_u = np.nanmax(view_u, axis=1)
        min_l = np.nanmin(view_l, axis=1)
        bound = np.fmax(max_u - lower, upper - min_l)
    bound = np.nan_to_num(bound, nan=0.0)
    order = [int(m) for m in np.argsort(-bound, kind="stable") if bound[m] >= min_kw]
    ranges: list[tuple[float, float]] = []
    for m in order:
        lo = series_start + (m - k) * 60.0 - margin_s
        hi = series_start + (m + 1) * 60.0 + margin_s
        merged = False
        for i, (r0, r1) in enumerate(ranges):
            if lo <= r1 and r0 <= hi:
                ranges[i] = (min(r0, lo), max(r1, hi))
                merged = True
                break
        if not merged:
            if limit is not None and len(ranges) >= limit:
                break
            ranges.append((lo, hi))
    return ranges


# --- causes -------------------------------------------------------------------------------------


def step_gaps(step_ts: Sequence[float] | np.ndarray, min_gap_s: float) -> list[tuple[float, float]]:
    """Spans longer than ``min_gap_s`` in which no rank completed a step (the steps' end times of
    all ranks, any order): a stall, unless something else explains it."""
    ts = np.sort(np.asarray(step_ts, dtype=np.float64))
    if len(ts) < 2:
        return []
    gaps = np.diff(ts)
    at = np.flatnonzero(gaps > min_gap_s)
    return [(float(ts[i]), float(ts[i + 1])) for i in at]


def stall_happenings(gaps: Iterable[tuple[float, float]], explained_by: Sequence[Happening],
                     min_stall_s: float) -> list[Happening]:
    """Stalls: the longest stretch of each step gap that no checkpoint, interruption or restart
    covers, when it is at least ``min_stall_s`` long (a save followed by a hang leaves the hang;
    a save alone leaves nothing)."""
    stalls = []
    for g0, g1 in gaps:
        free = [(g0, g1)]
        for h in explained_by:
            free = [piece for f0, f1 in free
                    for piece in ((f0, min(f1, h.start)), (max(f0, h.end), f1))
                    if piece[1] > piece[0]]
        if not free:
            continue
        s0, s1 = max(free, key=lambda f: f[1] - f[0])
        if s1 - s0 >= min_stall_s:
            stalls.append(Happening("stall", s0, s1, f"no step for {g1 - g0:.0f} s"))
    return stalls


def annotate(swings: Iterable[Swing], happenings: Sequence[Happening],
             tolerance_s: float) -> list[Swing]:
    """Each swing with the happenings that coincided within ``tolerance_s`` (module doc), most
    telling kind first, then nearest in time."""
    rank = {kind: i for i, kind in enumerate(CAUSE_ORDER)}
    out = []
    for swing in swings:
        hits = [h for h in happenings
                if h.start - tolerance_s <= swing.end and swing.start <= h.end + tolerance_s]
        mid = (swing.start + swing.end) / 2
        hits.sort(key=lambda h: (rank.get(h.kind, len(rank)),
                                 0.0 if h.start <= mid <= h.end else min(abs(h.start - mid),
                                                                         abs(h.end - mid))))
        out.append(replace(swing, happenings=tuple(hits)))
    return out


def default_tolerance(stale_after_s: float) -> float:
    """Carried-forward samples lag the truth by up to a sample interval; allow that and more."""
    return max(30.0, stale_after_s)


# --- distribution -------------------------------------------------------------------------------


@dataclass(frozen=True)
class SwingHistogram:
    edges_kw: list[float]  # bin edges of |delta|, len = bins + 1
    rises: list[int]
    falls: list[int]


def swing_histogram(swings: Sequence[Swing], bins: int = 20) -> SwingHistogram:
    """Counts of rises and of falls by size |delta_kw|, on shared bins from 0 to the largest."""
    if not swings:
        return SwingHistogram([], [], [])
    top = max(abs(s.delta_kw) for s in swings)
    edges = np.linspace(0.0, top, bins + 1) if top > 0 else np.array([0.0, 1.0])
    rises = np.histogram([s.delta_kw for s in swings if s.delta_kw > 0], bins=edges)[0]
    falls = np.histogram([-s.delta_kw for s in swings if s.delta_kw < 0], bins=edges)[0]
    return SwingHistogram(edges.tolist(), rises.tolist(), falls.tolist())
