"""What the plugin sent against what PostgreSQL holds, table by table: stored, lost, duplicated.

"Sent" comes from the training side (each rank's own record of the steps, GPU samples and events
it handed the plugin); "stored" is counted with plain SQL on the database the workers wrote, so
the check depends on neither the ORM nor the collectors' own bookkeeping. A duplicate is a row
whose natural key appears more than once: (rank, step) for steps, (host, gpu, ts) for GPU
samples, (rank, kind, ts) for events."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import psycopg


@dataclass(frozen=True)
class Tally:
    table: str
    sent: int
    stored: int
    duplicated: int

    @property
    def lost(self) -> int:
        return max(self.sent - (self.stored - self.duplicated), 0)

    @property
    def exact(self) -> bool:
        return self.stored == self.sent and self.duplicated == 0

    def __str__(self) -> str:
        return (f"{self.table}: sent {self.sent}, stored {self.stored}, lost {self.lost}, "
                f"duplicated {self.duplicated}")


@dataclass(frozen=True)
class Count:
    tallies: list[Tally]
    batches: int
    # The rows each stored batch claims (IngestedBatch), summed: equal to the tables' rows when
    # every batch was written once and whole.
    batch_rows: dict[str, int]
    notes: list[str]

    def total(self) -> Tally:
        return Tally("rows", sum(t.sent for t in self.tallies),
                     sum(t.stored for t in self.tallies),
                     sum(t.duplicated for t in self.tallies))

    def summary(self) -> str:
        return "; ".join(str(t) for t in self.tallies)

    def assert_exactly_once(self) -> None:
        problems = [str(t) for t in self.tallies if not t.exact]
        for tally in self.tallies:
            if self.batch_rows[tally.table] != tally.stored:
                problems.append(f"{tally.table}: the stored batches claim "
                                f"{self.batch_rows[tally.table]} rows, the table holds "
                                f"{tally.stored}")
        problems += self.notes
        assert not problems, "; ".join(problems)


def read_records(record_dir: Path, ranks: int) -> list[dict]:
    records = [json.loads((record_dir / f"rank{rank}.json").read_text()) for rank in range(ranks)]
    return records


def count(database_url: str, run_name: str, records: list[dict]) -> Count:
    """Compares ``records`` (one per rank, from fault_training.py or the load driver) with what
    ``database_url`` holds for ``run_name``."""
    notes: list[str] = []
    with psycopg.connect(database_url, autocommit=True) as conn:
        row = conn.execute("SELECT id FROM collectors_run WHERE name = %s", [run_name]).fetchone()
        assert row is not None, f"run {run_name!r} was never stored"
        run_id = row[0]

        def one(sql: str) -> tuple:
            return conn.execute(sql, {"run": run_id}).fetchone()

        steps = one("SELECT count(*), count(DISTINCT (rank, step)) FROM collectors_stepmetric "
                    "WHERE run_id = %(run)s")
        gpus = one("SELECT count(*), count(DISTINCT (host, gpu, ts)) FROM collectors_gpusample "
                   "WHERE run_id = %(run)s")
        events = one("SELECT count(*), count(DISTINCT (rank, kind, ts)) FROM collectors_event "
                     "WHERE run_id = %(run)s")
        batches = one("SELECT count(*), coalesce(sum(steps), 0), coalesce(sum(gpu_samples), 0), "
                      "coalesce(sum(events), 0) FROM collectors_ingestedbatch "
                      "WHERE run_id = %(run)s")
        # Every rank's steps are exactly 0..n-1: no gap hides behind a matching total.
        per_rank = dict(conn.execute(
            "SELECT rank, count(DISTINCT step) FILTER (WHERE step < %(n)s) FROM "
            "collectors_stepmetric WHERE run_id = %(run)s GROUP BY rank",
            {"run": run_id, "n": max(r["steps"] for r in records)}).fetchall())
        kinds = dict(conn.execute(
            "SELECT kind, count(*) FROM collectors_event WHERE run_id = %(run)s GROUP BY kind",
            {"run": run_id}).fetchall())
    for record in records:
        if per_rank.get(record["rank"], 0) != record["steps"]:
            notes.append(f"rank {record['rank']}: steps 0..{record['steps'] - 1} sent, "
                         f"{per_rank.get(record['rank'], 0)} of them stored")
    ranks = len(records)
    for kind, expected in (("start", ranks), ("finish", ranks),
                           ("checkpoint_save", sum(r.get("checkpoints", 0) for r in records))):
        if kinds.get(kind, 0) != expected:
            notes.append(f"{kinds.get(kind, 0)} {kind} events stored, {expected} sent")
    tallies = [
        Tally("steps", sum(r["steps"] for r in records), steps[0], steps[0] - steps[1]),
        Tally("gpu_samples", sum(r["gpu_rows"] for r in records), gpus[0], gpus[0] - gpus[1]),
        Tally("events", sum(r["events"] for r in records), events[0], events[0] - events[1]),
    ]
    return Count(tallies, batches[0], {"steps": batches[1], "gpu_samples": batches[2],
                                       "events": batches[3]}, notes)
