from __future__ import annotations

import socket

import pytest

from trainer_plugin import Monitor, environment


def test_defaults_without_torchrun() -> None:
    env = environment.detect(environ={})
    assert (env.rank, env.local_rank, env.world_size, env.attempt) == (0, 0, 1, 0)
    assert env.host == socket.gethostname()
    assert env.url is None and env.project is None


def test_torchrun_variables_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "5")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "16")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    monkeypatch.setenv("RUNWATCH_PROJECT", "llm")
    monkeypatch.setenv("RUNWATCH_RUN", "llama")
    monkeypatch.setenv("RUNWATCH_URL", "http://collector:8000")
    monkeypatch.setenv("RUNWATCH_TOKEN", "secret")
    env = environment.detect()
    assert (env.rank, env.local_rank, env.world_size, env.attempt) == (5, 1, 16, 3)
    assert (env.project, env.run, env.url, env.token) == ("llm", "llama", "http://collector:8000",
                                                          "secret")


def test_attempt_prefers_argument_then_runwatch_then_torchelastic(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "3")
    assert environment.detect().attempt == 3
    monkeypatch.setenv("RUNWATCH_ATTEMPT", "7")
    assert environment.detect().attempt == 7
    assert environment.detect(attempt=9).attempt == 9


def test_explicit_arguments_win_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNWATCH_PROJECT", "from-env")
    env = environment.detect(project="from-arg", host="node1")
    assert env.project == "from-arg"
    assert env.host == "node1"


def test_malformed_variables_fall_back_to_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "zero")
    monkeypatch.setenv("WORLD_SIZE", "-4")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "")
    env = environment.detect()
    assert (env.rank, env.world_size, env.attempt) == (0, 1, 0)


def test_monitor_reports_rank_and_attempt_from_torchrun(
        monkeypatch: pytest.MonkeyPatch, collector) -> None:
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("LOCAL_RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    monkeypatch.setenv("RUNWATCH_URL", collector.url)
    monkeypatch.setenv("RUNWATCH_TOKEN", "t")
    monitor = Monitor("llm", "llama", flush_interval_s=0.05, host="node007")
    monitor.step(loss=1.0)
    assert monitor.close()
    batch = collector.accepted[0]
    assert batch["source"] == {"host": "node007", "rank": 3, "local_rank": 3, "world_size": 4}
    assert batch["run"]["attempt"] == 2
    assert batch["run"]["project"] == "llm" and batch["run"]["name"] == "llama"
