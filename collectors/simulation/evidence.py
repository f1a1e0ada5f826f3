"""What a failing job leaves behind, per root-cause category: the ``interruption`` event the
training process (or its launcher) sends, and the XID/ECC events the host's GPU sampler reported
just before. Written the way the real messages read, so that the collectors' classifier
(collectors/classification/rules_v1.json) files each one under the category that was planted;
tests/collectors/simulation checks that it does, for every variant below.

Each category has a few variants (a faulty GPU falls off the bus on one day and loses its GSP on
another); the simulator picks one at random per interruption.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

#: Categories our taxonomy files as expected (announced or asked for); the rest count as unexpected.
EXPECTED_CATEGORIES = frozenset({"host_maintenance", "planned"})

#: Seconds from the failure to the interruption event, per category, while the other ranks sit in
#: their collectives (GPUs spinning, little power): torchrun notices a crashed worker and tears
#: the group down within half a minute; a hung collective waits for the NCCL watchdog; a dead node
#: is noticed by the scheduler.
DETECTION_S = {
    "nccl_timeout": 600.0,
    "network": 40.0,
    "host": 60.0,
}
DEFAULT_DETECTION_S = 30.0

_TRACEBACK = """Traceback (most recent call last):
  File "/workspace/train.py", line 412, in <module>
    main()
  File "/workspace/train.py", line 388, in main
    loss = train_step(model, batch, optimizer)
  File "/workspace/train.py", line 201, in train_step
    {line}
{error}"""


@dataclass(frozen=True)
class Failure:
    """One variant: the interruption event's fields and the sampler's events before it."""

    fields: dict[str, Any]
    xid: int | None = None
    ecc_dbe: bool = False
    extra: dict[str, Any] = field(default_factory=dict)


def _exception(exc_type: str, message: str, line: str = "loss.backward()") -> dict[str, Any]:
    return {"source": "exception", "exc_type": exc_type, "message": message,
            "traceback": _TRACEBACK.format(line=line, error=f"{exc_type}: {message}")}


def _launcher(stderr: str, exit_code: int | None = None, signal: str | None = None) -> dict[str, Any]:
    fields: dict[str, Any] = {"source": "launcher", "stderr_tail": stderr}
    if exit_code is not None:
        fields["exit_code"] = exit_code
    if signal is not None:
        fields["signal"] = signal
    return fields


def variants(category: str, *, host: str, gpu: int, rank: int, peer: str) -> list[Failure]:
    """The ways ``category`` shows up on ``host``'s GPU ``gpu`` (global ``rank``)."""
    if category == "gpu_hardware":
        return [
            Failure(_exception("RuntimeError", "CUDA error: unspecified launch failure\nCUDA kernel "
                               "errors might be asynchronously reported at some other API call"),
                    xid=79),
            Failure(_exception("RuntimeError", f"CUDA error: GPU is lost (device {gpu})"), xid=79),
            Failure(_exception("RuntimeError", f"Timeout after 45s of waiting for RPC response from "
                               f"GPU{gpu} GSP! Expected function 76 (GSP_RM_CONTROL)"), xid=119),
            Failure(_exception("torch.distributed.DistBackendError",
                               f"NCCL error: unhandled cuda error, NCCL version 2.21.5\n"
                               f"{host}:{gpu}: uncorrectable NVLink error detected"), xid=74),
        ]
    if category == "gpu_memory":
        return [
            Failure(_exception("RuntimeError", "CUDA error: uncorrectable ECC error encountered"),
                    xid=48, ecc_dbe=True),
            Failure(_exception("RuntimeError", "CUDA error: an uncontained ECC error was detected"),
                    xid=95, ecc_dbe=True),
            Failure(_exception("RuntimeError", "CUDA error: unspecified launch failure"), xid=94),
        ]
    if category == "software_bug":
        return [
            Failure(_exception("RuntimeError", "CUDA error: an illegal memory access was "
                               "encountered", line="out = fused_attention(q, k, v)")),
            Failure(_exception("AssertionError", "pipeline schedule out of sync: expected "
                               "microbatch 7, got 6", line="assert mb == expected, msg")),
            Failure(_exception("KeyError", "'position_ids'", line="ids = batch['position_ids']")),
        ]
    if category == "network":
        return [
            Failure(_exception("torch.distributed.DistBackendError",
                               f"NCCL error in: ProcessGroupNCCL.cpp:1970, remote process exited "
                               f"or there was a network error, NCCL version 2.21.5\n"
                               f"{host}:{rank}:{rank} [{gpu}] NCCL INFO NET/IB : Got completion "
                               f"from peer {peer}<54123> with status=12 opcode=0 len=0 "
                               f"vendor err 129 (Recv)")),
            Failure(_exception("torch.distributed.DistBackendError",
                               f"NCCL error: ncclRemoteError: A call failed possibly due to a "
                               f"network error or a remote process exiting prematurely.\n"
                               f"{host} kernel: mlx5_core 0000:{gpu + 0x18:02x}:00.0: port 1 "
                               f"link down")),
        ]
    if category == "host_maintenance":
        return [
            Failure(_launcher(f"slurmstepd: error: *** STEP ON {host} CANCELLED: node is being "
                              f"drained for unplanned host maintenance (BMC power fault) ***",
                              signal="SIGTERM")),
        ]
    if category == "nccl_timeout":
        return [
            Failure(_exception("torch.distributed.DistBackendError",
                               f"[Rank {rank}] Watchdog caught collective operation timeout: "
                               f"WorkNCCL(SeqNum=918273, OpType=ALLREDUCE, NumelIn=262144000, "
                               f"NumelOut=262144000, Timeout(ms)=600000) ran for 600071 "
                               f"milliseconds before timing out.")),
        ]
    if category == "host":
        return [
            Failure(_launcher(f"srun: error: {host}: task {rank}: Killed\nslurmstepd: error: *** "
                              f"STEP ON {host} CANCELLED DUE TO NODE FAILURE ***", exit_code=-9)),
            Failure(_launcher(f"[{host}] kernel: Out of memory: Killed process 48211 (python) "
                              f"total-vm:912345678kB", exit_code=-9)),
        ]
    if category == "storage":
        return [
            Failure(_exception("OSError", "[Errno 5] Input/output error: "
                               "'/lustre/ckpt/shard_00017.distcp'",
                               line="dataset.read_shard(index)")),
            Failure(_exception("OSError", "[Errno 116] Stale file handle: "
                               "'/mnt/data/tokens/part-0412.bin'", line="dataset.read_shard(index)")),
        ]
    if category == "planned":
        return [Failure(_launcher("slurmstepd: error: *** JOB 88121 ON "
                                  f"{host} CANCELLED AT 2024-05-14T03:12:44 DUE TO PREEMPTION ***",
                                  signal="SIGTERM"))]
    # unknown: a process that vanished without a word.
    return [Failure({"source": "exception", "exc_type": "", "message": "worker exited"})]
