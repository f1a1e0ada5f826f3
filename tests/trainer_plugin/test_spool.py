"""The spool on its own, and the sender using it: order, atomic files, the size bound that never
drops events, replay by the next process, 413 splitting and bounded memory through an outage."""

from __future__ import annotations

import os
import time

from trainer_plugin import Monitor
from trainer_plugin.protocol import make_batch, validate_batch
from trainer_plugin.spool import Spool, directory_for, encode, parse_name, split_events

RUN = {"project": "llm", "name": "r", "attempt": 0, "config": {}}
SOURCE = {"host": "h", "rank": 0, "local_rank": 0, "world_size": 1}


def step_batch(first: int, n: int = 10, events: list | None = None) -> dict:
    steps = {"step": list(range(first, first + n)), "ts": [1.7e9 + i for i in range(n)],
             "duration_s": [0.1] * n, "tokens": [1] * n, "metrics": {"loss": [1.0] * n}}
    return make_batch(run=RUN, source=SOURCE, steps=steps, events=events or [])


def event_batch(kind: str = "interruption") -> dict:
    return make_batch(run=RUN, source=SOURCE, events=[{"kind": kind, "ts": 1.7e9}])


def test_files_sort_in_the_order_batches_were_made_not_written(tmp_path) -> None:
    spool = Spool(tmp_path)
    first, second = spool.next_ns(), spool.next_ns()
    spool.write(step_batch(10), created_ns=second)
    spool.write(step_batch(0), created_ns=first)  # made first, written late
    names = spool.names()
    assert [spool.load(name)["steps"]["step"][0] for name in names] == [0, 10]
    assert sorted(os.listdir(tmp_path)) == names
    assert spool.rows == 20


def test_a_written_batch_is_whole_and_valid_and_leaves_no_temporary_file(tmp_path) -> None:
    spool = Spool(tmp_path)
    batch = step_batch(0, events=[{"kind": "checkpoint_save", "ts": 1.7e9, "step": 3}])
    name = spool.write(batch)
    assert os.listdir(tmp_path) == [name]
    info = parse_name(name)
    assert info is not None and info.rows == 11 and info.has_events
    loaded = spool.load(name)
    assert loaded == batch
    validate_batch(loaded)


def test_half_written_temporary_files_are_ignored_and_corrupt_files_set_aside(tmp_path) -> None:
    (tmp_path / ".00000000000000000001-1-0-5-d.json.gz.tmp").write_bytes(b"\x1f\x8b half")
    Spool(tmp_path).write(step_batch(0))
    corrupt = "00000000000000000002-1-0-5-d.json.gz"
    (tmp_path / corrupt).write_bytes(b"not gzip")
    spool = Spool(tmp_path)  # a new process scans the directory
    assert len(spool) == 2  # the temporary file is not a batch
    assert spool.load(spool.oldest()) is None  # the corrupt one sorts first and is set aside
    assert (tmp_path / (corrupt + ".corrupt")).exists()
    assert spool.load(spool.oldest())["steps"]["step"][0] == 0


def test_over_the_bound_the_oldest_step_batches_go_first_and_events_never(tmp_path) -> None:
    # Room for one step batch, not for a step batch and an event batch.
    spool = Spool(tmp_path, max_bytes=len(encode(step_batch(0))) + 50)
    assert spool.write(step_batch(0)) is not None
    assert spool.write(event_batch()) is not None  # the step batch makes room for it
    assert spool.write(step_batch(10)) is None  # no older step batch left to make room with
    assert spool.write(event_batch("checkpoint_save")) is not None  # over the bound: kept anyway
    kept = [spool.load(name) for name in spool.names()]
    assert [batch["events"][0]["kind"] for batch in kept] == ["interruption", "checkpoint_save"]
    assert spool.batches_deleted == 1 and spool.rows_deleted == 10


def test_the_bound_keeps_the_newest_step_batches(tmp_path) -> None:
    size = len(encode(step_batch(0, n=100)))
    spool = Spool(tmp_path / "s", max_bytes=int(size * 3.5))
    for first in range(0, 1000, 100):
        spool.write(step_batch(first, n=100))
    kept = [spool.load(name)["steps"]["step"][0] for name in spool.names()]
    assert kept == [700, 800, 900]
    assert spool.size_bytes <= spool.max_bytes
    assert spool.rows_deleted == 700


def test_a_batch_with_events_and_rows_is_split_so_the_events_survive_alone() -> None:
    batch = step_batch(0, events=[{"kind": "interruption", "ts": 1.7e9}])
    events, data = split_events(batch)
    assert events["events"] == batch["events"] and not events["steps"]["step"]
    assert data["steps"] == batch["steps"] and not data["events"]
    assert len({batch["batch_id"], events["batch_id"], data["batch_id"]}) == 3


def test_directories_are_per_rank_and_safe(tmp_path) -> None:
    assert directory_for(tmp_path, "llm", "a/b c", 3) == tmp_path / "llm" / "a_b_c" / "rank-3"


def make_monitor(url: str, **kwargs) -> Monitor:
    kwargs.setdefault("flush_interval_s", 0.02)
    kwargs.setdefault("heartbeat_interval_s", 0)
    return Monitor("llm", "outage", url=url, token="t", **kwargs)


def test_memory_stays_bounded_while_the_spool_grows_then_everything_arrives_once_in_order(
        collector) -> None:
    collector.down = True
    monitor = make_monitor(collector.url, max_batch_rows=200)
    sender = monitor._sender
    assert sender is not None and monitor.spool is not None
    sender._backoff_max_s = 0.2  # retry often, so the return is noticed soon
    most_in_memory = 0
    for step in range(6000):
        monitor.step(step, loss=float(step))
        if step % 100 == 0:
            time.sleep(0.005)
            most_in_memory = max(most_in_memory, sender._pending_rows + len(monitor._steps))
        if step == 3000:
            monitor.checkpoint_loaded(2999, "/nowhere")
    assert collector.wait_for(lambda: len(monitor.spool) >= 20, timeout_s=60)
    # Rows in memory: at most a batch being filled plus a few batches, whatever the outage length.
    assert most_in_memory <= 5 * 200 + 200
    assert collector.accepted == []
    collector.down = False
    assert monitor.close(timeout_s=120)
    steps = collector.steps()["step"]
    assert steps == list(range(6000))  # every step, once, in order
    kinds = [event["kind"] for event in collector.events()]
    assert kinds == ["start", "checkpoint_load", "finish"]
    ids = [batch["batch_id"] for batch in collector.accepted]
    assert len(ids) == len(set(ids))
    assert len(monitor.spool) == 0 and not os.listdir(monitor.spool.directory)
    assert monitor.stats["rows_dropped"] == 0


def test_the_next_process_of_the_run_sends_what_the_last_one_left(collector, closed_port_url) -> None:
    first = make_monitor(closed_port_url)
    for step in range(50):
        first.step(step, loss=1.0)
    assert first.close(timeout_s=1) is False
    assert first.spool is not None and first.spool.rows == 52

    second = make_monitor(collector.url)  # same project, run and rank: the same spool directory
    for step in range(50, 80):
        second.step(step, loss=1.0)
    assert second.close(timeout_s=30)
    assert collector.steps()["step"] == list(range(80))
    assert [e["kind"] for e in collector.events()] == ["start", "finish", "start", "finish"]
    assert len(second.spool) == 0


def test_413_splits_the_batch_in_halves_and_loses_nothing(collector) -> None:
    collector.answer(413, error="'steps.step' has too many rows")
    monitor = make_monitor(collector.url, flush_interval_s=60)
    for step in range(100):
        monitor.step(step, loss=1.0)
    assert monitor.close(timeout_s=30)
    assert collector.received[0].status == 413
    assert collector.steps()["step"] == list(range(100))
    assert monitor.stats["rows_dropped"] == 0
    assert len(collector.accepted) >= 2


def test_a_permanent_refusal_is_not_spooled(collector) -> None:
    collector.answer(403, error="this token belongs to another project")
    monitor = make_monitor(collector.url, flush_interval_s=60)
    monitor.step(0, loss=1.0)
    monitor.close(timeout_s=10)
    assert monitor.spool is not None and len(monitor.spool) == 0
    assert monitor.stats["rows_spooled"] == 0
    assert monitor.stats["batches_dropped"] == 1
