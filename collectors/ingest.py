"""Authenticates and stores one validated batch: the part of ingest shared by the HTTP API and the
broker path. The batch id is claimed first, in the same transaction as the rows, so a batch that
is delivered again (a retry, a redelivery after a killed worker) writes nothing the second time."""

from __future__ import annotations

import logging
import reprlib
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import numpy as np
from django.db import connection, transaction
from django.db.models import BooleanField, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Coalesce, Greatest, Least
from django.utils import timezone as django_tz

from collectors import bulk_write, columns, partitions, rollups
from collectors.interruptions import record_interruptions
from collectors.models import (
    Attempt,
    Checkpoint,
    Event,
    GpuSample,
    IngestedBatch,
    IngestToken,
    Project,
    RejectedBatch,
    Run,
    StepMetric,
    hash_token,
)
from collectors.timestamps import from_epoch as _when

log = logging.getLogger(__name__)

# Scalars with a column of their own; every other metric goes to StepMetric.extra.
COLUMN_METRICS = ("loss", "lr", "grad_norm")
TOKEN_TOUCH_INTERVAL = timedelta(minutes=1)


class Refused(Exception):
    """The batch is well-formed but may not be written (bad token, wrong project)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class StoreResult:
    stored: bool
    run_id: int
    steps: int = 0
    gpu_samples: int = 0
    events: int = 0


def authorize(token: str | None, project_slug: str) -> IngestToken:
    """The token, if it may write into ``project_slug``; raises Refused otherwise."""
    if not token:
        raise Refused(
            "missing ingest token: send 'Authorization: Bearer <token>' "
            "(create one with `python manage.py createtoken PROJECT`)",
            401,
        )
    now = django_tz.now()
    known = _known_token(token, now)
    if known is not None:
        found, slug, touch = known
    else:
        found = IngestToken.objects.authenticate(token)
        if found is None:
            raise Refused("the ingest token is not valid or has been revoked", 401)
        if len(_token_ids) >= _TOKEN_IDS_MAX:
            _token_ids.clear()
        _token_ids[found.hashed] = found.pk
        slug = found.project.slug
        touch = found.last_used_at is None or now - found.last_used_at > TOKEN_TOUCH_INTERVAL
    if slug != project_slug:
        raise Refused(
            f"this token belongs to project '{slug}'; it cannot write into project "
            f"'{project_slug}'",
            403,
        )
    if touch:
        IngestToken.objects.filter(pk=found.pk).update(last_used_at=now)
    return found


# Token hash -> the row it was found in, per worker process, so that a token already seen is
# checked by one primary-key query instead of the ORM lookup (a tenth of a batch's CPU). Only the
# row is remembered: that it is not revoked, and its project, are read again for every batch.
_token_ids: dict[str, int] = {}
_TOKEN_IDS_MAX = 10_000


def _known_token(token: str, now: datetime) -> tuple[IngestToken, str, bool] | None:
    """(token, its project's slug, whether last_used_at is due) for a token this process has
    authenticated before and that is still live; None otherwise (authenticate it afresh)."""
    digest = hash_token(token)
    token_id = _token_ids.get(digest)
    if token_id is None:
        return None
    quote = connection.ops.quote_name
    tokens, projects = IngestToken._meta.db_table, Project._meta.db_table
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT t.project_id, p.slug, (t.last_used_at IS NULL OR t.last_used_at < %s) "
            f"FROM {quote(tokens)} t JOIN {quote(projects)} p ON p.id = t.project_id "
            f"WHERE t.id = %s AND t.hashed = %s AND t.revoked_at IS NULL",
            [connection.ops.adapt_datetimefield_value(now - TOKEN_TOUCH_INTERVAL), token_id,
             digest],
        )
        row = cursor.fetchone()
    if row is None:
        _token_ids.pop(digest, None)  # pop: threads of one worker may race here
        return None
    project_id, slug, touch = row
    return IngestToken(pk=token_id, project_id=project_id, hashed=digest), slug, bool(touch)


# Depth and size bounded: a refused batch may be nested thousands deep or megabytes long.
_EXCERPT = reprlib.Repr()
_EXCERPT.maxlevel, _EXCERPT.maxdict, _EXCERPT.maxlist = 6, 12, 12
_EXCERPT.maxstring = _EXCERPT.maxother = 200


def _storable(text: Any, limit: int) -> str:
    """Text PostgreSQL accepts whatever the sender put in it: NUL and lone surrogates escaped."""
    text = text if isinstance(text, str) else _EXCERPT.repr(text)
    text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text.replace("\x00", "\\x00")[:limit]


def record_rejection(batch: Any, reason: str, field: str | None = None) -> None:
    """Keeps a refused batch's id and reason where an admin can see them."""
    batch_id = project = ""
    if isinstance(batch, dict):
        batch_id = _storable(batch.get("batch_id", ""), 64)
        run = batch.get("run")
        if isinstance(run, dict):
            project = _storable(run.get("project", ""), 100)
    RejectedBatch.objects.create(
        batch_id=batch_id, project=project, reason=_storable(reason, 2000),
        field=_storable(field or "", 200), excerpt=_storable(_EXCERPT.repr(batch), 1000),
    )


def _step_table(steps: dict[str, Any], run_id: int, attempt_id: int,
                rank: int) -> tuple[bulk_write.Table, rollups.StepRows]:
    length = len(steps["step"])
    metrics: dict[str, list] = steps["metrics"]
    ts = columns.epoch_micros(steps["ts"])
    step = np.asarray(steps["step"], dtype=np.int64)
    duration = columns.floats(steps["duration_s"], length)
    tokens = columns.ints(steps["tokens"], length)
    table = bulk_write.Table(bulk_write.STEP_COLUMNS, {
        "run_id": run_id, "attempt_id": attempt_id, "rank": rank, "step": step, "ts": ts,
        "duration_s": duration, "tokens": tokens,
        # An absent series is one constant null, not a column of them.
        **{name: columns.floats(metrics[name], length) if name in metrics else None
           for name in COLUMN_METRICS},
        "extra": _extra(metrics, length),
    }, length)
    loss = columns.floats(metrics.get("loss"), length)
    return table, rollups.StepRows(run_id, rank, ts, step, duration, tokens, loss)


_JSON_NUMBER_TYPES = frozenset({float, int})


def _extra(metrics: dict[str, list], length: int) -> dict | list:
    """StepMetric.extra per row: the series without a column of their own, nulls left out."""
    names = [name for name in metrics if name not in COLUMN_METRICS]
    if not names:
        return {}
    series = [metrics[name] for name in names]
    rows = zip(*series, strict=True)
    if all(set(map(type, values)) <= _JSON_NUMBER_TYPES for values in series):
        # Validated metric names are plain identifiers, and a finite int's or float's repr is its
        # JSON: one string format per row instead of a dict and json.dumps. (Nulls, or a float
        # subclass whose repr is not JSON, take the general path.)
        template = "{" + ", ".join(f'"{name}": %r' for name in names) + "}"
        return bulk_write.JsonTexts(template % row for row in rows)
    return [{name: value for name, value in zip(names, row, strict=True) if value is not None}
            for row in rows]


def _gpu_table(gpus: dict[str, Any], run_id: int, attempt_id: int,
               host: str) -> tuple[bulk_write.Table, rollups.GpuRows]:
    length = len(gpus["ts"])
    ts = columns.epoch_micros(gpus["ts"])
    gpu = np.asarray(gpus["gpu"], dtype=np.int64)
    measured = {name: columns.floats(gpus[name], length)
                for name in ("temp_c", "power_w", "util_pct", "mem_used_mb", "sm_clock_mhz")}
    throttle = columns.ints(gpus["throttle"], length)
    table = bulk_write.Table(bulk_write.GPU_COLUMNS, {
        "run_id": run_id, "attempt_id": attempt_id, "host": host, "gpu": gpu, "ts": ts,
        **measured, "throttle": throttle, "simulated": gpus["simulated"],
    }, length)
    return table, rollups.GpuRows(run_id, host, ts, gpu, measured["temp_c"], measured["power_w"],
                                  measured["util_pct"], measured["sm_clock_mhz"], throttle)


def _event_table(events: list[dict[str, Any]], run_id: int, attempt_id: int, rank: int,
                 host: str) -> bulk_write.Table:
    return bulk_write.Table(bulk_write.EVENT_COLUMNS, {
        "run_id": run_id, "attempt_id": attempt_id, "rank": rank, "host": host,
        "kind": [event["kind"] for event in events],
        "ts": columns.epoch_micros([event["ts"] for event in events]),
        "payload": [{k: v for k, v in event.items() if k not in ("kind", "ts")}
                    for event in events],
    }, len(events))


def _checkpoints(batch, run_id: int, attempt_id: int, rank: int) -> list[Checkpoint]:
    def number(value):
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None

    found = []
    for event in batch["events"]:
        if event["kind"] not in ("checkpoint_save", "checkpoint_load"):
            continue
        step = number(event.get("step"))
        size = number(event.get("bytes"))
        found.append(Checkpoint(
            run_id=run_id, attempt_id=attempt_id, rank=rank,
            kind=Checkpoint.Kind.SAVE if event["kind"] == "checkpoint_save" else Checkpoint.Kind.LOAD,
            step=int(step) if step is not None else None,
            ts=_when(event["ts"]),
            duration_s=number(event.get("duration_s")),
            bytes=int(size) if size is not None else None,
            path=str(event.get("path", ""))[:4096],
        ))
    return found


def _update_run_and_attempt(batches: list[dict[str, Any]], place: Placement) -> None:
    """Folds what the batches (all of one run attempt) say about progress and status into the run
    and attempt rows, with single UPDATEs (GREATEST/LEAST of stored and new) so concurrent
    batches of other ranks never overwrite each other's progress.

    Only what the batches move is written, and nothing when they move nothing: an UPDATE locks
    the run's row until the transaction commits, so every batch updating it would make the
    workers storing one run take turns. Skipping is safe because the merges only ever move one
    way: a value read in this transaction that already covers the batches stays covering it."""
    times = [t for batch in batches for t in (
        min(batch["steps"]["ts"], default=None), max(batch["steps"]["ts"], default=None),
        min(batch["gpus"]["ts"], default=None), max(batch["gpus"]["ts"], default=None),
        *(event["ts"] for event in batch["events"])) if t is not None]
    changes: dict[str, Any] = {}
    world_size = max(batch["source"]["world_size"] for batch in batches)
    if world_size > place.world_size:
        changes["world_size"] = Greatest(F("world_size"), Value(world_size))
    if times:
        latest, earliest = _when(max(times)), _when(min(times))
        if place.last_seen_at is None or latest > place.last_seen_at:
            changes["last_seen_at"] = Greatest(Coalesce(F("last_seen_at"), Value(latest)),
                                               Value(latest))
        if place.first_seen_at is None or earliest < place.first_seen_at:
            changes["first_seen_at"] = Least(Coalesce(F("first_seen_at"), Value(earliest)),
                                             Value(earliest))
    last = max((max(batch["steps"]["step"]) for batch in batches if batch["steps"]["step"]),
               default=None)
    if last is not None and (place.last_step is None or last > place.last_step):
        changes["last_step"] = Greatest(Coalesce(F("last_step"), Value(last)), Value(last))
    if changes:
        Run.objects.filter(pk=place.run_id).update(**changes)

    started = [t for batch in batches for t in
               ([e["ts"] for e in batch["events"] if e["kind"] == "start"]
                or batch["steps"]["ts"][:1])]
    if started and (place.started_at is None or place.started_at > _when(min(started))):
        Attempt.objects.filter(pk=place.attempt_id).update(
            started_at=Least(Coalesce(F("started_at"), Value(_when(min(started)))),
                             Value(_when(min(started))))
        )
    status = [(event, batch["source"]["rank"]) for batch in batches for event in batch["events"]
              if event["kind"] in ("start", "interruption", "finish")]
    if status:
        _apply_status_events(status, place)


def _apply_status_events(events: list[tuple[dict[str, Any], int]], place: Placement) -> None:
    """Applies start, interruption and finish events (each with the rank that sent it) in time
    order to the run's and the attempt's status."""
    run = Run.objects.filter(pk=place.run_id)
    attempt = Attempt.objects.filter(pk=place.attempt_id)
    # A start of the newest attempt means the run is going again, whatever it said before.
    newest = Attempt.objects.filter(run_id=place.run_id).order_by("-number").values_list(
        "number", flat=True)[0]
    is_newest = place.attempt_number >= newest
    for event, rank in sorted(events, key=lambda pair: pair[0]["ts"]):
        kind = event["kind"]
        if kind == "start" and is_newest:
            run.update(status=Run.Status.RUNNING)
        elif kind == "interruption":
            reason = str(event.get("exc_type") or event.get("reason") or "interruption")[:200]
            attempt.update(ended_at=_when(event["ts"]), exit_reason=reason)
            if is_newest:
                run.update(status=Run.Status.INTERRUPTED)
        elif kind == "finish":
            failed = event.get("status") not in (None, "finished", "ok", "success")
            # Every rank finishes; rank 0 speaks for a clean end, any rank for a failure.
            if not failed and rank != 0:
                continue
            attempt.update(ended_at=_when(event["ts"]),
                           exit_reason=str(event.get("status") or "finished")[:200])
            if is_newest:
                run.update(status=Run.Status.FAILED if failed else Run.Status.FINISHED)


def _evaluate_alerts(run_id: int) -> None:
    """Event alert rules, after the batch is committed; never a reason to fail the batch."""
    try:
        from collectors.alerts.tasks import evaluate_run_events

        evaluate_run_events.delay(run_id)
    except Exception:
        log.exception("could not evaluate alert rules for run %s", run_id)


@dataclass(frozen=True)
class Placement:
    """The run and attempt a batch belongs to, and what the database holds of their progress, as
    read in the batch's transaction: updates that would change nothing are skipped."""

    run_id: int
    attempt_id: int
    attempt_number: int
    started_at: datetime | None
    has_config: bool
    world_size: int
    first_seen_at: datetime | None
    last_seen_at: datetime | None
    last_step: int | None


# (project id, run name, attempt number) -> (run id, attempt id), per worker process: saves the two
# get_or_create queries every batch would otherwise make. An entry is only a hint: _place checks
# it against the database in one primary-key query, in the batch's transaction, and falls back to
# get_or_create when the rows are gone (a deleted run, a test's rolled-back transaction).
_placements: dict[tuple[int, str, int], tuple[int, int]] = {}
_PLACEMENTS_MAX = 10_000
_PROGRESS = ("run__world_size", "run__first_seen_at", "run__last_seen_at", "run__last_step")


def _place_and_claim(project_id: int, batches: list[dict[str, Any]]) -> tuple[Placement, set[str]]:
    """The run and attempt of ``batches`` (all of one project, run and attempt; created if new),
    and the ids of the batches this delivery claimed (the others were stored before)."""
    run_info, source = batches[0]["run"], batches[0]["source"]
    key = (project_id, run_info["name"], run_info["attempt"])
    cached = _placements.get(key)
    if cached is not None:
        if connection.vendor == "postgresql":
            found = _check_and_claim(key, cached, batches)
            if found is not None:
                return found
        else:
            place = _check(key, cached)
            if place is not None:
                return place, _claim(batches, place.run_id)
        _placements.pop(key, None)
    run, _ = Run.objects.get_or_create(
        project_id=project_id, name=run_info["name"],
        defaults={"config": run_info.get("config") or {}, "world_size": source["world_size"]},
    )
    attempt, _ = Attempt.objects.get_or_create(run=run, number=run_info["attempt"])
    if len(_placements) >= _PLACEMENTS_MAX:
        _placements.clear()
    _placements[key] = (run.pk, attempt.pk)
    place = Placement(run.pk, attempt.pk, attempt.number, attempt.started_at, bool(run.config),
                      run.world_size, run.first_seen_at, run.last_seen_at, run.last_step)
    return place, _claim(batches, run.pk)


def _check(key: tuple[int, str, int], cached: tuple[int, int]) -> Placement | None:
    """The cached placement, if its rows still exist as cached (one primary-key query)."""
    found = (
        Attempt.objects.filter(pk=cached[1], run_id=cached[0], number=key[2],
                               run__project_id=key[0], run__name=key[1])
        .annotate(has_config=ExpressionWrapper(~Q(run__config={}), BooleanField()))
        .values_list("started_at", "has_config", *_PROGRESS).first()
    )
    return Placement(cached[0], cached[1], key[2], *found) if found is not None else None


# The claimed batches' rows travel as one array per column (unnest), so the statement's text and
# parameters are a dozen whatever the number of batches: a VALUES list with a typed placeholder per
# field cost more Python to build and PostgreSQL to parse than the insert itself.
_PG_CLAIM = f"""
INSERT INTO {IngestedBatch._meta.db_table}
    (batch_id, run_id, rank, host, local_rank, received_at, steps, gpu_samples, events)
SELECT v.batch_id, %(run)s, v.rank, v.host, v.local_rank, %(received_at)s, v.steps, v.gpu_samples,
       v.events
FROM unnest(%(batch_ids)s::uuid[], %(ranks)s::int8[], %(hosts)s::text[], %(local_ranks)s::int8[],
            %(steps)s::int8[], %(gpu_samples)s::int8[], %(events)s::int8[])
     AS v(batch_id, rank, host, local_rank, steps, gpu_samples, events)
{{where}}
ON CONFLICT (batch_id) DO NOTHING RETURNING batch_id
"""
_PG_CHECK_AND_CLAIM = f"""
WITH place AS (
    SELECT a.started_at, r.config <> '{{}}'::jsonb, r.world_size, r.first_seen_at,
           r.last_seen_at, r.last_step
    FROM {Attempt._meta.db_table} a JOIN {Run._meta.db_table} r ON r.id = a.run_id
    WHERE a.id = %(attempt)s AND r.id = %(run)s AND a.number = %(number)s
      AND r.project_id = %(project)s AND r.name = %(name)s
), claimed AS ({_PG_CLAIM.format(where="WHERE EXISTS (SELECT FROM place)")})
SELECT place.*, ARRAY(SELECT batch_id::text FROM claimed) FROM place
"""


def _check_and_claim(key: tuple[int, str, int], cached: tuple[int, int],
                     batches: list[dict[str, Any]]) -> tuple[Placement, set[str]] | None:
    """_check and _claim in one statement (PostgreSQL): the steady state of a run's batches costs
    one round trip before the rows. None when the cached rows are gone (nothing claimed then)."""
    params = {**_claim_arrays(batches, cached[0]), "attempt": cached[1], "number": key[2],
              "project": key[0], "name": key[1]}
    with connection.cursor() as cursor:
        cursor.execute(_PG_CHECK_AND_CLAIM, params)
        found = cursor.fetchone()
    if found is None:
        return None
    *progress, claimed = found
    return Placement(cached[0], cached[1], key[2], *progress), set(claimed)


def _claim_arrays(batches: list[dict[str, Any]], run_id: int) -> dict[str, Any]:
    """_PG_CLAIM's parameters: the batches' IngestedBatch fields, one list per column."""
    sources = [batch["source"] for batch in batches]
    return {
        "run": run_id, "received_at": django_tz.now(),
        "batch_ids": [str(batch["batch_id"]) for batch in batches],
        "ranks": [source["rank"] for source in sources],
        "hosts": [source["host"] for source in sources],
        "local_ranks": [source.get("local_rank") for source in sources],
        "steps": [len(batch["steps"]["step"]) for batch in batches],
        "gpu_samples": [len(batch["gpus"]["ts"]) for batch in batches],
        "events": [len(batch["events"]) for batch in batches],
    }


def _claim_rows(batches: list[dict[str, Any]], run_id: int) -> tuple[list[str], str, list[Any]]:
    """IngestedBatch's columns, a VALUES list with a placeholder per field, and the batches'
    values for them (databases other than PostgreSQL, which takes _PG_CLAIM)."""
    fields = IngestedBatch._meta.concrete_fields
    row = "(" + ", ".join(["%s"] * len(fields)) + ")"
    # The row's values without a model instance per batch: Model.__init__, reading the clock for
    # received_at's default, was over a third of the claim's CPU. The defaults are taken once.
    defaults = {field.attname: field.get_default() for field in fields}
    params = []
    for batch in batches:
        source = batch["source"]
        values = {**defaults, "batch_id": batch["batch_id"], "run_id": run_id,
                  "rank": source["rank"], "host": source["host"],
                  "local_rank": source.get("local_rank"), "steps": len(batch["steps"]["step"]),
                  "gpu_samples": len(batch["gpus"]["ts"]), "events": len(batch["events"])}
        params += [field.get_db_prep_save(values[field.attname], connection) for field in fields]
    return ([connection.ops.quote_name(field.column) for field in fields],
            ", ".join([row] * len(batches)), params)


def _claim(batches: list[dict[str, Any]], run_id: int) -> set[str]:
    """Records the batch ids; returns those that were not there yet (the rest are redeliveries).
    One INSERT ... ON CONFLICT DO NOTHING rather than a savepoint around each create."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_PG_CLAIM.format(where=""), _claim_arrays(batches, run_id))
            return {str(found) for (found,) in cursor.fetchall()}
    columns, rows, params = _claim_rows(batches, run_id)
    quote = connection.ops.quote_name
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {quote(IngestedBatch._meta.db_table)} ({', '.join(columns)}) "
            f"VALUES {rows} "
            f"ON CONFLICT ({quote('batch_id')}) DO NOTHING RETURNING {quote('batch_id')}",
            params,
        )
        return {str(uuid.UUID(str(found))) for (found,) in cursor.fetchall()}


def store_batch(batch: dict[str, Any], project_id: int) -> StoreResult:
    """Writes a validated batch for ``project_id`` in one transaction, once per batch id, with the
    rollups of its rows (collectors.rollups)."""
    return store_batches([(batch, project_id)])[0]


def store_batches(items: list[tuple[dict[str, Any], int]]) -> list[StoreResult]:
    """Writes validated batches, each with the id of the project it was authorized for, in one
    transaction, each once per batch id (a redelivered one writes nothing), with the rollups of
    their rows. One COPY per table and one rollup statement for all of them: what a statement
    costs whatever its size is paid once for the lot (bench/README.md, "End-to-end ingest").
    Returns one result per item, in order."""
    for batch, _ in items:
        partitions.ensure_for_batch(batch)  # the days a batch touches; a no-op once they exist
    results: list[StoreResult | None] = [None] * len(items)
    by_attempt: dict[tuple[int, str, int], list[int]] = {}
    for i, (batch, project_id) in enumerate(items):
        by_attempt.setdefault((project_id, batch["run"]["name"], batch["run"]["attempt"]),
                              []).append(i)
    with transaction.atomic():
        stored: list[tuple[int, Placement]] = []
        for indexes in by_attempt.values():
            # The same batch twice in one delivery (a redelivery beside its original): once.
            first = {}
            for i in indexes:
                first.setdefault(str(uuid.UUID(str(items[i][0]["batch_id"]))), i)
            unique = list(first.values())
            place, claimed = _place_and_claim(items[unique[0]][1], [items[i][0] for i in unique])
            for i in indexes:
                batch_id = str(uuid.UUID(str(items[i][0]["batch_id"])))
                if batch_id in claimed and first[batch_id] == i:
                    stored.append((i, place))
                else:
                    log.info("batch %s was already stored; skipping the redelivery", batch_id)
                    results[i] = StoreResult(stored=False, run_id=place.run_id)
        if stored:
            _write_rows([(items[i][0], place) for i, place in stored])
        for i, place in stored:
            batch = items[i][0]
            results[i] = StoreResult(stored=True, run_id=place.run_id,
                                     steps=len(batch["steps"]["step"]),
                                     gpu_samples=len(batch["gpus"]["ts"]),
                                     events=len(batch["events"]))
    return results


def _write_rows(stored: list[tuple[dict[str, Any], Placement]]) -> None:
    """The claimed batches' rows, rollups, checkpoints and interruptions, and what they say of
    their run's progress and status (in the caller's transaction)."""
    step_tables, gpu_tables, event_tables, checkpoints = [], [], [], []
    step_rows, gpu_rows = [], []
    for batch, place in stored:
        rank, host = batch["source"]["rank"], batch["source"]["host"]
        step_table, steps = _step_table(batch["steps"], place.run_id, place.attempt_id, rank)
        gpu_table, gpus = _gpu_table(batch["gpus"], place.run_id, place.attempt_id, host)
        step_tables.append(step_table)
        gpu_tables.append(gpu_table)
        step_rows.append(steps)
        gpu_rows.append(gpus)
        event_tables.append(_event_table(batch["events"], place.run_id, place.attempt_id, rank,
                                         host))
        checkpoints += _checkpoints(batch, place.run_id, place.attempt_id, rank)
    bulk_write.write_many(StepMetric, step_tables)
    bulk_write.write_many(GpuSample, gpu_tables)
    bulk_write.write_many(Event, event_tables)
    rollups.add(step_rows, gpu_rows)
    if checkpoints:
        Checkpoint.objects.bulk_create(checkpoints)

    by_place: dict[int, tuple[Placement, list[dict[str, Any]]]] = {}
    for batch, place in stored:
        by_place.setdefault(place.attempt_id, (place, []))[1].append(batch)
        events = batch["events"]
        if any(event["kind"] == "interruption" for event in events):
            # After the events are written: an interruption's evidence includes this batch's XIDs.
            run_id = place.run_id
            record_interruptions(Run.objects.get(pk=run_id),
                                 Attempt.objects.get(pk=place.attempt_id),
                                 batch["source"]["rank"], batch["source"]["host"], events)
            transaction.on_commit(lambda run_id=run_id: _evaluate_alerts(run_id))
    for place, batches in by_place.values():
        config = next((batch["run"]["config"] for batch in batches if batch["run"].get("config")),
                      None)
        if config and not place.has_config:
            # Only while the run has none: the first batch that carries one sets it.
            Run.objects.filter(pk=place.run_id, config={}).update(config=config)
        _update_run_and_attempt(batches, place)
