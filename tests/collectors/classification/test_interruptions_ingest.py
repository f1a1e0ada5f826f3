"""Ingest of a batch with interruption events creates classified Interruptions."""

from __future__ import annotations

import copy
import time

from collectors.models import Event, Interruption
from collectors.tasks import ingest_batch
from tests.batches import step_batch


def test_interruption_event_becomes_a_classified_interruption(token):
    now = time.time()
    events = [{"kind": "interruption", "ts": now, "source": "exception",
               "exc_type": "torch.OutOfMemoryError",
               "message": "CUDA out of memory. Tried to allocate 2.00 GiB",
               "traceback": "Traceback (most recent call last):\n  File \"train.py\", line 7\n",
               "some_future_key": {"x": 1}}]
    ingest_batch(step_batch(count=3, t0=now - 3, events=events), token=token)

    interruption = Interruption.objects.get()
    assert (interruption.category, interruption.expected, interruption.rule) == ("gpu_oom", False, "cuda-oom")
    assert interruption.source == "exception"
    assert interruption.rank == 0 and interruption.host == "node000"
    assert interruption.event == Event.objects.get(kind="interruption")
    assert "CUDA out of memory" in interruption.evidence["matched"]
    assert interruption.evidence["exc_type"] == "torch.OutOfMemoryError"
    assert interruption.confidence > 0.5


def test_xid_events_of_the_same_host_shortly_before_decide_the_category(token):
    now = time.time()
    earlier = step_batch(count=1, t0=now - 200,
                         events=[{"kind": "xid", "ts": now - 120, "gpu": 3, "xid": 79}])
    ingest_batch(earlier, token=token)
    crash = [{"kind": "xid", "ts": now - 1, "gpu": 3, "xid": 45},
             {"kind": "interruption", "ts": now, "source": "exception", "exc_type": "RuntimeError",
              "message": "CUDA error: an illegal memory access was encountered"}]
    ingest_batch(step_batch(count=1, t0=now - 2, events=crash), token=token)

    interruption = Interruption.objects.get()
    assert (interruption.category, interruption.rule) == ("gpu_hardware", "xid-gpu-hardware")
    assert interruption.evidence["xids"] == [79, 45]


def test_xids_of_another_host_are_not_evidence(token):
    now = time.time()
    ingest_batch(step_batch(rank=9, count=1, t0=now - 5, events=[{"kind": "xid", "ts": now - 5, "xid": 79}]),
                 token=token)
    ingest_batch(step_batch(rank=0, count=1, t0=now - 2, events=[
        {"kind": "interruption", "ts": now, "signal": "SIGTERM"}]), token=token)

    interruption = Interruption.objects.get()
    assert (interruption.category, interruption.expected, interruption.source) == ("planned", True, "signal")
    assert "xids" not in interruption.evidence


def test_launcher_child_failed_report_is_classified_by_the_root_cause(token):
    now = time.time()
    stderr = ("[rank1]: RuntimeError: DataLoader worker (pid 4242) is killed by signal: Bus error.\n"
              "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
              "Root Cause (first observed failure):\n[0]:\n  exitcode  : 1 (pid: 4241)\n"
              "  error_file: <N/A>\n  traceback : To enable traceback see: https://pytorch.org/docs\n"
              "==========\n")
    batch = step_batch(count=1, t0=now - 1, events=[
        {"kind": "interruption", "ts": now, "source": "launcher", "exit_code": 1, "stderr_tail": stderr}])
    ingest_batch(batch, token=token)

    interruption = Interruption.objects.get()
    assert (interruption.source, interruption.category) == ("launcher", "dataloader")


def test_redelivered_batch_creates_the_interruption_once(token):
    now = time.time()
    batch = step_batch(count=1, t0=now - 1, events=[{"kind": "interruption", "ts": now, "signal": "SIGTERM"}])
    for _ in range(2):
        ingest_batch(copy.deepcopy(batch), token=token)
    assert Interruption.objects.count() == 1
