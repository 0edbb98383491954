"""What the recipes (the example scripts and the benchmarks built on them) need at run time,
once their arguments are parsed: an export that replaces an earlier SavedModel only once the new
one is written, one line per epoch in logs, and a learning-rate schedule fitted to a budget of
training seconds.

The scripts' argument parsing (number options checked when parsed, run directories never
silently replaced, a quiet TensorFlow start) is in `examples/example_utils.py`, beside the
scripts: importing anything from `keras_attn` imports Keras and TensorFlow, which `--help` must
not wait for.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable


def _is_saved_model(path: str) -> bool:
    return os.path.isfile(os.path.join(path, "saved_model.pb"))


def clear_export_dir(export_dir: str) -> None:
    """Removes an earlier SavedModel at `export_dir` (only a SavedModel directory), so the new
    export holds no stale files; `check_run_dirs` has refused anything else."""
    if _is_saved_model(export_dir):
        shutil.rmtree(export_dir)


def write_export(export_dir: str, write: Callable[[str], object]) -> None:
    """Runs `write(path)` (an exporter writing a SavedModel at `path`) into a new directory
    beside `export_dir`, and only once it has succeeded puts it in place of `export_dir`,
    removing an earlier SavedModel there then: an export that fails (a bad argument, a full
    disk) leaves the earlier SavedModel as it was."""
    parent = os.path.dirname(os.path.abspath(export_dir))
    os.makedirs(parent, exist_ok=True)
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(export_dir)}.partial-", dir=parent)
    try:
        write(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    clear_export_dir(export_dir)
    if os.path.isdir(export_dir) and not os.listdir(export_dir):
        os.rmdir(export_dir)  # an empty directory made beforehand
    os.replace(staging, export_dir)


def fit_verbosity() -> int:
    """The `verbose` of `model.fit` in the examples: the progress bar (1) on a terminal, one
    line per epoch (2) when stdout is a file or a pipe, where the bar's carriage returns and
    control characters would fill the log."""
    return 1 if sys.stdout.isatty() else 2


def time_budget_callback(seconds: float, learning_rate: float, warmup_steps: int = 0,
                         decay_fraction: float = 0.3, alpha: float = 0.02,
                         average_checkpoints: int = 1, average_fraction: float = 0.15,
                         warmup_seconds: float | None = None):
    """A Keras callback that fits the learning-rate schedule to `seconds` of training and
    stops training when they are spent.

    The schedule is a function of the training time, not of a step count estimated in advance:
    a linear warm-up to `learning_rate` (over the first `warmup_steps` steps, or over
    `warmup_seconds` of training from the end of the first step), the peak rate
    until `1 - decay_fraction` of the budget is spent, then a linear decay to
    `alpha * learning_rate` at `seconds` (warm-up, stable, decay). Measured time follows the
    machine: on a shared machine whose speed changes during the run (other jobs starting or
    ending), a step count estimated from the first steps would end the decay early or late;
    the time itself does not. The price: the rate at a given step depends on how fast the
    steps ran, so two runs of the same seed differ slightly.

    Why this shape: a budget of minutes leaves the model far from converged, where the peak
    rate makes the most progress and only the final annealing pays. On English-French at 300 s
    (benchmarks/RESULTS.md) a cosine decay over the whole budget lost 4-6 BLEU to keeping the
    peak and decaying over the last 30%.

    Training seconds are the wall time of `model.fit` from its first training step, without
    the validation passes between epochs (and without anything before `fit`: loading data,
    learning vocabularies). The first steps include tracing the training function, as every
    run does. Training stops at the end of the first step that passes `seconds`.

    Args:
        seconds: float > 0, the budget of training seconds.
        learning_rate: float, the peak learning rate (the optimizer's is overwritten every
            step: give the optimizer a plain float rate, not a schedule).
        warmup_steps: int >= 0, steps of linear warm-up. Defaults to `0`.
        decay_fraction: float in (0, 1], the final share of the budget over which the rate
            decays. Defaults to `0.3`.
        alpha: float, the final rate as a fraction of `learning_rate`. Defaults to `0.02`.
        average_checkpoints: int >= 1, checkpoint averaging: when training ends the model's
            trainable weights become the mean of their values at this many evenly spaced
            moments of the last `average_fraction` of the budget, the last one the end (a copy
            of the weights at each; 1 keeps the final weights). Defaults to `1`.
        average_fraction: float in (0, 1], the final share of the budget whose weights are
            averaged. Defaults to `0.15`.
        warmup_seconds: float > 0 or None, a warm-up measured in training seconds instead of
            steps: the rate rises linearly from 0 at the end of the first step (which traces
            the training function, so its length says nothing about the steps after it) to
            `learning_rate` `warmup_seconds` later; the first step runs at rate 0. Only with
            `warmup_steps=0`. Defaults to `None` (the warm-up, if any, counts steps).

    Returns:
        The callback; after `fit`, its `summary()` gives the training seconds, the steps run,
        the steps and seconds of warm-up done, whether the budget ended the run and how many checkpoints
        were averaged, and when they were more than one its `final_weights` holds the
        trainable weights' values at the end (NumPy arrays, for comparison).
    """
    import time

    import keras
    import numpy as np

    for name, value in (("average_checkpoints", average_checkpoints),
                        ("warmup_steps", warmup_steps)):
        if not isinstance(value, int) or value < (1 if name == "average_checkpoints" else 0):
            raise ValueError(f"Argument `{name}` must be an integer of at least "
                             f"{1 if name == 'average_checkpoints' else 0}. Received: "
                             f"{name}={value!r}")
    if warmup_seconds is not None and not (warmup_seconds > 0 and warmup_steps == 0):
        raise ValueError("Argument `warmup_seconds` must be a positive number of seconds, and "
                         "only given with `warmup_steps=0`. Received: "
                         f"warmup_seconds={warmup_seconds!r}, warmup_steps={warmup_steps!r}")
    if not 0 < average_fraction <= 1:
        raise ValueError("Argument `average_fraction` must be in (0, 1]. Received: "
                         f"average_fraction={average_fraction!r}")
    decay_start = (1.0 - decay_fraction) * seconds
    # The moments whose weights are copied; the end of training is the last checkpoint.
    snapshot_times = [seconds * (1.0 - average_fraction * (1.0 - i / (average_checkpoints - 1)))
                      for i in range(average_checkpoints - 1)] if average_checkpoints > 1 else []

    class TimeBudget(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.start, self.paused, self.steps = time.perf_counter(), 0.0, 0
            self.spent, self.pause_start, self.total = False, None, 0.0
            self.sums, self.averaged, self.final_weights = None, 0, None
            self.first_step_end, self.warmup_done = None, 0

        def trained(self) -> float:
            return time.perf_counter() - self.start - self.paused

        def warmup(self) -> float:
            """The share of the peak rate the warm-up allows the next step, in [0, 1]."""
            if warmup_seconds is None:
                return min((self.steps + 1) / warmup_steps, 1.0) if warmup_steps else 1.0
            if self.first_step_end is None:
                return 0.0
            return min((self.trained() - self.first_step_end) / warmup_seconds, 1.0)

        def rate(self, warmup: float) -> float:
            progress = min(max((self.trained() - decay_start) / (seconds - decay_start), 0.0),
                           1.0)
            return learning_rate * warmup * (1.0 - (1.0 - alpha) * progress)

        def checkpoint(self) -> None:
            """Add the trainable weights now to the running sums (float64)."""
            values = [np.asarray(keras.ops.convert_to_numpy(w.value), "float64")
                      for w in self.model.trainable_weights]
            self.sums = values if self.sums is None else [
                total + value for total, value in zip(self.sums, values)]
            self.averaged += 1

        def on_train_end(self, logs=None):
            self.total = self.trained()
            if self.averaged:  # the end is the last checkpoint
                self.checkpoint()
                self.final_weights = [keras.ops.convert_to_numpy(w.value)
                                      for w in self.model.trainable_weights]
                for weight, total in zip(self.model.trainable_weights, self.sums):
                    weight.assign((total / self.averaged).astype(weight.dtype))
                self.sums = None

        def on_train_batch_begin(self, batch, logs=None):
            warmup = self.warmup()
            self.warmup_done += warmup < 1.0
            self.model.optimizer.learning_rate = self.rate(warmup)

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            if self.first_step_end is None:
                self.first_step_end = self.trained()
            if self.averaged < len(snapshot_times) and (
                    self.trained() >= snapshot_times[self.averaged]):
                self.checkpoint()
            if self.trained() >= seconds:
                self.spent = True
                self.model.stop_training = True

        # Validation between epochs is not training time.
        def on_test_begin(self, logs=None):
            self.pause_start = time.perf_counter()

        def on_test_end(self, logs=None):
            if self.pause_start is not None:
                self.paused += time.perf_counter() - self.pause_start
                self.pause_start = None

        def summary(self) -> dict:
            return {"time_budget_s": seconds, "trained_s": round(self.total, 1),
                    "steps": self.steps, "budget_spent": self.spent,
                    "warmup_steps_done": (self.warmup_done if warmup_seconds is not None
                                          else min(self.steps, warmup_steps)),
                    "warmup_s": warmup_seconds,
                    "checkpoints_averaged": self.averaged}

    return TimeBudget()
