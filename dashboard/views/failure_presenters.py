"""What a run's Failures and Checkpoints pages show: collectors.reliability reads, the analyses
judge (goodput, root causes, checkpoint history), dashboard.charts_failures draws. This module
only wires them together and formats; it computes nothing of its own."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.http import QueryDict

from collectors import reliability
from collectors.analysis import checkpoints as checkpoint_analysis
from collectors.analysis import goodput as goodput_analysis
from collectors.analysis import root_causes
from collectors.models import Category, Interruption, Run
from dashboard import charts_failures
from dashboard.views import formatting

RANGE_PRESETS = (("24h", "Last 24 h", timedelta(hours=24)), ("7d", "Last 7 d", timedelta(days=7)),
                 ("all", "All", None))


def duration(seconds: float | None) -> str:
    """'12.3 s', '4 min 05 s', '3 h 12 min', '2 d 4 h'; '—' when unknown."""
    if seconds is None:
        return "—"
    if seconds < 60:
        return f"{seconds:.1f} s"
    whole = int(round(seconds))
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    if whole < 86400:
        return f"{whole // 3600} h {whole % 3600 // 60:02d} min"
    return f"{whole // 86400} d {whole % 86400 // 3600} h"


def percent(fraction: float | None, digits: int = 1) -> str:
    return "—" if fraction is None else f"{100 * fraction:.{digits}f}%"


def size(value: float | None) -> str:
    if value is None:
        return "—"
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if value >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{int(value)} B"


def _at(epoch: float | None) -> str:
    return "" if epoch is None else formatting.exact(datetime.fromtimestamp(epoch, tz=UTC))


@dataclass(frozen=True)
class TimeRange:
    """The interruptions shown: [start, end), either bound open; ``preset`` names a button."""

    preset: str
    start: datetime | None
    end: datetime | None
    error: str = ""

    def contains(self, ts: datetime) -> bool:
        return (self.start is None or ts >= self.start) and (self.end is None or ts < self.end)


def _parse_when(text: str) -> datetime | None:
    when = datetime.fromisoformat(text)
    return when if when.tzinfo else when.replace(tzinfo=UTC)


def time_range(query: QueryDict, now: datetime) -> TimeRange:
    """From ``?range=24h|7d|all`` or ``?from=…&to=…`` (ISO dates or times, UTC unless marked)."""
    start_text, end_text = query.get("from", "").strip(), query.get("to", "").strip()
    if start_text or end_text:
        try:
            start = _parse_when(start_text) if start_text else None
            end = _parse_when(end_text) if end_text else None
        except ValueError:
            return TimeRange("all", None, None,
                             "Dates must look like 2026-03-01 or 2026-03-01T14:00; showing all.")
        return TimeRange("custom", start, end)
    preset = query.get("range", "all")
    for slug, _label, span in RANGE_PRESETS:
        if slug == preset:
            return TimeRange(slug, now - span if span else None, None)
    return TimeRange("all", None, None)


def _evidence_summary(interruption: Interruption) -> list[tuple[str, str]]:
    evidence = interruption.evidence or {}
    shown = []
    for key, label in (("exc_type", "exception"), ("exit_code", "exit code"), ("signal", "signal"),
                       ("xids", "XIDs"), ("ecc_dbe", "ECC DBE"), ("detector", "detector"),
                       ("silent_for_s", "silent for (s)"), ("last_step_at", "last step"),
                       ("last_heartbeat_at", "last heartbeat")):
        value = evidence.get(key)
        if value not in (None, "", [], False):
            shown.append((label, ", ".join(map(str, value)) if isinstance(value, list) else str(value)))
    return shown


def _interruption_row(interruption: Interruption, cost_s: float | None, counted: bool,
                      now: datetime) -> dict[str, Any]:
    evidence = interruption.evidence or {}
    text = str(evidence.get("text") or "")
    labelled = bool(interruption.label_category) or interruption.label_expected is not None
    return {
        "id": interruption.pk,
        "ts": formatting.exact(interruption.ts),
        "ago": formatting.ago(interruption.ts, now),
        "attempt": interruption.attempt.number,
        "rank": interruption.rank,
        "host": interruption.host,
        "source": interruption.source,
        "category": interruption.effective_category,
        "category_label": root_causes.LABELS.get(interruption.effective_category,
                                                 interruption.effective_category),
        "component": root_causes.component_of(interruption.effective_category),
        "expected": interruption.effective_expected,
        "classified_label": root_causes.LABELS.get(interruption.category, interruption.category),
        "classified_expected": interruption.expected,
        "confidence": f"{interruption.confidence:.2f}",
        "rule": interruption.rule,
        "matched": str(evidence.get("matched") or "")[:120],
        "text_head": text.strip().splitlines()[0][:200] if text.strip() else "",
        "text": text[:4000],
        "evidence": _evidence_summary(interruption),
        "labelled": labelled,
        "label_category": interruption.label_category,
        "label_expected": ("" if interruption.label_expected is None
                           else "yes" if interruption.label_expected else "no"),
        "labelled_by": interruption.labelled_by.get_username() if interruption.labelled_by else "",
        "labelled_at": formatting.exact(interruption.labelled_at),
        "cost": duration(cost_s) if counted else "counted with the attempt's first report",
    }


def _badput_rows(badput: goodput_analysis.Badput) -> list[dict[str, Any]]:
    wall = badput.wall
    return [
        {"bucket": name, "label": goodput_analysis.BUCKET_LABELS[name],
         "seconds": getattr(badput, name), "text": duration(getattr(badput, name)),
         "share": percent(getattr(badput, name) / wall if wall else None)}
        for name in goodput_analysis.BUCKETS
    ]


def failures_context(run: Run, query: QueryDict, now: datetime) -> dict[str, Any]:
    interruptions = reliability.run_interruptions(run)
    goodput = reliability.run_goodput(run, interruptions)
    costs = root_causes.interruption_costs(goodput)
    window = time_range(query, now)
    shown = [i for i in interruptions if window.contains(i.ts)]
    table = root_causes.root_cause_table(reliability.interruption_facts(shown), costs)
    counted_ids = {f.id for f in goodput_analysis.primary_interruptions(
        reliability.interruption_facts(interruptions)).values()}
    attempts = [
        {"number": a.number, "start": _at(a.start), "wall": duration(a.end - a.start),
         "ettr": percent(a.badput.ettr), "steps_lost": a.steps_lost,
         "buckets": {name: duration(getattr(a.badput, name)) if getattr(a.badput, name) else ""
                     for name in goodput_analysis.BUCKETS},
         "ended_by": (root_causes.LABELS.get(a.interruption.category, a.interruption.category)
                      if a.interruption else "")}
        for a in goodput.attempts
    ]
    return {
        "ettr": percent(goodput.ettr),
        "ettr_value": goodput.ettr,
        "wall": duration(goodput.total.wall if goodput.attempts else None),
        "productive": duration(goodput.total.productive if goodput.attempts else None),
        "badput_rows": _badput_rows(goodput.total),
        "interruptions": goodput.interruptions,
        "unexpected": goodput.unexpected_interruptions,
        "mtbi": duration(goodput.mtbi_s),
        "mtbi_unexpected": duration(goodput.mtbi_unexpected_s),
        "attempts": attempts,
        "root_causes": [
            {"category": r.category, "label": r.label, "component": r.component, "count": r.count,
             "unexpected": r.unexpected, "pct": f"{r.pct_of_unexpected:.1f}%",
             "time_lost": duration(r.time_lost_s)}
            for r in table.rows
        ],
        "root_total": table.total,
        "root_unexpected": table.unexpected,
        "root_time_lost": duration(table.time_lost_s),
        "interruption_rows": [
            _interruption_row(i, costs.get(i.attempt.number), i.pk in counted_ids, now)
            for i in reversed(shown)
        ],
        "range": window,
        "presets": [(slug, label) for slug, label, _span in RANGE_PRESETS],
        "range_from": window.start.strftime("%Y-%m-%dT%H:%M") if window.start else "",
        "range_to": window.end.strftime("%Y-%m-%dT%H:%M") if window.end else "",
        "categories": Category.choices,
        "figures": {
            "timeline": charts_failures.attempts_timeline_figure(goodput),
            "root_causes": charts_failures.root_cause_figure(table),
        },
    }


def checkpoints_context(run: Run) -> dict[str, Any]:
    facts = reliability.checkpoint_facts(run)
    goodput = reliability.run_goodput(run)
    history = checkpoint_analysis.checkpoint_history(facts, goodput)
    summary = history.summary
    return {
        "summary": {
            "saves": summary.saves,
            "restores": summary.restores,
            "median_interval": duration(summary.median_interval_s),
            "median_blocking": duration(summary.median_blocking_s),
            "max_blocking": duration(summary.max_blocking_s),
            "total_blocking": duration(summary.total_blocking_s),
            "median_size": size(summary.median_bytes),
            "steps_lost": f"{summary.total_steps_lost:,}",
            "lost": duration(summary.total_lost_s),
        },
        "saves": [
            {"attempt": s.attempt, "step": formatting.integer(s.step), "ts": _at(s.ts),
             "interval": duration(s.interval_s),
             "interval_steps": formatting.integer(s.interval_steps),
             "blocking": duration(s.duration_s), "size": size(s.bytes)}
            for s in reversed(history.saves)
        ],
        "restores": [
            {"attempt": r.attempt, "step": formatting.integer(r.step), "ts": _at(r.ts),
             "load": duration(r.duration_s), "size": size(r.bytes),
             "steps_lost": formatting.integer(r.steps_lost), "lost": duration(r.lost_s),
             "downtime": duration(r.downtime_s)}
            for r in reversed(history.restores)
        ],
        "figures": {"saves": charts_failures.checkpoint_figure(history)},
    }
