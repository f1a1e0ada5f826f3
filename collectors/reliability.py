"""The reads behind a run's Failures and Checkpoints pages: attempts reduced to their step spans,
checkpoints merged over ranks, and interruptions with the label applied. Rows in, facts out; what
they mean is worked out by collectors.analysis.goodput, .checkpoints and .root_causes.

Step tables are large, so nothing here reads a whole run's steps: every lookup walks the (run, ts)
index from one end and stops at the first row that matches."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta

from django.db import connection
from django.utils.dateparse import parse_datetime

from collectors.analysis import goodput
from collectors.analysis.goodput import AttemptSpan, CheckpointFact, InterruptionFact
from collectors.models import Attempt, Checkpoint, Interruption, Run, StepMetric
from collectors.timestamps import to_epoch as _epoch

# Per attempt, its first and last step rows (any rank: ranks step in lockstep, so the earliest
# and the latest row bound the attempt's training). The first row is read forwards from just
# before the attempt's start (10 minutes of slack for a rank whose clock runs behind), so the
# index walk does not cross earlier attempts' rows; the last row is read backwards from 10 minutes
# after the next attempt's start, so it does not cross later attempts' rows either. Both walks
# carry both bounds: on the day-partitioned step table each partition's scan is started before
# any row is returned, and a partition outside the attempt's time must find nothing at once
# rather than filter all its rows (seconds per Failures page on a 1M-row run without them).
_SPANS_SQL = """
SELECT a.number, a.started_at, a.ended_at, f.ts, f.step, l.ts, l.step
FROM (SELECT *, lead(started_at) OVER (ORDER BY number) AS next_started_at
      FROM {attempt} WHERE run_id = %(run)s) a
LEFT JOIN LATERAL (
    SELECT ts, step FROM {step}
    WHERE run_id = a.run_id AND attempt_id = a.id
      AND ts >= coalesce(a.started_at - interval '10 minutes', '-infinity'::timestamptz)
      AND ts <= coalesce(a.next_started_at + interval '10 minutes', 'infinity'::timestamptz)
    ORDER BY ts, step LIMIT 1) f ON true
LEFT JOIN LATERAL (
    SELECT ts, step FROM {step}
    WHERE run_id = a.run_id AND attempt_id = a.id
      AND ts >= coalesce(a.started_at - interval '10 minutes', '-infinity'::timestamptz)
      AND ts <= coalesce(a.next_started_at + interval '10 minutes', 'infinity'::timestamptz)
    ORDER BY ts DESC, step DESC LIMIT 1) l ON true
ORDER BY a.number
"""


def attempt_spans(run: Run) -> list[AttemptSpan]:
    if connection.vendor == "postgresql":
        sql = _SPANS_SQL.format(attempt=Attempt._meta.db_table, step=StepMetric._meta.db_table)
        with connection.cursor() as cursor:
            cursor.execute(sql, {"run": run.pk})
            rows = cursor.fetchall()
    else:
        rows = _span_rows_portable(run)
    return [
        AttemptSpan(number=number, started_at=_epoch(started), ended_at=_epoch(ended),
                    first_step_at=_epoch(first_ts), first_step=first_step,
                    last_step_at=_epoch(last_ts), last_step=last_step)
        for number, started, ended, first_ts, first_step, last_ts, last_step in rows
    ]


def _span_rows_portable(run: Run) -> list[tuple]:
    """The rows of _SPANS_SQL for databases without LATERAL (the embedded mode's SQLite): two
    ORM lookups per attempt along the same index, with the same 10 minutes of slack."""
    rows = []
    attempts = list(Attempt.objects.filter(run=run).order_by("number"))
    for attempt, following in zip(attempts, attempts[1:] + [None], strict=True):
        steps = StepMetric.objects.filter(run=run, attempt=attempt)
        if attempt.started_at is not None:
            steps = steps.filter(ts__gte=attempt.started_at - timedelta(minutes=10))
        if following is not None and following.started_at is not None:
            steps = steps.filter(ts__lte=following.started_at + timedelta(minutes=10))
        first = steps.order_by("ts", "step").values_list("ts", "step").first() or (None, None)
        last = steps.order_by("-ts", "-step").values_list("ts", "step").first() or (None, None)
        rows.append((attempt.number, attempt.started_at, attempt.ended_at, *first, *last))
    return rows


def _as_datetime(ts: datetime | str) -> datetime:
    """A timestamp from a raw cursor: SQLite's returns the stored text (UTC, no offset)."""
    if isinstance(ts, datetime):
        return ts
    parsed = parse_datetime(ts)
    if parsed is None:
        raise ValueError(f"not a timestamp: {ts!r}")
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


# One save (or load) is reported by every rank that took part: it is merged into one fact with
# the slowest rank's blocking time (the job waits for it) and the first rank's time. Sizes are
# per path: ranks naming the same path measured the same checkpoint (a shared directory, as the
# Hugging Face integration reports) and count once; ranks naming their own shard files add up.
# Reports without a step cannot be matched across ranks; rank 0's are kept.
_CHECKPOINTS_SQL = """
SELECT number, kind, step, min(ts), max(duration_s), sum(path_bytes)
FROM (
    SELECT a.number, c.kind, c.step, c.path, min(c.ts) AS ts, max(c.duration_s) AS duration_s,
           max(c.bytes) AS path_bytes, CASE WHEN c.step IS NULL THEN min(c.id) END AS alone
    FROM {checkpoint} c JOIN {attempt} a ON a.id = c.attempt_id
    WHERE c.run_id = %(run)s AND (c.step IS NOT NULL OR c.rank = 0)
    GROUP BY a.number, c.kind, c.step, c.path, CASE WHEN c.step IS NULL THEN c.id END
) per_path
GROUP BY number, kind, step, alone
ORDER BY min(ts)
"""


def checkpoint_facts(run: Run) -> list[CheckpointFact]:
    sql = _CHECKPOINTS_SQL.format(checkpoint=Checkpoint._meta.db_table,
                                  attempt=Attempt._meta.db_table)
    with connection.cursor() as cursor:
        cursor.execute(sql, {"run": run.pk})
        rows = cursor.fetchall()
    return [
        CheckpointFact(attempt=number, kind=kind, step=step, ts=_as_datetime(ts).timestamp(),
                       duration_s=duration, bytes=int(size) if size is not None else None)
        for number, kind, step, ts, duration, size in rows
    ]


def run_interruptions(run: Run) -> list[Interruption]:
    return list(Interruption.objects.filter(run=run).select_related("attempt", "labelled_by")
                .order_by("ts", "id"))


def interruption_facts(interruptions: list[Interruption]) -> list[InterruptionFact]:
    """Facts for the analyses, with an engineer's label in place of the classifier's verdict."""
    return [
        InterruptionFact(attempt=i.attempt.number, ts=i.ts.timestamp(), source=i.source,
                         category=i.effective_category, expected=i.effective_expected, id=i.pk)
        for i in interruptions
    ]


def kept_step_times(run: Run, kept: Mapping[int, int]) -> dict[int, float | None]:
    """For each attempt number → kept step, the time of the attempt's newest step row at or
    before that step (None when it has none). Read backwards from the attempt's end, so the cost
    is the rows after the kept step: one checkpoint interval at most."""
    if not kept:
        return {}
    attempts = list(Attempt.objects.filter(run=run).order_by("number")
                    .values_list("number", "id", "started_at"))
    ids = {number: pk for number, pk, _ in attempts}
    # Bounded by the attempt's time as in _SPANS_SQL, so the walk crosses no other attempt's rows.
    starts = {number: started - timedelta(minutes=10)
              for number, _, started in attempts if started is not None}
    ends = {number: following[2] + timedelta(minutes=10)
            for (number, _, _), following in zip(attempts, attempts[1:], strict=False)
            if following[2] is not None}
    found: dict[int, float | None] = {}
    for number, step in kept.items():
        steps = StepMetric.objects.filter(run=run, attempt_id=ids.get(number), step__lte=step)
        if number in starts:
            steps = steps.filter(ts__gte=starts[number])
        if number in ends:
            steps = steps.filter(ts__lte=ends[number])
        ts = steps.order_by("-ts").values_list("ts", flat=True).first()
        found[number] = _epoch(ts)
    return found


def run_goodput(run: Run, interruptions: list[Interruption] | None = None) -> goodput.RunGoodput:
    """The run's goodput: spans, checkpoints and interruptions read here, judged by
    collectors.analysis.goodput."""
    spans = attempt_spans(run)
    checkpoints = checkpoint_facts(run)
    facts = interruption_facts(run_interruptions(run) if interruptions is None else interruptions)
    kept = goodput.kept_steps(spans, checkpoints, facts)
    return goodput.run_goodput(spans, checkpoints, facts, kept_step_times(run, kept))
