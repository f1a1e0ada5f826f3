"""Monitor against a real HTTP collector on loopback: what the training loop records is what
arrives, in the wire format."""

from __future__ import annotations

import gzip
import logging
import math
import sys
import time

import pytest
import torch

from trainer_plugin import Monitor
from trainer_plugin.protocol import validate_batch


def make_monitor(collector, **kwargs) -> Monitor:
    kwargs.setdefault("flush_interval_s", 0.05)
    return Monitor("llm", "llama-8b", url=collector.url, token="s3cret", **kwargs)


def test_steps_arrive_with_numbers_durations_tokens_and_metrics(collector) -> None:
    monitor = make_monitor(collector)
    monitor.step(tokens=4096, loss=2.5, lr=3e-4)
    time.sleep(0.02)
    monitor.step(tokens=4096, loss=torch.tensor(2.25), grad_norm=torch.tensor(1.5))
    monitor.step(10, duration_s=0.5, loss=float("nan"), lr=float("inf"))
    monitor.step(loss=torch.tensor(float("nan")))
    assert monitor.close()

    steps = collector.steps()
    assert steps["step"] == [0, 1, 10, 11]
    assert steps["duration_s"][0] is None
    assert steps["duration_s"][1] >= 0.02
    assert steps["duration_s"][2] == 0.5
    assert steps["tokens"] == [4096, 4096, None, None]
    assert steps["metrics.loss"] == [2.5, 2.25, None, None]
    assert steps["metrics.lr"] == [3e-4, None, None, None]
    assert steps["metrics.grad_norm"] == [None, 1.5, None, None]
    now = time.time()
    assert all(now - 10 < ts <= now for ts in steps["ts"])
    assert not [r.error for r in collector.received if r.error]


def test_requests_are_gzip_json_with_bearer_token(collector) -> None:
    monitor = make_monitor(collector)
    monitor.step(loss=1.0)
    monitor.close()
    request = collector.received[0]
    assert request.path == "/api/v1/ingest"
    assert request.headers["content-encoding"] == "gzip"
    assert request.headers["content-type"] == "application/json"
    assert request.headers["authorization"] == "Bearer s3cret"
    validate_batch(request.batch)


def test_url_that_already_names_the_ingest_path_is_used_as_is(collector) -> None:
    monitor = Monitor("llm", "r", url=collector.url + "/api/v1/ingest", token="t",
                      flush_interval_s=0.05)
    monitor.close()
    assert [r.path for r in collector.received] == ["/api/v1/ingest"]


def test_start_and_finish_events_frame_the_run(collector) -> None:
    monitor = make_monitor(collector, config={"lr": 3e-4, "layers": 32})
    monitor.step(loss=1.0)
    monitor.event("checkpoint_save", step=0, duration_s=1.5, bytes=1024, path="/ckpt/0")
    monitor.close()
    events = collector.events()
    assert [e["kind"] for e in events] == ["start", "checkpoint_save", "finish"]
    start, checkpoint, finish = events
    assert start["pid"] > 0
    assert start["python"] == sys.version.split()[0]
    assert start["torch"] == torch.__version__
    assert checkpoint["path"] == "/ckpt/0" and checkpoint["bytes"] == 1024
    assert finish["status"] == "finished"
    assert start["ts"] <= checkpoint["ts"] <= finish["ts"]
    assert collector.accepted[0]["run"]["config"] == {"lr": 3e-4, "layers": 32}


def test_unknown_event_kind_is_ignored_not_raised(collector, caplog) -> None:
    monitor = make_monitor(collector)
    with caplog.at_level(logging.WARNING, logger="runwatch"):
        monitor.event("explosion", size=3)
    monitor.close()
    assert "explosion" in caplog.text
    assert [e["kind"] for e in collector.events()] == ["start", "finish"]


def test_exception_in_with_block_records_interruption_and_failed_finish(collector) -> None:
    def train() -> None:
        with make_monitor(collector) as monitor:
            monitor.step(loss=1.0)
            raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(RuntimeError, match="illegal memory access"):
        train()
    events = collector.events()
    assert [e["kind"] for e in events] == ["start", "interruption", "finish"]
    interruption = events[1]
    assert interruption["exc_type"] == "RuntimeError"
    assert "illegal memory access" in interruption["message"]
    assert "in train" in interruption["traceback"]
    assert len(interruption["traceback"].splitlines()) <= 30
    assert events[2]["status"] == "failed"


def test_clean_with_block_finishes(collector) -> None:
    with make_monitor(collector) as monitor:
        monitor.step(loss=1.0)
    assert [e["kind"] for e in collector.events()] == ["start", "finish"]
    assert collector.events()[-1]["status"] == "finished"


def test_close_is_idempotent_and_later_calls_are_no_ops(collector) -> None:
    monitor = make_monitor(collector)
    monitor.step(loss=1.0)
    assert monitor.close() is True
    assert monitor.close() is True
    monitor.step(loss=2.0)
    monitor.event("heartbeat")
    assert [e["kind"] for e in collector.events()] == ["start", "finish"]
    assert collector.steps()["step"] == [0]


def test_batches_never_exceed_max_batch_rows(collector) -> None:
    monitor = make_monitor(collector, max_batch_rows=100, flush_interval_s=5.0)
    for _ in range(1050):
        monitor.step(loss=1.0)
    assert monitor.close()
    sizes = [len(b["steps"]["step"]) + len(b["events"]) for b in collector.accepted]
    assert max(sizes) <= 100
    assert collector.steps()["step"] == list(range(1050))
    assert len({b["batch_id"] for b in collector.accepted}) == len(collector.accepted)
    stats = monitor.stats
    assert stats["steps_recorded"] == 1050
    assert stats["rows_sent"] == 1052  # plus start and finish
    assert stats["batches_sent"] == len(collector.accepted)
    assert stats["rows_dropped"] == 0


def test_full_buffer_wakes_the_sender_before_the_interval(collector) -> None:
    monitor = make_monitor(collector, max_batch_rows=50, flush_interval_s=30.0)
    for _ in range(50):
        monitor.step(loss=1.0)
    assert collector.wait_for(lambda: len(collector.accepted) >= 1, timeout_s=5)
    monitor.close()


def test_bad_metric_values_and_names_are_dropped_not_raised(collector, caplog) -> None:
    monitor = make_monitor(collector)
    with caplog.at_level(logging.WARNING, logger="runwatch"):
        monitor.step(loss="not a number", acc=torch.ones(3), **{"bad name!": 1.0}, ok=1)
        monitor.step(loss="not a number", ok=2)
    assert monitor.close()
    steps = collector.steps()
    assert steps["metrics.ok"] == [1.0, 2.0]
    assert steps["metrics.loss"] == [None, None]
    assert steps["metrics.acc"] == [None, None]
    assert "metrics.bad name!" not in steps
    assert caplog.text.count("'loss'") == 1  # logged once, not per step


def test_without_url_monitor_is_a_silent_no_op(caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="runwatch"):
        monitor = Monitor("llm", "r")
    assert "Runwatch is disabled: set RUNWATCH_URL" in caplog.text
    assert not monitor.enabled
    monitor.step(loss=1.0)
    monitor.event("heartbeat")
    assert monitor.close() is True
    assert monitor.stats["steps_recorded"] == 0


def test_invalid_project_disables_with_the_reason(collector, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="runwatch"):
        monitor = Monitor("no spaces allowed", "r", url=collector.url, token="t")
    assert not monitor.enabled
    assert "run.project" in caplog.text
    monitor.step(loss=1.0)
    monitor.close()
    assert collector.received == []


def test_project_and_run_come_from_environment(collector, monkeypatch) -> None:
    monkeypatch.setenv("RUNWATCH_PROJECT", "vision")
    monkeypatch.setenv("RUNWATCH_RUN", "vit-h")
    monkeypatch.setenv("RUNWATCH_URL", collector.url)
    monkeypatch.setenv("RUNWATCH_TOKEN", "env-token")
    monitor = Monitor(flush_interval_s=0.05)
    monitor.close()
    batch = collector.accepted[0]
    assert (batch["run"]["project"], batch["run"]["name"]) == ("vision", "vit-h")
    assert collector.received[0].headers["authorization"] == "Bearer env-token"


def test_gzip_body_is_smaller_than_the_json(collector) -> None:
    monitor = make_monitor(collector)
    for _ in range(500):
        monitor.step(loss=1.0, lr=1e-4)
    monitor.close()
    from trainer_plugin.transports.http import HttpTransport

    batch = collector.accepted[0]
    body = HttpTransport(collector.url, "t").encode(batch)
    assert len(body) < len(gzip.decompress(body)) / 4
    assert not any(isinstance(v, float) and math.isnan(v) for v in batch["steps"]["ts"])


def test_nonsense_arguments_disable_the_monitor_instead_of_raising(collector, caplog) -> None:
    with caplog.at_level(logging.WARNING, logger="runwatch"):
        monitor = Monitor("llm", "r", url=collector.url, token="t", buffer_rows="lots")  # type: ignore[arg-type]
        other = Monitor("llm", "r", url=collector.url, token="t", flush_interval_s=None)  # type: ignore[arg-type]
    assert not monitor.enabled and not other.enabled
    assert caplog.text.count("Runwatch is disabled") == 2
    for m in (monitor, other):
        m.step(loss=1.0)
        m.event("heartbeat")
        assert m.close() is True
