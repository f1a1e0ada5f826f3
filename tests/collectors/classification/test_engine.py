"""The engine against each rule, the ChildFailedError unwrap, XIDs and priorities (no database)."""

from __future__ import annotations

import pytest

from collectors.classification.engine import classify, unwrap_child_failed
from collectors.classification.rules import rules_from_file

RULES = rules_from_file()


def verdict(**evidence):
    return classify(evidence, rules=RULES)


# One case per rule: the evidence and the rule that must decide it.
CASES = [
    ("ecc-uncorrectable-text", {"text": "RuntimeError: CUDA error: uncorrectable ECC error encountered"}),
    ("row-remap-text", {"text": "NVRM: Xid (PCI:0000:10:1c): 63, pid=1896, Row Remapper: New row marked for "
                                "remapping, reset gpu to activate."}),
    ("ecc-dbe-counter", {"ecc_dbe": 2, "text": ""}),
    ("xid-gpu-memory", {"xids": [48]}),
    ("gpu-fell-off-bus-text", {"text": "NVRM: GPU 0000:06:00.0: GPU has fallen off the bus."}),
    ("nvlink-error-text", {"text": "CUDA error: uncorrectable NVLink error detected during the execution"}),
    ("gsp-timeout-text", {"text": "Timeout waiting for RPC from GSP! Expected function 76"}),
    ("xid-gpu-hardware", {"xids": [74]}),
    ("slurm-preempted", {"text": "slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2024-01-01T00:00:00 "
                                 "DUE TO PREEMPTION ***"}),
    ("slurm-time-limit", {"text": "slurmstepd: error: *** JOB 1 ON n1 CANCELLED AT 2024-01-01T00:00:00 "
                                  "DUE TO TIME LIMIT ***"}),
    ("host-maintenance-text", {"text": "Instance terminated for host maintenance"}),
    ("slurm-node-fail", {"text": "*** JOB 7 CANCELLED AT 2024-01-01T00:00:00 DUE TO NODE FAILURE ***"}),
    ("nonfinite-loss", {"text": "ValueError: loss is nan at step 1200"}),
    ("loss-scale-minimum", {"text": "Exception: Current loss scale already at minimum - cannot decrease "
                                    "scale anymore. Exiting run."}),
    ("cuda-oom", {"text": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"}),
    ("oom-exc-type", {"exc_type": "torch.OutOfMemoryError", "text": ""}),
    ("nccl-net-ib", {"text": "NCCL WARN NET/IB : Got completion from peer 10.0.0.2<1> with status=12"}),
    ("nccl-remote-error", {"text": "ncclRemoteError: A call failed possibly due to a network error or a "
                                   "remote process exiting prematurely."}),
    ("socket-reset", {"text": "RuntimeError: Connection reset by peer"}),
    ("disk-full", {"text": "OSError: [Errno 28] No space left on device"}),
    ("stale-file-handle", {"text": "OSError: [Errno 116] Stale file handle: '/ckpt/step_100'"}),
    ("io-error", {"text": "OSError: [Errno 5] Input/output error: '/lustre/ckpt/step_100/model.pt'"}),
    ("dataloader-worker-killed", {"text": "RuntimeError: DataLoader worker (pid 46794) is killed by signal: "
                                          "Bus error. It is possible that dataloader's workers are out of "
                                          "shared memory."}),
    ("dataloader-timeout", {"text": "RuntimeError: DataLoader timed out after 300 seconds"}),
    ("nccl-watchdog-timeout", {"text": "[Rank 0] Watchdog caught collective operation timeout: "
                                       "WorkNCCL(SeqNum=5, OpType=ALLREDUCE, Timeout(ms)=600000)"}),
    ("nccl-comm-aborted", {"text": "RuntimeError: NCCL communicator was aborted on rank 3."}),
    ("host-oom-killer", {"text": "Out of memory: Killed process 4242 (python) total-vm:900000kB"}),
    ("sigkill-text", {"text": "traceback : Signal 9 (SIGKILL) received by PID 14750"}),
    ("illegal-instruction", {"text": "Illegal instruction (core dumped)"}),
    ("bus-error", {"text": "Bus error (core dumped)"}),
    ("sigkill-signal", {"exit_code": 137}),
    ("sigbus-signal", {"signal": "SIGBUS"}),
    ("agent-death-signal", {"text": "torch/distributed/elastic/agent/server/api.py:719] Received 15 death "
                                    "signal, shutting down workers"}),
    ("stop-signal", {"signal": "SIGUSR1", "source": "signal"}),
    ("cuda-illegal-access", {"text": "RuntimeError: CUDA error: an illegal memory access was encountered"}),
    ("shape-or-device-mismatch", {"text": "RuntimeError: mat1 and mat2 shapes cannot be multiplied "
                                          "(4x3 and 5x6)"}),
    ("python-exception-text", {"text": "Traceback (most recent call last):\n  File \"train.py\", line 3\n"
                                       "KeyError: 'input_ids'"}),
    ("python-exception-type", {"exc_type": "AssertionError", "text": ""}),
    ("xid-software", {"xids": [31]}),
    ("segfault", {"text": "Segmentation fault (core dumped)"}),
    ("generic-runtime-error", {"text": "RuntimeError: something the rules do not know"}),
    ("abort-signal", {"exit_code": -6}),
    ("stall-heartbeat-alive", {"source": "stall", "heartbeat_lost": False, "text": ""}),
    ("stall-heartbeat-lost", {"source": "stall", "heartbeat_lost": True, "text": ""}),
]


@pytest.mark.parametrize(("slug", "evidence"), CASES, ids=[slug for slug, _ in CASES])
def test_each_rule_decides_its_signature(slug, evidence):
    rule = next(rule for rule in RULES if rule.slug == slug)
    result = verdict(**evidence)
    assert (result.rule, result.category, result.expected) == (slug, rule.category, rule.expected)
    assert result.confidence == rule.confidence


def test_every_rule_in_the_file_has_a_case():
    assert {rule.slug for rule in RULES} == {slug for slug, _ in CASES}


def test_no_evidence_is_unknown_with_low_confidence():
    result = verdict(text="the job stopped")
    assert (result.category, result.rule, result.expected) == ("unknown", "fallback", False)
    assert result.confidence <= 0.2


def test_unknown_keys_and_junk_values_are_ignored():
    result = classify({"text": None, "xids": ["x", None], "exit_code": "abc", "gpu": 3, "hostname": "n1"},
                      rules=RULES)
    assert result.category == "unknown"
    assert classify("not a dict", rules=RULES).category == "unknown"


def test_specific_beats_generic_ecc_error_is_gpu_memory_not_software_bug():
    text = ("Traceback (most recent call last):\n  File \"train.py\", line 9, in step\n"
            "RuntimeError: CUDA error: uncorrectable ECC error encountered\n"
            "CUDA kernel errors might be asynchronously reported at some other API call")
    result = verdict(text=text, exc_type="RuntimeError")
    assert (result.category, result.rule) == ("gpu_memory", "ecc-uncorrectable-text")
    assert "uncorrectable ECC error" in result.matched


def test_hardware_xid_beats_the_software_symptom_it_caused():
    result = verdict(text="RuntimeError: CUDA error: an illegal memory access was encountered", xids=[79])
    assert (result.category, result.rule) == ("gpu_hardware", "xid-gpu-hardware")
    assert result.matched == "xid=79 (GPU has fallen off the bus)"


def test_informational_xid_does_not_decide():
    assert verdict(xids=[45]).category == "unknown"


def test_fabric_error_beats_the_timeout_it_caused():
    text = ("NCCL WARN NET/IB : Got completion from peer 10.1.1.1<5> with status=12 vendor err 129\n"
            "[Rank 3] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE)")
    assert verdict(text=text).category == "network"


def test_planned_signal_is_expected():
    result = verdict(signal="SIGTERM", source="signal")
    assert (result.category, result.expected) == ("planned", True)
    assert verdict(signal=15).category == "planned"
    assert verdict(exit_code=143).category == "planned"


# Lines as torchrun prints them; the log prefixes are shortened to keep them readable.
CHILD_FAILED_TIMEOUT = """\
[rank1]:[E1206 18:44:12.715 ProcessGroupNCCL.cpp:607] [Rank 1] Watchdog caught collective operation \
timeout: WorkNCCL(SeqNum=7753, OpType=ALLREDUCE, NumelIn=5, NumelOut=5, Timeout(ms)=600000) ran for \
600061 milliseconds before timing out.
W1206 elastic/multiprocessing/api.py:897] Sending process 3301 closing signal SIGTERM
E1206 elastic/multiprocessing/api.py:869] failed (exitcode: -6) local_rank: 1 (pid: 3302) of binary: python
Traceback (most recent call last):
  File "/usr/local/bin/torchrun", line 8, in <module>
    sys.exit(main())
  File "/usr/local/lib/python3.10/dist-packages/torch/distributed/launcher/api.py", line 263, in launch_agent
    raise ChildFailedError(
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
train.py FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2024-12-06_18:54:13
  host      : node017
  rank      : 1 (local_rank: 1)
  exitcode  : -6 (pid: 3302)
  error_file: <N/A>
  traceback : Signal 6 (SIGABRT) received by PID 3302
============================================================
"""


def test_child_failed_error_is_classified_by_its_root_cause_not_the_wrapper():
    result = verdict(text=CHILD_FAILED_TIMEOUT, source="launcher")
    assert (result.category, result.rule) == ("nccl_timeout", "nccl-watchdog-timeout")


def test_unwrap_drops_the_launcher_and_keeps_the_root_cause():
    unwrapped = unwrap_child_failed(CHILD_FAILED_TIMEOUT)
    assert unwrapped.exit_code == -6
    assert "Watchdog caught collective operation timeout" in unwrapped.text
    assert "Signal 6 (SIGABRT)" in unwrapped.text
    assert "closing signal SIGTERM" not in unwrapped.text
    assert "raise ChildFailedError" not in unwrapped.text
    assert "host      : node017" in unwrapped.root_cause


def test_the_wrappers_own_sigterm_to_siblings_is_not_a_planned_stop():
    # torchrun SIGTERMs the surviving ranks after one fails; that is not a scheduler stop.
    only_wrapper = CHILD_FAILED_TIMEOUT.split("\n", 1)[1].replace("Signal 6 (SIGABRT)",
                                                                  "To enable traceback see")
    result = verdict(text=only_wrapper)
    assert result.category != "planned"
    assert (result.category, result.rule) == ("software_bug", "abort-signal")


def test_child_failed_with_sigkill_exitcode_is_host_oom_killer():
    text = CHILD_FAILED_TIMEOUT.split("\n", 1)[1].replace("-6", "-9").replace(
        "Signal 6 (SIGABRT)", "Signal 9 (SIGKILL)")
    result = verdict(text=text)
    assert result.category == "host"


def test_child_failed_with_python_traceback_in_root_cause():
    text = CHILD_FAILED_TIMEOUT.split("\n", 1)[1].replace(
        "traceback : Signal 6 (SIGABRT) received by PID 3302",
        "traceback : Traceback (most recent call last):\n    File \"train.py\", line 4, in <module>\n"
        "  AssertionError: batch size must divide world size")
    result = verdict(text=text)
    assert result.category == "software_bug"


def test_text_without_a_wrapper_is_left_alone():
    assert unwrap_child_failed("RuntimeError: boom") is None
