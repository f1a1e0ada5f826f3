"""Alert evaluation: one check per rule kind, then one place that opens, deduplicates, cools down
and resolves alerts.

A check returns the incidents that are true *now* for one rule and run (a list of Finding, empty
when all is well) or None when it cannot tell (no recent data): then open alerts stay as they are.

- interruption: an Interruption of the run (of the rule's categories, if any; an engineer's label
  wins) whose attempt has no later attempt with step rows. One incident per attempt, however many
  ranks reported the stop. Resolves when a later attempt logs a step. Fired from ingest.
- stall: the run is not finished or failed and its newest step row is older than ``minutes``.
- throughput_drop: the median per-step rate (tokens/s, else steps/s) of the last ``minutes`` is
  more than ``percent`` below the median of the BASELINE_S before that window.
- gpu_temperature: the newest sample of some GPU in the last GPU_WINDOW_S is above ``max_temp_c``
  or reports thermal / power-brake throttling (NVML reason bits THROTTLE_BITS).
- power_swing: cluster power = sum over GPUs of their latest power per second (carried forward,
  counted from the second every GPU has reported); fires when, in the last POWER_LOOKBACK_S, it
  rose or fell by more than ``kw`` within ``window_s`` seconds.
- ettr_below: collectors.reliability.run_goodput's ETTR below ``target_pct`` once the run's wall
  clock is at least ETTR_MIN_WALL_S (every run starts at 0% while it initialises).
- checkpoint_overdue: a running run's newest checkpoint save (or its first sign of life) is older
  than ``minutes``.
"""

from __future__ import annotations

import logging
import statistics
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone as django_tz

from collectors import reliability
from collectors.alerts.models import Alert, AlertRule, Notification
from collectors.analysis import throughput
from collectors.models import Category, Checkpoint, GpuSample, Interruption, Run, StepMetric

log = logging.getLogger(__name__)

BASELINE_S = 3600.0
GPU_WINDOW_S = 120.0
# NVML clock-throttle reasons that mean heat or power, not idling: HW slowdown, SW thermal,
# HW thermal, HW power brake.
THROTTLE_BITS = 0x8 | 0x20 | 0x40 | 0x80
POWER_LOOKBACK_S = 300.0
ETTR_MIN_WALL_S = 1800.0
# Runs a window rule looks at: running ones, and any seen this recently.
RECENT_RUN_S = 86400.0


@dataclass(frozen=True)
class Finding:
    incident_key: str
    summary: str
    root_cause: str = ""


Check = Callable[[AlertRule, Run, datetime], "list[Finding] | None"]


# --- pure decisions -----------------------------------------------------------------------------

def throughput_drop(baseline: Sequence[float], recent: Sequence[float],
                    percent: float) -> tuple[float, float] | None:
    """(baseline median, recent median) when recent is more than ``percent`` below baseline."""
    if not baseline or not recent:
        return None
    before, now = statistics.median(baseline), statistics.median(recent)
    return (before, now) if now < before * (1 - percent / 100) else None


def is_hot(temp_c: float | None, throttle: int | None, max_temp_c: float) -> bool:
    return (temp_c is not None and temp_c > max_temp_c) or bool((throttle or 0) & THROTTLE_BITS)


@dataclass(frozen=True)
class Swing:
    kw: float  # signed: positive for a rise
    start: float
    end: float


def cluster_power(samples: Iterable[tuple[float, str, float | None]]) -> list[tuple[int, float]]:
    """Sum of GPU power per second (W), each GPU's last value carried forward, starting at the
    second every GPU has reported once (before that the sum would ramp up as GPUs appear)."""
    by_second: dict[int, dict[str, float]] = {}
    for ts, key, watts in samples:
        if watts is not None:
            by_second.setdefault(int(ts), {})[key] = watts
    latest: dict[str, float] = {}
    keys = {key for values in by_second.values() for key in values}
    series = []
    if not by_second:
        return series
    for second in range(min(by_second), max(by_second) + 1):
        latest.update(by_second.get(second, {}))
        if len(latest) == len(keys):
            series.append((second, sum(latest.values())))
    return series


def largest_swing(series: Sequence[tuple[int, float]], window_s: float) -> Swing | None:
    """The largest rise or fall of ``series`` within ``window_s`` seconds (sliding min and max)."""
    best: Swing | None = None
    lows: deque[tuple[int, float]] = deque()
    highs: deque[tuple[int, float]] = deque()
    for second, watts in series:
        for window, keep in ((lows, lambda old, new: old < new), (highs, lambda old, new: old > new)):
            while window and window[0][0] < second - window_s:
                window.popleft()
            while window and not keep(window[-1][1], watts):
                window.pop()
            window.append((second, watts))
        for t0, w0 in (lows[0], highs[0]):
            delta = (watts - w0) / 1000.0
            if best is None or abs(delta) > abs(best.kw):
                best = Swing(kw=delta, start=t0, end=second)
    return best


# --- checks, one per kind -----------------------------------------------------------------------

def _labels() -> dict[str, str]:
    return dict(Category.choices)


def root_cause_of(interruption: Interruption) -> str:
    label = _labels().get(interruption.effective_category, interruption.effective_category)
    expected = "expected" if interruption.effective_expected else "unexpected"
    rule = interruption.rule or "no rule matched"
    return f"{label} ({expected}; confidence {interruption.confidence:.0%}, rule {rule})"


def _what(interruption: Interruption) -> str:
    evidence = interruption.evidence or {}
    text = (evidence.get("text") or "").strip().splitlines()
    detail = evidence.get("exc_type") or (text[0] if text else "") or interruption.source
    where = f" on {interruption.host}" if interruption.host else ""
    rank = f" rank {interruption.rank}" if interruption.rank is not None else ""
    return (f"Attempt {interruption.attempt.number} stopped{where}{rank} at "
            f"{interruption.ts:%Y-%m-%d %H:%M:%S} UTC: {detail}"[:500])


def check_interruption(rule: AlertRule, run: Run, now: datetime) -> list[Finding]:
    newest_stepping = (StepMetric.objects.filter(run=run).order_by("-attempt__number")
                       .values_list("attempt__number", flat=True).first())
    found: dict[int, Finding] = {}
    stops = Interruption.objects.filter(run=run).select_related("attempt").order_by("ts", "pk")
    if newest_stepping is not None:
        stops = stops.filter(attempt__number__gte=newest_stepping)
    for stop in stops:
        if rule.categories and stop.effective_category not in rule.categories:
            continue
        if stop.attempt_id in found:
            continue  # several ranks reporting one stop: one incident
        found[stop.attempt_id] = Finding(f"attempt:{stop.attempt.number}", _what(stop),
                                         root_cause_of(stop))
    return list(found.values())


def _newest_step_at(run: Run) -> datetime | None:
    return StepMetric.objects.filter(run=run).order_by("-ts").values_list("ts", flat=True).first()


def check_stall(rule: AlertRule, run: Run, now: datetime) -> list[Finding] | None:
    if run.status in (Run.Status.FINISHED, Run.Status.FAILED):
        return []
    last = _newest_step_at(run)
    if last is None:
        return None
    minutes = rule.parameters["minutes"]
    silent = now - last
    if silent < timedelta(minutes=minutes):
        return []
    stop = run.interruptions.filter(ts__gte=last - timedelta(minutes=1)).order_by("ts").first()
    return [Finding("stall", f"No training progress for {silent.total_seconds() / 60:.0f} min "
                    f"(last step at {last:%Y-%m-%d %H:%M:%S} UTC; limit {minutes:g} min).",
                    root_cause_of(stop) if stop else "")]


def check_throughput_drop(rule: AlertRule, run: Run, now: datetime) -> list[Finding] | None:
    window = timedelta(minutes=rule.parameters["minutes"])
    start = now - window - timedelta(seconds=BASELINE_S)
    rows = list(StepMetric.objects.filter(run=run, ts__gt=start, ts__lte=now)
                .values_list("ts", "duration_s", "tokens"))
    recent = [row for row in rows if row[0] > now - window]
    baseline = [row for row in rows if row[0] <= now - window]
    if not recent or not baseline:
        return None
    unit = throughput.rate_unit(row[2] for row in rows)

    def rates(part):
        found = throughput.step_rates([r[1] for r in part], [r[2] for r in part], unit)
        return [rate for rate in found if rate is not None]

    drop = throughput_drop(rates(baseline), rates(recent), rule.parameters["percent"])
    if drop is None:
        return []
    before, after = drop
    return [Finding("throughput_drop",
                    f"Throughput {after:,.1f} {unit} over the last {window.total_seconds() / 60:g}"
                    f" min is {100 * (1 - after / before):.0f}% below the trailing median "
                    f"{before:,.1f} {unit}.")]


def check_gpu_temperature(rule: AlertRule, run: Run, now: datetime) -> list[Finding] | None:
    rows = (GpuSample.objects.filter(run=run, ts__gt=now - timedelta(seconds=GPU_WINDOW_S),
                                     ts__lte=now)
            .order_by("ts").values_list("host", "gpu", "temp_c", "throttle"))
    newest: dict[tuple[str, int], tuple[float | None, int | None]] = {}
    for host, gpu, temp, throttle in rows:
        newest[(host, gpu)] = (temp, throttle)
    if not newest:
        return None
    limit = rule.parameters["max_temp_c"]
    hot = sorted(((temp or 0.0, host, gpu, throttle) for (host, gpu), (temp, throttle)
                  in newest.items() if is_hot(temp, throttle, limit)), reverse=True)
    if not hot:
        return []
    temp, host, gpu, throttle = hot[0]
    throttling = sum(1 for row in hot if (row[3] or 0) & THROTTLE_BITS)
    return [Finding("gpu_temperature",
                    f"{len(hot)} GPU(s) above {limit:g} °C or throttling; hottest {host} GPU {gpu} "
                    f"at {temp:.0f} °C; {throttling} throttling for heat or power.")]


def check_power_swing(rule: AlertRule, run: Run, now: datetime) -> list[Finding] | None:
    window_s = rule.parameters["window_s"]
    lookback = max(POWER_LOOKBACK_S, 2 * window_s)
    rows = GpuSample.objects.filter(run=run, ts__gt=now - timedelta(seconds=lookback),
                                    ts__lte=now).values_list("ts", "host", "gpu", "power_w")
    series = cluster_power((ts.timestamp(), f"{host}:{gpu}", watts)
                           for ts, host, gpu, watts in rows)
    if not series:
        return None
    swing = largest_swing(series, window_s)
    if swing is None or abs(swing.kw) <= rule.parameters["kw"]:
        return []
    direction = "rose" if swing.kw > 0 else "fell"
    at = datetime.fromtimestamp(swing.end, tz=now.tzinfo)
    return [Finding("power_swing",
                    f"Cluster power {direction} by {abs(swing.kw):,.1f} kW within "
                    f"{swing.end - swing.start:.0f} s (at {at:%H:%M:%S} UTC; limit "
                    f"{rule.parameters['kw']:g} kW in {window_s:g} s).")]


def check_ettr_below(rule: AlertRule, run: Run, now: datetime) -> list[Finding] | None:
    goodput = reliability.run_goodput(run)
    if goodput.ettr is None or goodput.total.wall < ETTR_MIN_WALL_S:
        return None
    target = rule.parameters["target_pct"]
    if goodput.ettr * 100 >= target:
        return []
    worst = max(("startup", "checkpoint_save", "lost_progress", "restart_downtime", "stall"),
                key=lambda bucket: getattr(goodput.total, bucket))
    return [Finding("ettr_below",
                    f"ETTR is {goodput.ettr:.1%}, below the target {target:g}%.",
                    f"Largest badput: {worst.replace('_', ' ')} "
                    f"({getattr(goodput.total, worst) / 60:.0f} min).")]


def check_checkpoint_overdue(rule: AlertRule, run: Run, now: datetime) -> list[Finding] | None:
    if run.status != Run.Status.RUNNING:
        return []
    last_save = (Checkpoint.objects.filter(run=run, kind=Checkpoint.Kind.SAVE)
                 .order_by("-ts").values_list("ts", flat=True).first())
    since = last_save or run.first_seen_at
    if since is None:
        return None
    minutes = rule.parameters["minutes"]
    if now - since < timedelta(minutes=minutes):
        return []
    what = (f"last save at {last_save:%Y-%m-%d %H:%M:%S} UTC" if last_save
            else "no save since the run started")
    return [Finding("checkpoint_overdue",
                    f"No checkpoint saved for {(now - since).total_seconds() / 60:.0f} min "
                    f"({what}; limit {minutes:g} min).")]


CHECKS: dict[str, Check] = {
    AlertRule.Kind.INTERRUPTION: check_interruption,
    AlertRule.Kind.STALL: check_stall,
    AlertRule.Kind.THROUGHPUT_DROP: check_throughput_drop,
    AlertRule.Kind.GPU_TEMPERATURE: check_gpu_temperature,
    AlertRule.Kind.POWER_SWING: check_power_swing,
    AlertRule.Kind.ETTR_BELOW: check_ettr_below,
    AlertRule.Kind.CHECKPOINT_OVERDUE: check_checkpoint_overdue,
}


# --- alerts from findings -----------------------------------------------------------------------

def _notify(alert: Alert, kind: str) -> list[Notification]:
    from collectors.alerts.tasks import deliver

    created = [Notification.objects.create(alert=alert, channel=channel, kind=kind)
               for channel in alert.rule.channels.all()]
    for notification in created:
        # After commit: the worker must find the row this transaction wrote.
        transaction.on_commit(lambda pk=notification.pk: deliver.delay(pk))
    return created


def _cooling_down(rule: AlertRule, run: Run, now: datetime) -> bool:
    """A firing message for this rule and run already went out within the cooldown."""
    since = now - timedelta(minutes=rule.cooldown_minutes)
    return Alert.objects.filter(rule=rule, run=run, notified=True, opened_at__gt=since).exists()


def apply_findings(rule: AlertRule, run: Run, findings: list[Finding] | None,
                   now: datetime) -> tuple[list[Alert], list[Alert]]:
    """Opens an alert per new finding and resolves open alerts whose finding is gone.
    Returns (opened, resolved)."""
    if findings is None:
        return [], []
    open_alerts = {alert.incident_key: alert
                   for alert in Alert.objects.filter(rule=rule, run=run, state=Alert.State.FIRING)}
    opened, resolved = [], []
    for finding in findings:
        if finding.incident_key in open_alerts:
            continue
        notify = not _cooling_down(rule, run, now)
        try:
            with transaction.atomic():
                alert = Alert.objects.create(
                    rule=rule, run=run, incident_key=finding.incident_key, opened_at=now,
                    summary=finding.summary, root_cause=finding.root_cause, notified=notify,
                    last_notified_at=now if notify else None,
                )
        except IntegrityError:
            continue  # another evaluation opened it first
        if notify:
            _notify(alert, Notification.Kind.FIRING)
        opened.append(alert)
    keys = {finding.incident_key for finding in findings}
    for key, alert in open_alerts.items():
        if key in keys:
            continue
        # Conditional update: of two racing evaluations, one resolves and notifies.
        if not Alert.objects.filter(pk=alert.pk, state=Alert.State.FIRING).update(
                state=Alert.State.RESOLVED, resolved_at=now,
                last_notified_at=now if alert.notified else alert.last_notified_at):
            continue
        alert.refresh_from_db()
        if alert.notified:
            _notify(alert, Notification.Kind.RESOLVED)
        resolved.append(alert)
    return opened, resolved


def rules_for(run: Run, kinds: Iterable[str] | None = None):
    rules = AlertRule.objects.filter(Q(run=run) | Q(run__isnull=True), project_id=run.project_id,
                                     enabled=True)
    return rules.filter(kind__in=list(kinds)) if kinds is not None else rules


def evaluate_rule(rule: AlertRule, run: Run, now: datetime | None = None):
    now = now or django_tz.now()
    return apply_findings(rule, run, CHECKS[rule.kind](rule, run, now), now)


def evaluate_run(run: Run, kinds: Iterable[str] | None = None, now: datetime | None = None) -> None:
    now = now or django_tz.now()
    for rule in rules_for(run, kinds):
        try:
            evaluate_rule(rule, run, now)
        except Exception:
            # One broken rule must not keep the others from being evaluated.
            log.exception("evaluating alert rule %s on run %s failed", rule.pk, run.pk)


def evaluate_windows(now: datetime | None = None) -> None:
    """Every enabled rule on every run it covers that is running, recent or has an open alert."""
    now = now or django_tz.now()
    recent = now - timedelta(seconds=RECENT_RUN_S)
    for rule in AlertRule.objects.filter(enabled=True).select_related("run"):
        if rule.run_id:
            runs = [rule.run]
        else:
            runs = Run.objects.filter(project_id=rule.project_id).filter(
                Q(status=Run.Status.RUNNING) | Q(last_seen_at__gte=recent)
                | Q(alerts__rule=rule, alerts__state=Alert.State.FIRING)).distinct()
        for run in runs:
            try:
                evaluate_rule(rule, run, now)
            except Exception:
                log.exception("evaluating alert rule %s on run %s failed", rule.pk, run.pk)
