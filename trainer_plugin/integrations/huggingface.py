"""Runwatch for the 🤗 transformers ``Trainer``, in one line:

    from trainer_plugin.integrations.huggingface import RunwatchCallback

    trainer = Trainer(model=model, args=args, train_dataset=train,
                      callbacks=[RunwatchCallback(project="llm", run="gpt2-small")])

Every process (rank) reports its own steps: the Monitor is per rank, so there is no rank-zero guard
here. What each hook records:

- ``on_train_begin``: a Monitor for this rank (``start``), with the training arguments as the run's
  config; when training resumes from a checkpoint, a ``checkpoint_load`` at the restored step.
- ``on_step_end`` / ``on_log``: one step row per optimizer step, at ``state.global_step``, with the
  time since the previous step; on logging steps also ``loss``, ``lr``, ``grad_norm``, ``epoch`` and
  any other number the trainer logged; ``tokens`` from ``state.num_input_tokens_seen`` when the
  trainer counts them (``include_num_input_tokens_seen=True``).
- ``on_save``: ``checkpoint_save`` with the step, the checkpoint directory, the time the save blocked
  training, and its size (from the process that writes it).
- ``on_train_end``: ``finish``.

transformers has no exception hook. An exception out of ``trainer.train()`` that ends the program
is recorded by the Monitor's ``sys.excepthook`` as an ``interruption`` with its traceback, and the
run is closed as failed at exit; a script that catches it and goes on should record it itself
(``callback.record_exception(exc)``) or use ``with callback.monitor:``.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from trainer_plugin.integrations import path_bytes, record_exception, start_monitor
from trainer_plugin.monitor import Monitor
from trainer_plugin.protocol import _METRIC_NAME

#: Logged numbers that belong to one step under another name.
RENAMED = {"learning_rate": "lr"}
#: What the trainer logs once at the end of training, or for an evaluation: not a step's.
NOT_STEP_METRICS = ("train_runtime", "train_samples_per_second", "train_steps_per_second",
                    "total_flos", "train_loss", "train_tokens_per_second")
NOT_STEP_PREFIXES = ("eval_", "test_", "predict_")


class RunwatchCallback(TrainerCallback):
    """``project`` and ``run`` default to RUNWATCH_PROJECT / RUNWATCH_RUN, then the run name in the
    training arguments, then the script's name; the other keyword arguments go to ``Monitor``.
    Pass ``monitor=`` to report through a Monitor you made yourself (it is not closed here)."""

    def __init__(self, project: str | None = None, run: str | None = None, *,
                 monitor: Monitor | None = None, **monitor_kwargs: Any):
        self.project = project
        self.run = run
        self.monitor = monitor
        self._owns_monitor = monitor is None
        self._monitor_kwargs = monitor_kwargs
        self._training = False
        self._pending: tuple[int, float, int | None] | None = None
        self._last_mark: float | None = None
        self._tokens_seen = 0

    # --- start and end ----------------------------------------------------------------------------

    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        if self._owns_monitor and not self._training:
            # One monitor per train() call: a second call is a new start of the same run.
            run = self.run or os.environ.get("RUNWATCH_RUN") or _run_name(args)
            options = dict(self._monitor_kwargs)
            config = options.pop("config", None) or _config(args, kwargs.get("model"))
            self.monitor = start_monitor(self.project, run, rank=args.process_index,
                                         local_rank=args.local_process_index,
                                         world_size=args.world_size, config=config,
                                         monitor_kwargs=options)
        self._training = True
        self._pending = None
        self._last_mark = time.perf_counter()
        self._tokens_seen = _tokens_seen(state) or 0
        if state.global_step > 0 and self.monitor is not None:
            # Resumed: the trainer restored this step from output_dir/checkpoint-<step>.
            path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            loaded = getattr(self.monitor, "checkpoint_loaded", None)
            if loaded is not None:
                loaded(state.global_step, path)
            else:
                self.monitor.event("checkpoint_load", step=state.global_step, path=path)

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        self._flush()
        self._training = False
        if self._owns_monitor and self.monitor is not None:
            self.monitor.close("finished")

    def record_exception(self, exception: BaseException) -> None:
        """For a script that catches what ``trainer.train()`` raised: records it as the
        interruption and closes the monitor as failed."""
        if self.monitor is not None:
            record_exception(self.monitor, exception)

    # --- steps -------------------------------------------------------------------------------------

    def on_step_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                      **kwargs: Any) -> None:
        self._flush()

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        now = time.perf_counter()
        duration = now - self._last_mark if self._last_mark is not None else None
        self._last_mark = now
        seen = _tokens_seen(state)
        tokens = None
        if seen:
            tokens = seen - self._tokens_seen
            self._tokens_seen = seen
        self._flush()
        self._pending = (state.global_step, duration, tokens)
        # The trainer logs after this hook when it decided to (DefaultFlowCallback ran first): then
        # the step waits for its loss in on_log; otherwise it goes now.
        if not control.should_log:
            self._flush()

    def on_log(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
               logs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        if self._pending is None or self._pending[0] != state.global_step or not logs:
            return
        self._flush(_step_metrics(logs))

    def _flush(self, metrics: dict[str, float] | None = None) -> None:
        pending, self._pending = self._pending, None
        if pending is None or self.monitor is None:
            return
        step, duration, tokens = pending
        self.monitor.step(step, duration_s=duration, tokens=tokens, **(metrics or {}))

    # --- checkpoints and evaluation -----------------------------------------------------------------

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        # Evaluation runs between a step and its save; the save's blocking time starts after it.
        self._flush()
        self._last_mark = time.perf_counter()

    def on_save(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                **kwargs: Any) -> None:
        self._flush()
        now = time.perf_counter()
        blocked = now - self._last_mark if self._last_mark is not None else None
        if self.monitor is None:
            return
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        fields: dict[str, Any] = {"step": state.global_step, "path": path}
        if blocked is not None:
            fields["duration_s"] = blocked
        if args.should_save:
            # Every rank blocks on the save; only the writer measures it, so sizes add up once.
            size = path_bytes(path)
            if size is not None:
                fields["bytes"] = size
        self.monitor.event("checkpoint_save", **fields)
        self._last_mark = time.perf_counter()


def _tokens_seen(state: TrainerState) -> int | None:
    seen = getattr(state, "num_input_tokens_seen", None)
    try:
        return int(seen) if seen else None
    except (TypeError, ValueError):
        return None


def _step_metrics(logs: dict[str, Any]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for name, value in logs.items():
        if name in NOT_STEP_METRICS or name.startswith(NOT_STEP_PREFIXES):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        name = RENAMED.get(name, name)
        if _METRIC_NAME.match(name):
            metrics[name] = float(value)
    return metrics


def _run_name(args: TrainingArguments) -> str | None:
    # Older transformers default run_name to output_dir, a path rather than a name.
    name = getattr(args, "run_name", None)
    if not name or name == args.output_dir:
        return None
    return str(name)


def _config(args: TrainingArguments, model: Any) -> dict[str, Any]:
    import transformers

    config: dict[str, Any] = {"framework": "transformers", "transformers": transformers.__version__}
    try:
        config["training_args"] = args.to_sanitized_dict()
    except Exception:
        pass
    model_config = getattr(model, "config", None)
    for key in ("model_type", "n_layer", "num_hidden_layers", "hidden_size", "n_embd",
                "vocab_size"):
        value = getattr(model_config, key, None)
        if isinstance(value, (str, int)):
            config.setdefault("model", {})[key] = value
    return config
