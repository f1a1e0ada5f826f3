"""What the Monitor records besides steps: heartbeats, checkpoints, attempts, GPU samples."""

from __future__ import annotations

import os

from trainer_plugin import Monitor


def make_monitor(url: str, **kwargs) -> Monitor:
    kwargs.setdefault("flush_interval_s", 0.05)
    return Monitor("llm", "life", url=url, token="t", **kwargs)


def heartbeats(collector) -> list[dict]:
    return [event for event in collector.events() if event["kind"] == "heartbeat"]


def test_heartbeats_keep_coming_when_steps_stop(collector) -> None:
    monitor = make_monitor(collector.url, heartbeat_interval_s=0.2)
    for step in range(5):
        monitor.step(step, loss=1.0)
    # The training loop is now "hung": no more steps, yet the monitor says it is alive.
    assert collector.wait_for(lambda: len(heartbeats(collector)) >= 4, timeout_s=60)
    monitor.close()
    beats = heartbeats(collector)
    assert all(beat["step"] == 4 for beat in beats)  # alive, and stuck after step 4
    gaps = [later["ts"] - earlier["ts"] for earlier, later in zip(beats, beats[1:], strict=False)]
    assert all(gap >= 0.2 * 0.9 for gap in gaps), gaps  # no faster than asked
    assert monitor.stats["heartbeats"] == len(beats)


def test_heartbeat_interval_zero_turns_them_off(collector) -> None:
    monitor = make_monitor(collector.url, heartbeat_interval_s=0)
    monitor.step(0, loss=1.0)
    monitor.close()
    assert heartbeats(collector) == []


def test_checkpoint_save_records_step_duration_path_and_bytes_of_a_file(collector, tmp_path) -> None:
    monitor = make_monitor(collector.url)
    path = tmp_path / "step-100.pt"
    with monitor.checkpoint_save(100, path):
        path.write_bytes(b"x" * 12345)
    monitor.close()
    (save,) = [e for e in collector.events() if e["kind"] == "checkpoint_save"]
    assert save["step"] == 100
    assert save["bytes"] == 12345
    assert save["path"] == str(path)
    assert save["duration_s"] >= 0
    assert "_measure_path" not in save


def test_checkpoint_save_of_a_directory_counts_every_file_in_it(collector, tmp_path) -> None:
    monitor = make_monitor(collector.url)
    directory = tmp_path / "step-200"
    with monitor.checkpoint_save(200, directory):
        (directory / "shards").mkdir(parents=True)
        for rank in range(4):
            (directory / "shards" / f"rank{rank}.distcp").write_bytes(b"w" * 1000)
        (directory / ".metadata").write_bytes(b"m" * 24)
    monitor.close()
    (save,) = [e for e in collector.events() if e["kind"] == "checkpoint_save"]
    assert save["bytes"] == 4024


def test_a_failed_save_records_nothing_and_the_error_goes_on(collector, tmp_path) -> None:
    monitor = make_monitor(collector.url)
    try:
        with monitor.checkpoint_save(300, tmp_path / "never"):
            raise OSError("disk full")
    except OSError as error:
        assert str(error) == "disk full"
    else:
        raise AssertionError("the save's error was swallowed")
    monitor.close()
    assert not [e for e in collector.events() if e["kind"] == "checkpoint_save"]


def test_checkpoint_loaded_records_the_restored_step(collector, tmp_path) -> None:
    path = tmp_path / "step-100.pt"
    path.write_bytes(b"y" * 2048)
    monitor = make_monitor(collector.url)
    monitor.checkpoint_loaded(100, path, duration_s=1.5)
    monitor.checkpoint_loaded(50, tmp_path / "gone")  # a path that is not there: no size
    monitor.close()
    loads = [e for e in collector.events() if e["kind"] == "checkpoint_load"]
    assert [(e["step"], e["bytes"], e.get("duration_s")) for e in loads] == [
        (100, 2048, 1.5), (50, None, None)]


def test_a_disabled_monitor_still_works_as_a_context_manager() -> None:
    monitor = Monitor()  # no URL: a no-op
    with monitor.checkpoint_save(1, "/tmp/x"):
        pass
    monitor.checkpoint_loaded(1, "/tmp/x")
    assert monitor.close()


def test_attempt_follows_torchrun_restarts_unless_given(collector, monkeypatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    make_monitor(collector.url).close()
    monkeypatch.setenv("RUNWATCH_ATTEMPT", "7")
    make_monitor(collector.url).close()
    make_monitor(collector.url, attempt=9).close()
    assert [batch["run"]["attempt"] for batch in collector.accepted] == [2, 7, 9]


def test_simulated_gpu_samples_arrive_marked_simulated(collector) -> None:
    monitor = make_monitor(collector.url, gpu_sampling="simulated", gpu_interval_s=0.05)
    assert collector.wait_for(
        lambda: sum(len(b["gpus"]["ts"]) for b in collector.accepted) >= 16, timeout_s=60)
    monitor.close()
    with_gpus = [b["gpus"] for b in collector.accepted if b["gpus"]["ts"]]
    assert all(gpus["simulated"] is True for gpus in with_gpus)
    assert {gpu for gpus in with_gpus for gpu in gpus["gpu"]} >= {0}
    assert all(len(gpus["temp_c"]) == len(gpus["ts"]) for gpus in with_gpus)


def test_only_local_rank_zero_samples_gpus(collector, monkeypatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monitor = make_monitor(collector.url, gpu_sampling="simulated", gpu_interval_s=0.05)
    assert monitor._gpu_sampler is None
    monitor.close()


def test_offline_mode_writes_everything_to_the_spool(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("RUNWATCH_MODE", "offline")
    monitor = Monitor("llm", "offline-run", flush_interval_s=0.05)  # no URL needed
    assert monitor.enabled
    for step in range(30):
        monitor.step(step, loss=1.0)
    assert monitor.close() is False  # not delivered: waiting on disk
    assert monitor.spool is not None and monitor.spool.rows == 32
    assert str(monitor.spool.directory).startswith(os.environ["RUNWATCH_SPOOL_DIR"])
