"""The example training job really trains, alone and under torchrun, with Runwatch switched off
(no RUNWATCH_URL): the Monitor lines in it must never be what makes it fail."""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "train_tiny.py"


@pytest.fixture
def no_runwatch(monkeypatch):
    for name in ("RUNWATCH_URL", "RUNWATCH_TOKEN", "RUNWATCH_PROJECT", "RUNWATCH_RUN"):
        monkeypatch.delenv(name, raising=False)
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def load_example():
    spec = importlib.util.spec_from_file_location("train_tiny", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def test_single_process_loss_decreases(no_runwatch, tmp_path):
    example = load_example()
    sigint_before = signal.getsignal(signal.SIGINT)
    losses = example.train(example.parse_args(["--steps", "120", "--log-every", "1000"]))

    assert len(losses) == 120
    # Uniform guessing over the alphabet costs ln(vocab) ≈ 4.1 nats; a model that learns anything
    # is well below it within a hundred steps.
    assert mean(losses[:10]) > 3.5
    assert mean(losses[-10:]) < mean(losses[:10]) - 1.0
    # The Ctrl-C handler the example installs is gone again once training is over.
    assert signal.getsignal(signal.SIGINT) is sigint_before


def test_checkpoint_is_written_atomically(no_runwatch, tmp_path):
    example = load_example()
    args = example.parse_args(
        ["--steps", "4", "--checkpoint-every", "2", "--checkpoint-dir", str(tmp_path), "--run", "ckpt"]
    )
    example.train(args)

    assert sorted(path.name for path in tmp_path.iterdir()) == ["ckpt.pt"]


def test_two_ranks_under_torchrun_train_and_exit_cleanly(no_runwatch):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore:Failed to initialize NumPy",
               PYTHONPATH=str(ROOT))
    result = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(SCRIPT), "--steps", "120", "--log-every", "20", "--run-name", "test-ddp"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )  # fmt: skip

    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 rank(s)" in result.stdout
    losses = [float(loss) for loss in re.findall(r"loss (\d+\.\d+)", result.stdout)]
    assert len(losses) == 7  # steps 0, 20, ..., 100 and the last one
    assert losses[-1] < losses[0] - 1.0


def test_ctrl_c_stops_both_ranks_together_without_a_traceback(no_runwatch):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore:Failed to initialize NumPy",
               PYTHONPATH=str(ROOT))
    launcher = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(SCRIPT), "--steps", "100000", "--log-every", "10"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        for line in launcher.stdout:
            if line.startswith("step    10"):
                break
        launcher.send_signal(signal.SIGINT)
        # Both ranks leave at the same step; neither waits for the collective timeout.
        _, stderr = launcher.communicate(timeout=30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()

    assert "tiny-char-lm: interrupted" in stderr
    # The launcher reports its own signal; the ranks themselves print no traceback.
    worker_part = stderr.split("Received", 1)[-1]
    assert "train_tiny.py" not in worker_part
