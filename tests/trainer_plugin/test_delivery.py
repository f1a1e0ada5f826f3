"""What happens when the collector is away, slow, overloaded or refuses: nothing raises into the
training loop, retries keep the batch id, and memory stays bounded."""

from __future__ import annotations

import logging
import time

from trainer_plugin import Monitor


def make_monitor(url: str, **kwargs) -> Monitor:
    kwargs.setdefault("flush_interval_s", 0.05)
    return Monitor("llm", "llama-8b", url=url, token="t", **kwargs)


def test_two_503s_then_202_delivers_everything_once_with_the_same_batch_id(collector) -> None:
    collector.answer(503, error="the collector's queue is unavailable; retry later", times=2)
    monitor = make_monitor(collector.url)
    for _ in range(10):
        monitor.step(loss=1.0)
    assert monitor.close(timeout_s=10)

    first_three = collector.received[:3]
    assert [r.status for r in first_three] == [503, 503, 202]
    assert len({r.batch["batch_id"] for r in first_three}) == 1
    assert collector.steps()["step"] == list(range(10))
    ids = [b["batch_id"] for b in collector.accepted]
    assert len(ids) == len(set(ids))
    stats = monitor.stats
    assert stats["send_errors"] == 2
    assert stats["rows_dropped"] == 0 and stats["batches_dropped"] == 0


def test_429_and_408_are_retried(collector) -> None:
    collector.answer(429)
    collector.answer(408)
    monitor = make_monitor(collector.url)
    monitor.step(loss=1.0)
    assert monitor.close(timeout_s=10)
    assert [r.status for r in collector.received[:3]] == [429, 408, 202]
    assert collector.steps()["step"] == [0]


def test_retry_after_is_honoured(collector) -> None:
    collector.answer(503, headers={"Retry-After": "1"})
    monitor = make_monitor(collector.url)
    monitor.step(loss=1.0)
    assert collector.wait_for(lambda: len(collector.accepted) == 1, timeout_s=5)
    refused, accepted = collector.received[:2]
    assert accepted.at - refused.at >= 0.95
    assert accepted.batch["batch_id"] == refused.batch["batch_id"]
    monitor.close()


def test_400_drops_the_batch_logs_the_reason_once_and_does_not_retry(collector, caplog) -> None:
    collector.answer(400, error="'steps.metrics.loss[0]' must be a finite number or null",
                     times=3)
    monitor = make_monitor(collector.url)
    with caplog.at_level(logging.WARNING, logger="runwatch"):
        monitor.step(loss=1.0)
        time.sleep(0.3)
        monitor.step(loss=2.0)
        time.sleep(0.3)
        monitor.step(loss=3.0)
        assert monitor.close()  # the finish batch is accepted again
    refused = [r for r in collector.received if r.status == 400]
    assert len(refused) == 3
    assert len({r.batch["batch_id"] for r in refused}) == 3  # three batches, no retries
    assert caplog.text.count("must be a finite number or null") == 1
    assert monitor.stats["batches_dropped"] == 3
    assert monitor.stats["rows_dropped"] >= 3


def test_unreachable_collector_never_raises_and_close_keeps_its_timeout(closed_port_url) -> None:
    monitor = make_monitor(closed_port_url)
    for step in range(1000):
        monitor.step(step, loss=1.0)
    monitor.event("checkpoint_save", step=999)
    started = time.monotonic()
    delivered = monitor.close(timeout_s=1.5)
    elapsed = time.monotonic() - started
    assert delivered is False
    assert elapsed < 2.5
    stats = monitor.stats
    assert stats["send_errors"] >= 1
    assert stats["rows_sent"] == 0
    assert stats["steps_recorded"] == 1000
    # Nothing lost: every row (steps, start, checkpoint, finish) waits in the spool.
    assert stats["rows_dropped"] == 0
    assert monitor.spool is not None and monitor.spool.rows == 1003


def test_unresolvable_host_never_raises() -> None:
    monitor = make_monitor("http://runwatch-collector.invalid:8000")
    monitor.step(loss=1.0)
    assert monitor.close(timeout_s=1) is False


def test_full_buffer_counts_drops_and_stays_bounded(closed_port_url) -> None:
    # A huge flush interval and batch size: the sender does not drain, so the buffer fills.
    monitor = make_monitor(closed_port_url, buffer_rows=1000, max_batch_rows=5000,
                           flush_interval_s=60)
    for _ in range(5000):
        monitor.step(loss=1.0)
    assert len(monitor._steps) <= 1000
    stats = monitor.stats
    assert stats["steps_recorded"] == 1000
    assert stats["rows_dropped"] == 4000
    monitor.close(timeout_s=0.5)


def test_without_a_writable_spool_pending_batches_are_bounded_and_oldest_dropped(
        closed_port_url, tmp_path) -> None:
    not_a_directory = tmp_path / "file"
    not_a_directory.write_text("")
    monitor = make_monitor(closed_port_url, buffer_rows=300, max_batch_rows=100,
                           flush_interval_s=0.01, spool_dir=not_a_directory)
    assert monitor.enabled and monitor.spool is None
    for _ in range(20):
        for _ in range(100):
            monitor.step(loss=1.0)
        time.sleep(0.02)
    sender = monitor._sender
    assert sender is not None
    assert sender._pending_rows <= 300
    assert len(monitor._steps) <= 300
    monitor.close(timeout_s=0.5)
    stats = monitor.stats
    assert stats["batches_dropped"] >= 1
    assert stats["rows_dropped"] >= 2000 - 600
    assert stats["rows_sent"] == 0


def test_hot_path_keeps_tensors_unconverted_and_every_step_is_delivered(collector) -> None:
    # Speed is measured by bench/plugin_overhead.py, not here: this checks what the hot path
    # keeps (the tensor itself: no .item() on the training thread) and that every step arrives.
    import torch

    loss = torch.tensor(2.5)
    monitor = make_monitor(collector.url, flush_interval_s=60, max_batch_rows=50_000)
    for _ in range(10_000):
        monitor.step(tokens=4096, loss=loss, lr=3e-4, grad_norm=1.0)
    assert monitor._steps[0][4]["loss"] is loss
    monitor.close()
    steps = collector.steps()
    assert steps["step"] == list(range(10_000))
    assert set(steps["metrics.loss"]) == {2.5}


def test_close_keeps_its_timeout_with_a_huge_buffer_and_counts_what_it_abandons(
        closed_port_url) -> None:
    import torch

    loss = torch.tensor(1.0)
    monitor = make_monitor(closed_port_url, max_batch_rows=100_000, buffer_rows=500_000,
                           flush_interval_s=60)
    for _ in range(150_000):
        monitor.step(loss=loss)
    started = time.monotonic()
    assert monitor.close(timeout_s=0.3) is False
    assert time.monotonic() - started < 1.0
    sender = monitor._sender
    assert sender is not None
    sender._thread.join(2)
    assert not sender._thread.is_alive()  # the thread stopped too, not only the wait for it
    stats = monitor.stats
    assert stats["steps_recorded"] == 150_000
    assert stats["rows_sent"] == 0
    # Every step, plus start and finish: on disk for later, or counted as lost at the deadline.
    assert stats["rows_spooled"] + stats["rows_dropped"] == 150_002
