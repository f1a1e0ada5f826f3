"""RunwatchCallback in a real Lightning Trainer: a tiny randomly initialised module trained for a few
steps on CPU, reporting to the loopback collector."""

from __future__ import annotations

import torch

from trainer_plugin.integrations.lightning import RunwatchCallback, pl

BATCH = 4


class TinyRegression(pl.LightningModule):
    def __init__(self, hidden: int = 8, fail_at_step: int | None = None):
        super().__init__()
        self.save_hyperparameters()
        self.net = torch.nn.Sequential(torch.nn.Linear(4, hidden), torch.nn.ReLU(),
                                       torch.nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        if self.hparams.fail_at_step is not None and self.global_step == self.hparams.fail_at_step:
            raise RuntimeError("NCCL watchdog timeout in allreduce (simulated)")
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(64, 4, generator=generator)
        data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
        return torch.utils.data.DataLoader(data, batch_size=BATCH)


def tiny_trainer(tmp_path, callbacks: list, **overrides) -> pl.Trainer:
    options = dict(max_steps=5, accelerator="cpu", devices=1, enable_progress_bar=False,
                   logger=False, enable_model_summary=False, default_root_dir=str(tmp_path))
    options.update(overrides)
    return pl.Trainer(callbacks=callbacks, **options)


def timeline(collector) -> list[tuple]:
    """Steps and events in the order they happened (heartbeats left out)."""
    steps = collector.steps()
    rows = [(ts, ("step", step)) for ts, step in zip(steps["ts"], steps["step"], strict=True)]
    rows += [(event["ts"], (event["kind"], event.get("step")))
             for event in collector.events() if event["kind"] != "heartbeat"]
    return [what for _ts, what in sorted(rows, key=lambda row: row[0])]


def finished(collector) -> bool:
    return any(event["kind"] == "finish" for event in collector.events())


def test_adding_the_callback_reports_every_step_the_checkpoint_and_the_finish(collector, tmp_path):
    callback = RunwatchCallback(project="llm", run="tiny-lightning", url=collector.url,
                                flush_interval_s=0.1, tokens=lambda batch: batch[0].numel())
    trainer = tiny_trainer(tmp_path, callbacks=[callback])  # the one line: callbacks=[...]

    trainer.fit(TinyRegression())

    assert collector.wait_for(lambda: finished(collector), timeout_s=30)
    assert timeline(collector) == [
        ("start", None),
        ("step", 1), ("step", 2), ("step", 3), ("step", 4), ("step", 5),
        ("checkpoint_save", 5),
        ("finish", None),
    ]
    steps = collector.steps()
    assert all(loss is not None and loss > 0 for loss in steps["metrics.loss"])
    assert steps["metrics.lr"] == [0.05] * 5
    assert steps["tokens"] == [BATCH * 4] * 5
    [save] = [e for e in collector.events() if e["kind"] == "checkpoint_save"]
    assert save["path"].endswith("step=5.ckpt")
    assert save["bytes"] > 0
    assert save["duration_s"] >= 0
    [finish] = [e for e in collector.events() if e["kind"] == "finish"]
    assert finish["status"] == "finished"
    batch = collector.accepted[0]
    assert batch["run"]["name"] == "tiny-lightning"
    assert batch["run"]["config"]["framework"] == "lightning"
    assert batch["run"]["config"]["hparams"] == {"hidden": 8, "fail_at_step": None}


def test_gradient_accumulation_reports_optimizer_steps(collector, tmp_path):
    callback = RunwatchCallback(project="llm", run="accumulate", url=collector.url,
                                flush_interval_s=0.1, tokens=lambda batch: batch[0].numel())

    tiny_trainer(tmp_path, callbacks=[callback], max_steps=3, accumulate_grad_batches=2,
                 enable_checkpointing=False).fit(TinyRegression())

    assert collector.wait_for(lambda: finished(collector), timeout_s=30)
    steps = collector.steps()
    assert steps["step"] == [1, 2, 3]
    assert steps["tokens"] == [2 * BATCH * 4] * 3


def test_an_exception_in_training_is_an_interruption_and_the_run_fails(collector, tmp_path):
    callback = RunwatchCallback(project="llm", run="crash", url=collector.url, flush_interval_s=0.1)

    try:
        tiny_trainer(tmp_path, callbacks=[callback]).fit(TinyRegression(fail_at_step=3))
    except RuntimeError as error:
        assert "NCCL watchdog timeout" in str(error)
    else:
        raise AssertionError("fit() should have raised")

    assert collector.wait_for(lambda: finished(collector), timeout_s=30)
    assert timeline(collector) == [("start", None), ("step", 1), ("step", 2), ("step", 3),
                                   ("interruption", None), ("finish", None)]
    [interruption] = [e for e in collector.events() if e["kind"] == "interruption"]
    assert interruption["exc_type"] == "RuntimeError"
    assert interruption["message"] == "NCCL watchdog timeout in allreduce (simulated)"
    assert "training_step" in interruption["traceback"]
    [finish] = [e for e in collector.events() if e["kind"] == "finish"]
    assert finish["status"] == "failed"


def test_resuming_from_a_checkpoint_records_the_load(collector, tmp_path):
    first = tiny_trainer(tmp_path / "first", callbacks=[], max_steps=2)
    first.fit(TinyRegression())
    checkpoint = first.checkpoint_callback.best_model_path
    callback = RunwatchCallback(project="llm", run="resumed", url=collector.url,
                                flush_interval_s=0.1)

    tiny_trainer(tmp_path, callbacks=[callback], max_steps=4, enable_checkpointing=False).fit(
        TinyRegression(), ckpt_path=checkpoint)

    assert collector.wait_for(lambda: finished(collector), timeout_s=30)
    assert timeline(collector) == [("start", None), ("checkpoint_load", 2), ("step", 3),
                                   ("step", 4), ("finish", None)]
    [load] = [e for e in collector.events() if e["kind"] == "checkpoint_load"]
    assert load["path"] == checkpoint


def test_without_a_collector_training_goes_on(tmp_path):
    callback = RunwatchCallback(project="llm", run="nowhere")  # no URL: a no-op monitor
    trainer = tiny_trainer(tmp_path, callbacks=[callback], enable_checkpointing=False)

    trainer.fit(TinyRegression())

    assert trainer.global_step == 5
    assert not callback.monitor.enabled
