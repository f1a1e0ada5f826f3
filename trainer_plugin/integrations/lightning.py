"""Runwatch for PyTorch Lightning, in one line:

    from trainer_plugin.integrations.lightning import RunwatchCallback

    trainer = Trainer(max_steps=10_000, callbacks=[RunwatchCallback(project="llm", run="gpt2-small")])

Works with the ``pytorch-lightning`` distribution (``import pytorch_lightning``) and with the
unified ``lightning`` one (``import lightning.pytorch``); when both are installed the callback is a
``lightning.pytorch.Callback``, for ``lightning.pytorch.Trainer``.

Every process (rank) reports its own steps: the Monitor is per rank. What each hook records:

- ``setup`` (fit): a Monitor for this rank (``start``), with the module's hyperparameters as config.
- ``on_train_batch_end``: one step row per optimizer step, at ``trainer.global_step``, with the
  step's ``loss`` (from what ``training_step`` returned), the first optimizer's ``lr``, and
  ``tokens`` when you pass ``tokens=lambda batch: ...``; micro-batches of gradient accumulation add
  up into their optimizer step.
- ``on_save_checkpoint``: ``checkpoint_save`` with the step, the time the save blocked training,
  and the file and its size as ModelCheckpoint wrote it.
- ``on_load_checkpoint``: ``checkpoint_load`` at the restored step, from ``trainer.ckpt_path``.
- ``on_exception``: the exception as an ``interruption`` with its traceback; the run is closed as
  failed.
- ``on_fit_end`` / ``teardown``: ``finish`` with Lightning's own verdict on the run.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Any

try:
    import lightning.pytorch as pl
except ImportError:
    import pytorch_lightning as pl

from trainer_plugin.integrations import path_bytes, record_exception, start_monitor
from trainer_plugin.monitor import Monitor


class RunwatchCallback(pl.Callback):
    """``project`` and ``run`` default to RUNWATCH_PROJECT / RUNWATCH_RUN, then the script's name;
    ``tokens`` is a function of a batch giving the tokens in it (e.g.
    ``lambda batch: batch["input_ids"].numel()``); other keyword arguments go to ``Monitor``.
    Pass ``monitor=`` to report through a Monitor you made yourself (it is not closed here)."""

    def __init__(self, project: str | None = None, run: str | None = None, *,
                 tokens: Callable[[Any], int] | None = None, monitor: Monitor | None = None,
                 **monitor_kwargs: Any):
        self.project = project
        self.run = run
        self.tokens = tokens
        self.monitor = monitor
        self._owns_monitor = monitor is None
        self._monitor_kwargs = monitor_kwargs
        self._fitting = False
        self._last_step: int | None = None
        self._last_mark: float | None = None
        self._tokens = 0
        self._saving: tuple[int, float] | None = None

    # --- start and end ----------------------------------------------------------------------------

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str,
              **kwargs: Any) -> None:
        if stage != "fit":
            return
        if self._owns_monitor and not self._fitting:
            options = dict(self._monitor_kwargs)
            config = options.pop("config", None) or _config(pl_module)
            self.monitor = start_monitor(self.project, self.run, rank=trainer.global_rank,
                                         local_rank=trainer.local_rank,
                                         world_size=trainer.world_size, config=config,
                                         monitor_kwargs=options)
        self._fitting = True
        self._last_step = trainer.global_step
        self._last_mark = time.perf_counter()
        self._tokens = 0
        self._saving = None

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, **kwargs: Any) -> None:
        self._finish("finished")

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str,
                 **kwargs: Any) -> None:
        if stage != "fit":
            return
        # Reached without on_fit_end when fit stopped early: Lightning's state says how.
        status = str(getattr(getattr(trainer.state, "status", None), "value", "") or "")
        self._finish("finished" if status == "finished" else (status or "failed"))

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException, **kwargs: Any) -> None:
        self._flush_save(trainer)
        if self.monitor is not None and self._fitting:
            self._fitting = False
            if self._owns_monitor:
                record_exception(self.monitor, exception)
            else:
                self.monitor.event("interruption", exc_type=type(exception).__name__,
                                   message=str(exception)[:4000])

    def _finish(self, status: str) -> None:
        if not self._fitting:
            return
        self._fitting = False
        if self._owns_monitor and self.monitor is not None:
            self.monitor.close(status)

    # --- steps -------------------------------------------------------------------------------------

    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any,
                             batch_idx: int, **kwargs: Any) -> None:
        self._flush_save(trainer)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int, **kwargs: Any) -> None:
        if self.tokens is not None:
            try:
                self._tokens += int(self.tokens(batch))
            except Exception:
                self.tokens = None  # a broken counter costs the token counts, never the run
        step = trainer.global_step
        if self.monitor is None or step == self._last_step:
            return  # a micro-batch of gradient accumulation: its optimizer step comes later
        now = time.perf_counter()
        duration = now - self._last_mark if self._last_mark is not None else None
        self._last_step, self._last_mark = step, now
        metrics: dict[str, Any] = {}
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if loss is not None and hasattr(loss, "detach"):
            metrics["loss"] = loss.detach()  # converted on the sender thread, never synchronised here
        elif isinstance(loss, (int, float)):
            metrics["loss"] = loss
        lr = _learning_rate(trainer)
        if lr is not None:
            metrics["lr"] = lr
        tokens, self._tokens = (self._tokens or None), 0
        self.monitor.step(step, duration_s=duration, tokens=tokens, **metrics)

    # --- checkpoints --------------------------------------------------------------------------------

    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any], **kwargs: Any) -> None:
        # Called while the checkpoint is being assembled, before it is written: the event goes out
        # at the next hook, when the file and the time it took exist.
        self._flush_save(trainer)
        self._saving = (trainer.global_step, time.perf_counter())

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                             **kwargs: Any) -> None:
        self._flush_save(trainer)

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                            **kwargs: Any) -> None:
        self._flush_save(trainer)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, **kwargs: Any) -> None:
        self._flush_save(trainer)

    def _flush_save(self, trainer: pl.Trainer) -> None:
        saving, self._saving = self._saving, None
        if saving is None or self.monitor is None:
            return
        step, started = saving
        now = time.perf_counter()
        fields: dict[str, Any] = {"step": step, "duration_s": now - started}
        path = _last_checkpoint_path(trainer)
        if path:
            fields["path"] = path
            if trainer.is_global_zero:
                # Every rank blocks on the save; only the writer measures it, so sizes add up once.
                size = path_bytes(path)
                if size is not None:
                    fields["bytes"] = size
        self.monitor.event("checkpoint_save", **fields)
        # The save's time is not the next step's.
        self._last_mark = now

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict[str, Any], **kwargs: Any) -> None:
        if self.monitor is None:
            return
        step = checkpoint.get("global_step")
        step = step if isinstance(step, int) else None
        path = str(trainer.ckpt_path or "")
        if step is not None:
            self._last_step = step
        loaded = getattr(self.monitor, "checkpoint_loaded", None)
        if loaded is not None:
            loaded(step, path)
        else:
            self.monitor.event("checkpoint_load", step=step, path=path)


def _learning_rate(trainer: pl.Trainer) -> float | None:
    try:
        lr = trainer.optimizers[0].param_groups[0]["lr"]
        return float(lr) if isinstance(lr, (int, float)) else None
    except (IndexError, KeyError, AttributeError, TypeError):
        return None


def _last_checkpoint_path(trainer: pl.Trainer) -> str | None:
    callback = trainer.checkpoint_callback
    for attribute in ("_last_checkpoint_saved", "last_model_path", "best_model_path"):
        path = getattr(callback, attribute, None)
        if path:
            return os.fspath(path)
    return None


def _config(pl_module: pl.LightningModule) -> dict[str, Any]:
    config: dict[str, Any] = {"framework": "lightning", "lightning": pl.__version__,
                              "module": type(pl_module).__name__}
    try:
        hparams = dict(pl_module.hparams)
        if hparams:
            config["hparams"] = hparams
    except Exception:
        pass
    return config
