"""RunwatchCallback in a real transformers Trainer: a tiny randomly initialised GPT-2 trained for a
few steps on CPU, reporting to the loopback collector."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from trainer_plugin.integrations.huggingface import RunwatchCallback

ROOT = Path(__file__).resolve().parents[3]
SEQUENCE = 8
BATCH = 2


class TinyText(torch.utils.data.Dataset):
    def __init__(self, size: int = 64):
        generator = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, 64, (size, SEQUENCE), generator=generator)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def tiny_trainer(output_dir: Path, callbacks: list, **overrides) -> Trainer:
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=2, n_embd=32, vocab_size=64,
                                       n_positions=SEQUENCE, bos_token_id=0, eos_token_id=0))
    options = dict(output_dir=str(output_dir), max_steps=5, per_device_train_batch_size=BATCH,
                   logging_steps=1, save_steps=2, report_to=[], use_cpu=True, disable_tqdm=True,
                   include_num_input_tokens_seen=True, dataloader_num_workers=0)
    options.update(overrides)
    return Trainer(model=model, args=TrainingArguments(**options), train_dataset=TinyText(),
                   callbacks=callbacks)


def timeline(collector) -> list[tuple]:
    """Steps and events in the order they happened (heartbeats left out)."""
    steps = collector.steps()
    rows = [(ts, ("step", step)) for ts, step in zip(steps["ts"], steps["step"], strict=True)]
    rows += [(event["ts"], (event["kind"], event.get("step")))
             for event in collector.events() if event["kind"] != "heartbeat"]
    return [what for _ts, what in sorted(rows, key=lambda row: row[0])]


def test_adding_the_callback_reports_every_step_checkpoint_and_the_finish(collector, tmp_path):
    callback = RunwatchCallback(project="llm", run="tiny-gpt2", url=collector.url, token="rw_t",
                                flush_interval_s=0.1)
    trainer = tiny_trainer(tmp_path, callbacks=[callback])  # the one line: callbacks=[...]

    trainer.train()

    assert collector.wait_for(lambda: any(e["kind"] == "finish" for e in collector.events()),
                              timeout_s=30)
    assert timeline(collector) == [
        ("start", None),
        ("step", 1), ("step", 2), ("checkpoint_save", 2),
        ("step", 3), ("step", 4), ("checkpoint_save", 4),
        ("step", 5), ("checkpoint_save", 5),
        ("finish", None),
    ]
    steps = collector.steps()
    assert all(loss is not None and 3.0 < loss < 5.5 for loss in steps["metrics.loss"])  # ~ln(64)
    assert all(lr is not None and lr > 0 for lr in steps["metrics.lr"])
    assert all(norm is not None and norm > 0 for norm in steps["metrics.grad_norm"])
    assert steps["tokens"] == [BATCH * SEQUENCE] * 5
    assert all(duration is not None and duration > 0 for duration in steps["duration_s"])

    batch = collector.accepted[0]
    assert batch["run"]["project"] == "llm"
    assert batch["run"]["name"] == "tiny-gpt2"
    assert batch["run"]["config"]["framework"] == "transformers"
    assert batch["run"]["config"]["training_args"]["max_steps"] == 5
    assert batch["run"]["config"]["model"]["model_type"] == "gpt2"
    assert batch["source"]["rank"] == 0

    saves = [e for e in collector.events() if e["kind"] == "checkpoint_save"]
    for save in saves:
        assert save["path"] == os.path.join(str(tmp_path), f"checkpoint-{save['step']}")
        assert save["bytes"] > 0
        assert save["duration_s"] >= 0
    assert [e["status"] for e in collector.events() if e["kind"] == "finish"] == ["finished"]


def test_only_logging_steps_carry_the_loss(collector, tmp_path):
    callback = RunwatchCallback(project="llm", run="sparse-logs", url=collector.url,
                                flush_interval_s=0.1)
    tiny_trainer(tmp_path, callbacks=[callback], logging_steps=2, save_strategy="no").train()

    assert collector.wait_for(lambda: any(e["kind"] == "finish" for e in collector.events()),
                              timeout_s=30)
    steps = collector.steps()
    assert steps["step"] == [1, 2, 3, 4, 5]
    loss = steps["metrics.loss"]
    assert [value is not None for value in loss] == [False, True, False, True, False]
    assert [e["kind"] for e in collector.events() if e["kind"] != "heartbeat"] == ["start", "finish"]


def test_resuming_from_a_checkpoint_records_the_load(collector, tmp_path):
    tiny_trainer(tmp_path, callbacks=[], max_steps=2, save_steps=2).train()
    callback = RunwatchCallback(project="llm", run="resumed", url=collector.url,
                                flush_interval_s=0.1)

    tiny_trainer(tmp_path, callbacks=[callback], max_steps=4, save_strategy="no").train(
        resume_from_checkpoint=str(tmp_path / "checkpoint-2"))

    assert collector.wait_for(lambda: any(e["kind"] == "finish" for e in collector.events()),
                              timeout_s=30)
    assert timeline(collector) == [("start", None), ("checkpoint_load", 2), ("step", 3),
                                   ("step", 4), ("finish", None)]
    [load] = [e for e in collector.events() if e["kind"] == "checkpoint_load"]
    assert load["path"] == str(tmp_path / "checkpoint-2")


def test_without_a_collector_training_goes_on(tmp_path):
    callback = RunwatchCallback(project="llm", run="nowhere")  # no URL: a no-op monitor

    result = tiny_trainer(tmp_path, callbacks=[callback], save_strategy="no").train()

    assert result.global_step == 5
    assert not callback.monitor.enabled


def test_an_exception_out_of_train_is_recorded_by_the_monitor_s_excepthook(collector, tmp_path):
    # transformers has no exception hook: the Monitor's sys.excepthook records what ends the script.
    script = tmp_path / "train_crash.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(ROOT)!r})
        from tests.trainer_plugin.integrations.test_huggingface import tiny_trainer
        from transformers import TrainerCallback
        from trainer_plugin.integrations.huggingface import RunwatchCallback

        class Diverge(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                if state.global_step == 3:
                    raise FloatingPointError("loss is nan at step 3")

        tiny_trainer({str(tmp_path)!r}, save_strategy="no", callbacks=[
            RunwatchCallback(project="llm", run="crash", url={collector.url!r}, flush_interval_s=0.1),
            Diverge()]).train()
    """))

    done = subprocess.run([sys.executable, str(script)], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "PYTHONPATH": str(ROOT)})

    assert done.returncode == 1
    assert "FloatingPointError: loss is nan at step 3" in done.stderr
    events = [e for e in collector.events() if e["kind"] != "heartbeat"]
    assert [e["kind"] for e in events] == ["start", "interruption", "finish"]
    assert events[1]["exc_type"] == "FloatingPointError"
    assert events[1]["message"] == "loss is nan at step 3"
    assert "on_step_end" in events[1]["traceback"]
    assert events[2]["status"] == "failed"
    assert collector.steps()["step"] == [1, 2]
