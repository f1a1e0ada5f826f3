"""Turns the plugin's `interruption` events into classified Interruption rows, with the evidence
that decided each verdict (including XID events reported on the same host shortly before)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from collectors.classification.engine import classify
from collectors.classification.rules import active_rules
from collectors.models import Attempt, Event, Interruption, Run
from collectors.timestamps import from_epoch as _when

# XIDs the sampler reported on the host this long before an interruption count as its evidence
# (an XID 79 is often logged a minute or two before the process notices the GPU is gone).
XID_WINDOW = timedelta(minutes=5)
# A few seconds after, too: the sampler and the crashing process race to report.
XID_GRACE = timedelta(seconds=10)
MAX_TEXT_CHARS = 20_000
SOURCES = {choice for choice, _ in Interruption.Source.choices}


def _text(event: dict[str, Any]) -> str:
    """Exception type and message, traceback tail and launcher stderr tail, as one log excerpt."""
    head = ": ".join(str(part) for part in (event.get("exc_type"), event.get("message")) if part)
    parts = [head, event.get("traceback"), event.get("stderr_tail")]
    text = "\n".join(str(part) for part in parts if part)
    # Keep the end: the last lines of a traceback say what went wrong.
    return text[-MAX_TEXT_CHARS:]


def _source(event: dict[str, Any]) -> str:
    source = event.get("source")
    if source in SOURCES:
        return source
    if event.get("signal"):
        return Interruption.Source.SIGNAL
    if event.get("stderr_tail"):
        return Interruption.Source.LAUNCHER
    return Interruption.Source.EXCEPTION


def _xids_near(run: Run, host: str, when: datetime) -> list[int]:
    codes: list[int] = []
    payloads = Event.objects.filter(
        run=run, host=host, kind="xid", ts__gte=when - XID_WINDOW, ts__lte=when + XID_GRACE,
    ).order_by("ts").values_list("payload", flat=True)
    for payload in payloads:
        code = payload.get("xid") if isinstance(payload, dict) else None
        if isinstance(code, int) and not isinstance(code, bool) and code not in codes:
            codes.append(code)
    return codes


def evidence_for(run: Run, host: str, event: dict[str, Any]) -> dict[str, Any]:
    """The classifier's evidence for one wire `interruption` event; unknown keys are ignored."""
    when = _when(event["ts"])
    evidence: dict[str, Any] = {
        "text": _text(event),
        "exc_type": event.get("exc_type") or "",
        "exit_code": event.get("exit_code"),
        "signal": event.get("signal"),
        "xids": _xids_near(run, host, when),
        "ecc_dbe": event.get("ecc_dbe"),
        "heartbeat_lost": event.get("heartbeat_lost"),
        "source": _source(event),
    }
    return {key: value for key, value in evidence.items() if value not in (None, "", [])}


def _apply(interruption: Interruption, evidence: dict[str, Any], rules) -> None:
    verdict = classify(evidence, rules=rules)
    interruption.category = verdict.category
    interruption.expected = verdict.expected
    interruption.confidence = verdict.confidence
    interruption.rule = verdict.rule
    interruption.evidence = {**evidence, "matched": verdict.matched}


def record_interruptions(run: Run, attempt: Attempt, rank: int, host: str,
                         events: list[dict[str, Any]]) -> list[Interruption]:
    """Creates a classified Interruption for each `interruption` event of a stored batch.

    Called by ingest inside the batch's transaction, after the events are written, so the XID
    events of the same batch are already visible to the evidence query."""
    wanted = [event for event in events if event.get("kind") == "interruption"]
    if not wanted:
        return []
    rules = active_rules()
    created = []
    for event in wanted:
        when = _when(event["ts"])
        evidence = evidence_for(run, host, event)
        row = Interruption(
            run=run, attempt=attempt, ts=when, rank=rank, host=host, source=evidence["source"],
            event=Event.objects.filter(run=run, attempt=attempt, rank=rank, kind="interruption",
                                       ts=when, interruption__isnull=True).first(),
        )
        _apply(row, evidence, rules)
        row.save()
        created.append(row)
    return created


def reclassify(interruption: Interruption, rules=None) -> Interruption:
    """Classifies an interruption again from its stored evidence (after the rules changed).
    An engineer's label is left as it is: it still wins wherever the interruption is counted."""
    evidence = {key: value for key, value in (interruption.evidence or {}).items() if key != "matched"}
    _apply(interruption, evidence, rules if rules is not None else active_rules())
    interruption.save(update_fields=["category", "expected", "confidence", "rule", "evidence"])
    return interruption
