"""`runwatch sync DIR`: sends what offline mode or an outage left, with progress and a summary."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer_plugin import Monitor
from trainer_plugin.cli import sync
from trainer_plugin.transports.http import HttpTransport

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def spool_root(monkeypatch) -> Path:
    """Two ranks of an offline run, 40 steps each, in the spool."""
    monkeypatch.setenv("RUNWATCH_MODE", "offline")
    for rank in (0, 1):
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", str(rank))
        monitor = Monitor("llm", "offline", flush_interval_s=60, max_batch_rows=10)
        for step in range(40):
            monitor.step(step, loss=float(step))
        monitor.close()
    return Path(os.environ["RUNWATCH_SPOOL_DIR"])


def spooled_files(root: Path) -> list[Path]:
    return [path for path in root.rglob("*.json.gz")]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "trainer_plugin", *args], env=env,
                          capture_output=True, text=True, timeout=120)


def test_sync_sends_everything_in_order_shows_progress_and_a_summary(collector, spool_root) -> None:
    files = len(spooled_files(spool_root))
    assert files > 8
    result = run_cli("sync", str(spool_root), "--url", collector.url, "--token", "t")
    assert result.returncode == 0, result.stderr
    assert "syncing" in result.stderr and f"{files}/{files}" in result.stderr
    assert result.stdout.strip() == (f"runwatch sync: sent {files} batches (84 rows), 0 refused, "
                                     "0 remaining")
    assert spooled_files(spool_root) == []
    for rank in (0, 1):
        steps = [step for batch in collector.accepted if batch["source"]["rank"] == rank
                 for step in batch["steps"]["step"]]
        assert steps == list(range(40))
    assert all(r.headers["authorization"] == "Bearer t" for r in collector.received)


def test_sync_while_the_collector_is_away_keeps_the_files_and_fails(closed_port_url,
                                                                     spool_root) -> None:
    before = sorted(spooled_files(spool_root))
    result = run_cli("sync", str(spool_root), "--url", closed_port_url)
    assert result.returncode == 1
    assert "run it again later" in result.stderr
    assert f"0 refused, {len(before)} remaining" in result.stdout
    assert sorted(spooled_files(spool_root)) == before


def test_sync_sets_refused_batches_aside_and_says_so(collector, spool_root) -> None:
    collector.answer(400, error="'run.name' is not valid")
    summary = sync(spool_root, HttpTransport(collector.url, "t"), stream=io.StringIO())
    assert summary.failed == 1 and summary.remaining == 0
    assert len(list(spool_root.rglob("*.rejected"))) == 1


def test_sync_draws_its_own_bar_without_tqdm(collector, spool_root, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tqdm", None)  # import tqdm now fails
    stream = io.StringIO()
    summary = sync(spool_root, HttpTransport(collector.url, "t"), stream=stream)
    assert summary.remaining == 0 and summary.rows_sent == 84
    assert f"{summary.batches_sent}/{summary.batches_sent} batches" in stream.getvalue()


def test_sync_needs_a_url(spool_root) -> None:
    result = run_cli("sync", str(spool_root))
    assert result.returncode == 2
    assert "--url" in result.stderr
