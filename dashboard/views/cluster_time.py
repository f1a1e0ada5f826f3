"""A run's Time of day page (is it slower in the afternoon heat, and by how much?) and its
Stragglers page (which ranks drag every step, where they run, what they cost), each with the JSON
endpoint that serves its figures and numbers. The numbers come from collectors.analysis.time_of_day
and .stragglers; this module only words and formats them."""

from __future__ import annotations

from typing import Any

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from collectors.analysis import stragglers as straggler_analysis
from collectors.analysis import time_of_day as tod_analysis
from dashboard import charts_time_of_day as charts
from dashboard.views import formatting
from dashboard.views.access import get_run_for_user
from dashboard.views.failure_presenters import duration


def signed_pct(value: float | None, digits: int = 2) -> str:
    if value is None:
        return "—"
    # -0.004 would read "-0.00%": a sign on nothing.
    return f"{0.0:.{digits}f}%" if round(value, digits) == 0 else f"{value:+.{digits}f}%"


def share_of_step(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}% of a step"


def hour(value: int | None) -> str:
    return "—" if value is None else f"{value:02d}:00"


def correlation_caption(correlation: tod_analysis.Correlation) -> str:
    """What r says, and what it does not."""
    if correlation.r is None:
        if correlation.n < 3:
            return ("Not enough hours with both throughput and GPU temperature to correlate "
                    f"(n = {correlation.n}).")
        return "One of the two curves is flat, so there is nothing to correlate."
    r, n = correlation.r, correlation.n
    strength = ("no clear" if abs(r) < 0.3 else "a weak" if abs(r) < 0.5
                else "a moderate" if abs(r) < 0.7 else "a strong")
    direction = "" if abs(r) < 0.3 else (" negative" if r < 0 else " positive")
    p = correlation.p_value
    chance = ("" if p is None else f", p ≈ {p:.1g}" if p >= 1e-4 else ", p < 0.0001")
    reading = {True: "hotter hours are slower", False: "hotter hours are faster"}[r < 0]
    text = (f"Pearson r = {r:+.2f} between hourly throughput and mean GPU temperature across "
            f"{n} local hours{chance} (Fisher-z approximation): {strength}{direction} relation")
    if abs(r) >= 0.3:
        text += f" ({reading})"
    return (text + ". Both follow the clock, so this shows they move together, not that heat "
            "causes the change; with 24 points or fewer, |r| under about 0.4 is within chance.")


def amplitude_sentence(result: tod_analysis.TimeOfDay) -> str:
    if result.amplitude_pp is None:
        return ("Not enough steps yet: an hour needs at least "
                f"{tod_analysis.MIN_MINUTES_PER_HOUR} minutes of steps to be compared.")
    slow, fast = result.slowest_hour, result.fastest_hour
    return (f"Throughput swings {result.amplitude_pp:.2f} percentage points over the day "
            f"({result.timezone}): fastest at {hour(fast)} "
            f"({signed_pct(result.hourly_deviation_pct[fast])} from the run median), slowest at "
            f"{hour(slow)} ({signed_pct(result.hourly_deviation_pct[slow])}).")


def _ordinal(k: int) -> str:
    return f"{k}{'th' if 10 <= k % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(k % 10, 'th')}"


def sampling_note(step_every: int, gpu_every: int = 1) -> str:
    """Says so when a long run was read every k-th minute (collectors.minute_sample)."""
    parts = []
    if step_every > 1:
        parts.append(f"every {_ordinal(step_every)} minute of steps")
    if gpu_every > 1:
        parts.append(f"every {_ordinal(gpu_every)} productive minute of GPU samples")
    if not parts:
        return ""
    return ("A long run: to answer within a second this page read " + " and ".join(parts)
            + ", a systematic sample.")


def time_of_day_data(run) -> dict[str, Any]:
    result = tod_analysis.read_time_of_day(run)
    r = result.correlation.r
    return {
        "summary": {
            "amplitude_pp": None if result.amplitude_pp is None else round(result.amplitude_pp, 4),
            "amplitude": "—" if result.amplitude_pp is None else f"{result.amplitude_pp:.2f} pp",
            "slowest_hour": hour(result.slowest_hour),
            "slowest_deviation": signed_pct(result.hourly_deviation_pct[result.slowest_hour]
                                            if result.slowest_hour is not None else None),
            "fastest_hour": hour(result.fastest_hour),
            "hottest_hour": hour(result.hottest_hour),
            "correlation": "—" if r is None else f"{r:+.2f}",
            "correlation_n": result.correlation.n,
            "run_median": formatting.rate(result.run_median),
            "unit": result.unit,
            "basis": result.basis,
            "minutes": formatting.integer(result.minutes),
            "days": len(result.days),
            "timezone": result.timezone,
            "sampling": sampling_note(result.minutes_every, result.gpu_minutes_every),
            "amplitude_sentence": amplitude_sentence(result),
            "correlation_caption": correlation_caption(result.correlation),
        },
        "hours": [
            {"hour": hour(h), "deviation": signed_pct(result.hourly_deviation_pct[h]),
             "rate": formatting.rate(result.hourly_rate[h]),
             "temp": ("—" if result.hourly_temp_c[h] is None
                      else f"{result.hourly_temp_c[h]:.1f} °C"),
             "minutes": formatting.integer(result.hourly_minutes[h])}
            for h in tod_analysis.HOURS
        ],
        "figures": {"hourly": charts.hourly_figure(result),
                    "overlay": charts.overlay_figure(result)},
    }


def _seconds(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f} s"


def straggler_data(run) -> dict[str, Any]:
    report = straggler_analysis.read_stragglers(run)
    cost = report.cost
    flagged = report.flagged_ranks
    worst = report.stragglers[0] if report.stragglers else None
    return {
        "summary": {
            "stragglers": len(report.stragglers),
            "ranks": len(report.ranks),
            "worst": (f"rank {worst.rank} {signed_pct(worst.excess_pct, 1)}" if worst else "—"),
            "median_step": _seconds(cost.median_step_s),
            "wait": _seconds(cost.wait_s),
            "wait_pct": share_of_step(cost.wait_pct),
            "straggler_wait": _seconds(cost.straggler_wait_s),
            "straggler_wait_pct": share_of_step(cost.straggler_wait_pct),
            "straggler_lost": (duration(cost.straggler_lost_s) if report.stragglers
                               else "—"),
            "sampling": sampling_note(report.minutes_every),
            "slow_pct": f"{report.slow_pct:g}%",
            "persistent_pct": f"{100 * report.persistent_share:g}%",
        },
        "rows": [
            {"rank": s.rank, "host": s.host or "—", "gpu": "—" if s.gpu is None else s.gpu,
             "excess": signed_pct(s.excess_pct, 1), "slow_minutes": formatting.integer(s.slow_minutes),
             "minutes": formatting.integer(s.minutes), "slow_share": f"{100 * s.slow_share:.0f}%",
             "mean_step": _seconds(s.mean_step_s), "flagged": s.rank in flagged}
            for s in _table_rows(report)
        ],
        "figures": {"ranks": charts.rank_step_figure(report),
                    "distribution": charts.excess_histogram_figure(report)},
    }


def _table_rows(report: straggler_analysis.StragglerReport) -> list[straggler_analysis.Straggler]:
    """Every flagged rank, then the rest of the top N by excess."""
    shown = list(report.stragglers)
    flagged = report.flagged_ranks
    shown += [s for s in report.top if s.rank not in flagged][:max(0, len(report.top) - len(shown))]
    return shown


@login_required
@require_GET
def run_time_of_day(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for_user(request, run_id)
    return render(request, "dashboard/run_time_of_day.html",
                  {"run": run, "tab": "time_of_day", **time_of_day_data(run)})


@login_required
@require_GET
def run_time_of_day_json(request: HttpRequest, run_id: int) -> JsonResponse:
    run = get_run_for_user(request, run_id)
    data = time_of_day_data(run)
    return JsonResponse({"summary": data["summary"], "figures": data["figures"]})


@login_required
@require_GET
def run_stragglers(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_run_for_user(request, run_id)
    return render(request, "dashboard/run_stragglers.html",
                  {"run": run, "tab": "stragglers", **straggler_data(run)})


@login_required
@require_GET
def run_stragglers_json(request: HttpRequest, run_id: int) -> JsonResponse:
    run = get_run_for_user(request, run_id)
    return JsonResponse(straggler_data(run))
