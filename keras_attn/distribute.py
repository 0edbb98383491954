"""Training one Keras model on several machines with `tf.distribute`.

TensorFlow-only, so `import keras_attn` does not import it: `from keras_attn import distribute`.
The pieces follow TensorFlow's multi-worker Keras guide
(https://www.tensorflow.org/tutorials/distribute/multi_worker_with_keras):

- `multi_worker_strategy()`: a `tf.distribute.MultiWorkerMirroredStrategy` configured by the
  `TF_CONFIG` environment variable, which is checked first.
- `shard_by_data(dataset)`: every worker runs the same (identically seeded) input pipeline and
  keeps its own slice of each global batch (`AutoShardPolicy.DATA`), so a batch of `B` examples
  on `N` replicas is `N` slices of `B / N`, exactly the batch one machine would see.
- `WorkerBackupAndRestore`: `keras.callbacks.BackupAndRestore` for a cluster. Every worker
  restores from the one backup directory (which must be on storage all workers see); every worker
  saves, as the guide asks, but only the chief writes into that directory: the others write to a
  temporary directory that is deleted at once.
- `is_chief(strategy)`: whether this process writes metrics, plots and exports.

Why `multi_worker_strategy()` patches Keras' private trainer: Keras 3's `fit` on the
TensorFlow backend does not train on several `MultiWorkerMirroredStrategy` workers as one
machine would, in three places (each still so on Keras 3.15.1, checked by removing the fix and
running tests/test_distribute.py's two workers against one process, clipnorm 1.0):

- before the first step it averages a nested input batch across workers with one
  `strategy.reduce` call, which fails ("Attempt to convert a value (PerReplica ...) with an
  unsupported type"), and reading that batch shifts every epoch's shuffling by one;
- after each step it averages the scalar logs across workers along axis 0, which fails
  ("Invalid reduction dimension 0 for input with 0 dimensions");
- with several replicas, the optimizer clips each replica's gradient before they are summed,
  so `clipnorm` bounds partial gradients: the weights end 4.6e-4 away from one process's after
  4 steps (within 2e-6 with the fix).

`keras.distribution` (JAX) has none of this: it is the way to shard a model's weights
(`keras_attn.models.get_layout_map`). The patch replaces private functions, so it is applied
only to the Keras code it was checked on: `PATCHED_KERAS_SOURCES` fingerprints each function
it wraps or relies on; on a Keras whose code differs, `multi_worker_strategy()` raises instead
of training with fixes that may no longer fit (and a test fails, so that they are checked
again).

Example (the same script runs on every worker, with its own `TF_CONFIG`):
>>> strategy = distribute.multi_worker_strategy()
>>> with strategy.scope():
...     model = build_and_compile()
>>> model.fit(distribute.shard_by_data(dataset), epochs=3,
...           callbacks=[distribute.WorkerBackupAndRestore("shared/backup", strategy)])
>>> if distribute.is_chief(strategy):
...     model.save("shared/model.keras")
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import inspect
import json
import os
import shutil
import tempfile
import uuid

import keras
import tensorflow as tf

__all__ = [
    "PATCHED_KERAS_SOURCES",
    "WorkerBackupAndRestore",
    "changed_keras_internals",
    "is_chief",
    "multi_worker_strategy",
    "parse_tf_config",
    "patch_keras_for_multi_worker",
    "shard_by_data",
    "task",
]


def parse_tf_config(value: str | None = None) -> dict:
    """Reads and checks a `TF_CONFIG` value as TensorFlow documents it.

    `{"cluster": {"worker": ["host1:port", "host2:port"]}, "task": {"type": "worker",
    "index": 0}}`, optionally with a `"chief"` job of one address.

    Args:
        value: str, the JSON text. Defaults to `None` (the `TF_CONFIG` environment variable).

    Returns:
        The parsed dict.

    Raises:
        ValueError: naming `TF_CONFIG` when it is missing, not JSON, or its task is not one of
            its cluster's addresses.
    """
    if value is None:
        value = os.environ.get("TF_CONFIG")
    if not value:
        raise ValueError(
            "Multi-worker training needs the environment variable `TF_CONFIG`, e.g. "
            '{"cluster": {"worker": ["host1:12345", "host2:12345"]}, '
            '"task": {"type": "worker", "index": 0}}. Received: TF_CONFIG unset or empty'
        )
    try:
        config = json.loads(value)
    except json.JSONDecodeError as error:
        raise ValueError(f"`TF_CONFIG` must be JSON. Received: TF_CONFIG={value!r} ({error})")
    cluster = config.get("cluster") if isinstance(config, dict) else None
    task_spec = config.get("task") if isinstance(config, dict) else None
    if (
        not isinstance(cluster, dict)
        or not cluster.get("worker") and not cluster.get("chief")
        or not isinstance(task_spec, dict)
    ):
        raise ValueError(
            "`TF_CONFIG` must have a `cluster` with a `worker` (or `chief`) list of addresses "
            f"and a `task` with `type` and `index`. Received: TF_CONFIG={value!r}"
        )
    task_type, index = task_spec.get("type"), task_spec.get("index")
    jobs = cluster.get(task_type)
    if not isinstance(jobs, list) or not isinstance(index, int) or not 0 <= index < len(jobs):
        raise ValueError(
            "`TF_CONFIG` task must name a job of its cluster and an index into its addresses. "
            f"Received: task={task_spec!r}, cluster={cluster!r}"
        )
    return config


def _is_multi_worker(strategy) -> bool:
    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy) and (
        strategy.extended._in_multi_worker_mode()
    )


def _gradients_not_summed_yet() -> bool:
    """In the replica context of a strategy with several replicas, before the all-reduce."""
    return (
        tf.distribute.has_strategy()
        and not tf.distribute.in_cross_replica_context()
        and tf.distribute.get_strategy().num_replicas_in_sync > 1
    )


# What `patch_keras_for_multi_worker` assumes of Keras' private code: every function it wraps,
# or whose order of calls it relies on (`apply` clips, then `_backend_update_step` all-reduces;
# `_symbolic_build` takes specs), with the first 16 hex digits of the SHA-256 of its source in
# Keras 3.15.1, where each fix was checked and found still needed.
PATCHED_KERAS_SOURCES = {
    "keras.src.backend.tensorflow.trainer:TensorFlowTrainer._maybe_symbolic_build":
        "92a504f5eba9b29f",
    "keras.src.trainers.trainer:Trainer._symbolic_build": "96220cc3b88fe768",
    "keras.src.backend.tensorflow.trainer:reduce_per_replica": "2e7d54b1e6edc29a",
    "keras.src.optimizers.base_optimizer:BaseOptimizer.apply": "43097be63b919d03",
    "keras.src.optimizers.base_optimizer:BaseOptimizer._clip_gradients": "152b956e23c91ad9",
    "keras.src.backend.tensorflow.optimizer:TFOptimizer._backend_update_step":
        "00bd759c099a6b72",
    "keras.src.backend.tensorflow.optimizer:TFOptimizer._all_reduce_sum_gradients":
        "953512efa56c9680",
}


def _source_digest(name: str) -> str | None:
    """The fingerprint of Keras' own function `module:qualname` (through the patch's wrappers),
    None when this Keras lacks it or its source."""
    module_name, qualname = name.split(":")
    try:
        function = importlib.import_module(module_name)
        for part in qualname.split("."):
            function = getattr(function, part)
        source = inspect.getsource(inspect.unwrap(function))
    except (ImportError, AttributeError, OSError, TypeError):
        return None
    return hashlib.sha256(source.encode()).hexdigest()[:16]


def changed_keras_internals() -> list[str]:
    """The functions of `PATCHED_KERAS_SOURCES` that this Keras lacks or has changed: empty
    when `patch_keras_for_multi_worker` may patch it."""
    return [name for name, digest in PATCHED_KERAS_SOURCES.items()
            if _source_digest(name) != digest]


def patch_keras_for_multi_worker() -> None:
    """Makes Keras 3's `fit` under `tf.distribute` train as one machine would, on several workers.

    Keras 3 (checked on 3.15) differs from that in three places, the first two only when a
    `MultiWorkerMirroredStrategy` spans several workers (keras-team/keras#20585,
    tensorflow/tensorflow#72388), where `fit` fails:

    - before the first step, `fit` averages a whole nested input batch across workers with one
      `strategy.reduce` call to learn its shapes, which cannot take a nested structure; the
      patch builds from the dataset's `element_spec` instead (only shapes and dtypes are used),
      which also leaves the data untouched: reading that batch started a pass over the data,
      so every epoch was shuffled as the next one would have been on one machine;
    - after each step, it averages the scalar logs (loss, metrics) across workers along axis 0,
      which scalars do not have; the patch averages them elementwise (`axis=None`), the mean
      over replicas that the logs are meant to be;
    - with any strategy of several replicas, the optimizer clips gradients (`clipnorm`,
      `global_clipnorm`, `clipvalue`) on each replica before they are summed, so a clip bound
      is applied to partial gradients; the patch clips the summed gradient, as on one machine.

    Everything else goes to Keras' own code. Idempotent; `multi_worker_strategy()` calls it.
    Applied only to the Keras code it was checked on (`PATCHED_KERAS_SOURCES`).

    Raises:
        RuntimeError: if this Keras lacks or has changed a function the patch wraps or relies
            on (`changed_keras_internals()`), so that the fixes may no longer fit it.
    """
    changed = changed_keras_internals()
    if changed:
        raise RuntimeError(
            "keras_attn.distribute fixes Keras' multi-worker `fit` by replacing private "
            "functions, checked on Keras 3.15.1; this Keras "
            f"({keras.__version__}) lacks or has changed {changed}, so the fixes may no longer "
            "fit it. Train on several workers with Keras 3.15, or with a keras_attn checked "
            "against this Keras."
        )
    from keras.src import tree
    from keras.src.backend.tensorflow import optimizer as tf_optimizer
    from keras.src.backend.tensorflow import trainer as tf_trainer

    if getattr(tf_trainer, "_keras_attn_multi_worker_patch", False):
        return
    trainer, optimizer = tf_trainer.TensorFlowTrainer, tf_optimizer.TFOptimizer
    original_build = trainer._maybe_symbolic_build
    original_reduce = tf_trainer.reduce_per_replica
    original_clip = optimizer._clip_gradients
    original_all_reduce = optimizer._all_reduce_sum_gradients

    @functools.wraps(original_build)
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if iterator is None or strategy is None or not _is_multi_worker(strategy):
            return original_build(self, iterator=iterator, data_batch=data_batch)
        spec = iterator.data_adapter.get_tf_dataset().element_spec
        return original_build(self, data_batch=spec)

    @functools.wraps(original_reduce)
    def reduce_per_replica(values, strategy, reduction):
        if reduction not in ("auto", "mean") or not _is_multi_worker(strategy):
            return original_reduce(values, strategy, reduction)

        def reduce(value):
            local = strategy.experimental_local_results(value)[0]
            if local.shape.rank == 0:
                return strategy.reduce("MEAN", value, axis=None)
            return original_reduce(value, strategy, reduction)

        return tree.map_structure(reduce, values)

    @functools.wraps(original_clip)
    def _clip_gradients(self, grads):
        if _gradients_not_summed_yet():
            return grads  # clipped in `_all_reduce_sum_gradients`, once summed
        return original_clip(self, grads)

    @functools.wraps(original_all_reduce)
    def _all_reduce_sum_gradients(self, grads_and_vars):
        pairs = original_all_reduce(self, grads_and_vars)
        if not _gradients_not_summed_yet():
            return pairs
        present = [i for i, (grad, _) in enumerate(pairs) if grad is not None]
        clipped = original_clip(self, [pairs[i][0] for i in present])
        pairs = list(pairs)
        for i, grad in zip(present, clipped):
            pairs[i] = (grad, pairs[i][1])
        return pairs

    trainer._maybe_symbolic_build = _maybe_symbolic_build
    tf_trainer.reduce_per_replica = reduce_per_replica
    optimizer._clip_gradients = _clip_gradients
    optimizer._all_reduce_sum_gradients = _all_reduce_sum_gradients
    tf_trainer._keras_attn_multi_worker_patch = True


def multi_worker_strategy(
    communication: str = "auto",
) -> tf.distribute.MultiWorkerMirroredStrategy:
    """A `MultiWorkerMirroredStrategy` for the cluster in `TF_CONFIG`.

    Call it at the start of the program, before any other TensorFlow work, on every worker. Each
    worker mirrors the variables on its local devices; gradients are summed over all replicas of
    all workers after every step, so all copies stay identical. It also applies
    `patch_keras_for_multi_worker()`, without which Keras 3's `fit` fails on several workers
    and clips gradients before summing them.

    Args:
        communication: str, the all-reduce: `"auto"`, `"ring"` (gRPC, what CPUs use) or
            `"nccl"` (GPUs). Defaults to `"auto"`.

    Returns:
        The strategy; `strategy.num_replicas_in_sync` counts the replicas of all workers.

    Raises:
        ValueError: if `TF_CONFIG` is missing or malformed (see `parse_tf_config`), or for an
            unknown `communication`.
    """
    implementations = {
        "auto": tf.distribute.experimental.CommunicationImplementation.AUTO,
        "ring": tf.distribute.experimental.CommunicationImplementation.RING,
        "nccl": tf.distribute.experimental.CommunicationImplementation.NCCL,
    }
    if communication not in implementations:
        raise ValueError(
            "Received an invalid value for argument `communication`, expected one of "
            f"{sorted(implementations)}. Received: communication={communication!r}"
        )
    parse_tf_config()
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=implementations[communication]
    )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
    patch_keras_for_multi_worker()
    return strategy


def task(strategy=None) -> tuple[str | None, int | None]:
    """`(task_type, task_id)` of this process in its cluster, `(None, None)` on one machine."""
    strategy = strategy or tf.distribute.get_strategy()
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.cluster_spec().as_dict():
        return None, None
    return resolver.task_type, resolver.task_id


def is_chief(strategy=None) -> bool:
    """Whether this process is the chief: the `chief` task, else worker 0, else a lone process.

    The chief writes what a run leaves behind (backups, metrics, plots, exports); the other
    workers compute the same steps and keep nothing.
    """
    task_type, task_id = task(strategy)
    return task_type in (None, "chief") or (task_type == "worker" and task_id == 0)


def shard_by_data(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Shards a batched in-memory pipeline across workers by data (`AutoShardPolicy.DATA`).

    File-based sharding does not apply to `from_tensor_slices` pipelines; with DATA, every worker
    builds the whole pipeline, the distributed dataset splits each global batch into one slice
    per replica, and each worker keeps the slices of its own replicas. The batch size given to
    the pipeline is therefore the global batch size. Every worker must shuffle with the same
    seed, or workers would see overlapping examples.

    Args:
        dataset: a batched `tf.data.Dataset`.

    Returns:
        The same dataset with the DATA auto-shard policy set.
    """
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return dataset.with_options(options)


class WorkerBackupAndRestore(keras.callbacks.BackupAndRestore):
    """`keras.callbacks.BackupAndRestore` for several workers sharing one backup directory.

    At the start of `fit` every worker restores the weights, optimizer state and epoch from
    `backup_dir`, so a restarted cluster continues after the last finished epoch. At the end of
    each epoch every worker saves, but only the chief writes to `backup_dir`; the other workers
    write to a temporary directory of their own and delete it at once, as TensorFlow's guide
    does: a save that reads on-read variables (metrics) is a collective all workers must join.
    (Keras 3.15 saves layer and optimizer variables only, which need none, so this is a
    precaution.) On one machine (no cluster) it is exactly `BackupAndRestore(backup_dir)`.

    What is restored: weights, optimizer state (step count, moments) and the epoch. What is
    not: the position of shuffling (a resumed run shuffles its first epoch as a fresh run does)
    and dropout's random state, so a resumed run equals an uninterrupted one only without them.

    Args:
        backup_dir: str, directory of the backup; on storage every worker can read (a shared
            file system or a bucket) when there are several machines.
        strategy: the `tf.distribute` strategy. Defaults to `None` (the current one).
        **kwargs: `save_freq`, `double_checkpoint`, `delete_checkpoint` of `BackupAndRestore`.
    """

    def __init__(self, backup_dir: str, strategy=None, **kwargs):
        self._is_chief = is_chief(strategy)
        write_dir = backup_dir
        if not self._is_chief:  # created by each save, deleted right after it
            task_type, task_id = task(strategy)
            write_dir = os.path.join(
                tempfile.gettempdir(), f"keras_attn_backup_{task_type}{task_id}_{uuid.uuid4().hex}"
            )
        super().__init__(write_dir, **kwargs)
        self.read_dir = backup_dir

    def _load_model(self):
        # The base class reads and writes the same paths; read the chief's.
        write_paths = self._weights_path, self._training_metadata_path
        self._weights_path = os.path.join(self.read_dir, os.path.basename(write_paths[0]))
        self._training_metadata_path = os.path.join(
            self.read_dir, os.path.basename(write_paths[1])
        )
        try:
            super()._load_model()
        finally:
            self._weights_path, self._training_metadata_path = write_paths

    def _save_model(self):
        super()._save_model()
        if not self._is_chief:
            shutil.rmtree(self.backup_dir, ignore_errors=True)

    def on_train_end(self, logs=None):
        if self._is_chief:
            super().on_train_end(logs)
