"""Training past one machine: tf.distribute workers on localhost, and JAX's keras.distribution.

The multi-worker tests start real worker processes (tests/distribute_worker.py) on free localhost
ports, each bounded by a deadline and killed at the end whatever happens. Two workers train the
tiny dates Transformer for 3 epochs of 4 steps (global batch 32); worker 1 stops after epoch 1
(the examples' `--interrupt-after`, as if killed there) and the chief, missing its peer in epoch
2, stops too; a single process with the same global batch is interrupted the same way. That
first phase (about a minute) is in the default run. Restarting all three and finishing the run
from the backups, and the full example CLI on two workers, are `slow` tests.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

import keras
import numpy as np
import pytest
from backend_utils import run_once

REPO = pathlib.Path(__file__).resolve().parents[1]
WORKER = REPO / "tests" / "distribute_worker.py"
EXAMPLES = REPO / "examples"
PHASE_SECONDS = 420  # per phase; a phase takes 30-60 s on this 2-core machine
LOST_PEER_SECONDS = 120  # for a worker to notice that its peer is gone (measured: 9 s)

tf_only = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                             reason="tf.distribute runs on the TensorFlow backend")

# Two workers against one process after 4, 8 and 12 Adam steps (lr 2e-3): weights measured at
# most 1.2e-7 apart (float32 sums in another order), except the key biases: softmax ignores
# them, so their true gradient is 0 and Adam normalises the round-off into real steps (measured
# 1.8e-6, 4.2e-6, 4.3e-6). Each mistake these tolerances guard against moves other weights by
# >= 4.8e-4 after 8 steps: clipping per replica 4.8e-4, a loss not divided by the number of
# replicas 6.9e-4, shuffling shifted by one epoch 1.2e-2.
WEIGHT_ATOL = 2e-6
KEY_BIAS_ATOL = 3e-5


def free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("localhost", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def process_env(tmp: pathlib.Path, tf_config: dict | None = None) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "TF_CONFIG"}
    env.update(PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
               KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3", CI="1", TMPDIR=str(tmp),
               # 2 cores, up to 4 processes: one thread each keeps them from starving.
               TF_NUM_INTRAOP_THREADS="1", TF_NUM_INTEROP_THREADS="1")
    if tf_config is not None:
        env["TF_CONFIG"] = json.dumps(tf_config)
    return env


class Processes:
    """Starts processes that write to log files; `stop_all` kills whatever still runs."""

    def __init__(self, root: pathlib.Path):
        self.root, self.started = root, []

    def start(self, name: str, command: list[str], env: dict) -> subprocess.Popen:
        path = self.root / f"{name}.log"
        with open(path, "w") as log:  # the child keeps its own copy of the descriptor
            process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                       cwd=self.root)
        process.log_path = path
        self.started.append(process)
        return process

    def cluster(self, name: str, script_args: list[str], worker_args: dict | None = None):
        """Two workers of one `TF_CONFIG` cluster on free localhost ports."""
        addresses = [f"localhost:{port}" for port in free_ports(2)]
        return [
            self.start(f"{name}_worker{index}",
                       [*script_args, *(worker_args or {}).get(index, [])],
                       process_env(self.root, {"cluster": {"worker": addresses},
                                               "task": {"type": "worker", "index": index}}))
            for index in range(2)
        ]

    def stop_all(self):
        for process in self.started:
            if process.poll() is None:
                process.kill()
        for process in self.started:
            process.wait(timeout=60)


@contextlib.contextmanager
def processes(root: pathlib.Path):
    group = Processes(root)
    try:
        yield group
    finally:
        group.stop_all()


def log(process) -> str:
    return pathlib.Path(process.log_path).read_text()


def wait(process, deadline: float) -> int:
    try:
        return process.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        process.kill()
        raise AssertionError(f"timed out; log tail:\n{log(process)[-3000:]}") from None


def load(path: pathlib.Path) -> dict:
    with np.load(path) as arrays:
        return dict(arrays)


def max_difference(a: dict, b: dict, key_biases: bool = False) -> float:
    """Largest elementwise difference over the key biases, or over all other variables."""
    assert a.keys() == b.keys()
    return max(float(np.max(np.abs(a[key] - b[key]))) for key in a
               if key.endswith("key_dense/bias") == key_biases)


@pytest.fixture(scope="module")
def first_phase(tmp_path_factory):
    """Two workers and one process until worker 1 stops after epoch 1; what they left."""
    root = tmp_path_factory.mktemp("distribute")
    cluster_out, single_out = root / "cluster", root / "single"
    script = [sys.executable, str(WORKER), "--epochs", "3"]
    result = {"root": root, "cluster": cluster_out, "single": single_out, "script": script}
    with processes(root) as group:
        deadline = time.monotonic() + PHASE_SECONDS
        workers = group.cluster("first", [*script, "--out", str(cluster_out)],
                                {1: ["--interrupt-after", "1"]})
        single = group.start("first_single", [*script, "--out", str(single_out),
                                              "--interrupt-after", "1"], process_env(root))
        result["worker1_rc"] = wait(workers[1], deadline)
        result["worker1_log"] = log(workers[1])
        # The chief, in epoch 2, misses its peer's heartbeats and stops (measured: 9 s).
        result["chief_rc"] = wait(workers[0], time.monotonic() + LOST_PEER_SECONDS)
        result["chief_log"] = log(workers[0])
        result["single_rc"] = wait(single, deadline)
    result["backup"] = sorted(os.listdir(cluster_out / "backup"))
    result["metadata"] = json.loads((cluster_out / "backup" / "training_metadata.json").read_text())
    result["temporary_files"] = temporary_files(root)
    return result


@pytest.fixture(scope="module")
def second_phase(first_phase):
    """The same three processes restarted on the backups, to the end of epoch 3."""
    root, script = first_phase["root"], first_phase["script"]
    with processes(root) as group:
        deadline = time.monotonic() + PHASE_SECONDS
        started = [*group.cluster("second", [*script, "--out", str(first_phase["cluster"])]),
                   group.start("second_single", [*script, "--out", str(first_phase["single"])],
                               process_env(root))]
        rcs = [wait(p, deadline) for p in started]
        assert rcs == [0, 0, 0], "\n".join(log(p)[-3000:] for p in started)
    return {**first_phase, "temporary_files": temporary_files(root)}


def temporary_files(root: pathlib.Path) -> list[str]:
    """What non-chief workers left in their temporary directory (TMPDIR is `root`)."""
    return sorted(p.name for p in root.iterdir() if p.name.startswith("keras_attn_backup"))


def assert_same_weights(runs, epoch: int):
    cluster, single = runs["cluster"], runs["single"]
    chief = load(cluster / f"weights_worker0_epoch{epoch}.npz")
    other, one = (load(out / f"weights_{name}_epoch{epoch}.npz")
                  for out, name in [(cluster, "worker1"), (single, "single")])
    assert max_difference(chief, other) == max_difference(chief, other, True) == 0.0
    difference = max_difference(chief, one)
    assert difference <= WEIGHT_ATOL, (epoch, difference)
    difference = max_difference(chief, one, key_biases=True)
    assert difference <= KEY_BIAS_ATOL, (epoch, difference)
    logs = [json.loads((out / f"logs_{name}_epoch{epoch}.json").read_text())
            for out, name in [(cluster, "worker0"), (cluster, "worker1"), (single, "single")]]
    assert logs[0] == logs[1]
    assert logs[0]["iterations"] == logs[2]["iterations"] == 4 * epoch
    np.testing.assert_allclose(logs[0]["loss"], logs[2]["loss"], rtol=1e-5)


@tf_only
def test_two_workers_reach_the_weights_of_one_process(first_phase):
    assert first_phase["worker1_rc"] == 3, first_phase["worker1_log"][-3000:]
    assert first_phase["single_rc"] == 3
    assert_same_weights(first_phase, epoch=1)


@tf_only
def test_a_lost_worker_stops_the_others_and_only_the_chief_backs_up(first_phase):
    runs = first_phase
    assert "interrupted after epoch 1" in runs["worker1_log"]
    assert runs["chief_rc"] == 1, runs["chief_log"][-3000:]
    assert "UnavailableError" in runs["chief_log"]
    assert runs["metadata"] == {"epoch": 1, "batch": 0}
    # Worker 1 saved too, into a temporary directory that is gone.
    assert runs["backup"] == ["latest.weights.h5", "training_metadata.json"]
    assert runs["temporary_files"] == []


@tf_only
@pytest.mark.slow
def test_restarted_workers_resume_without_losing_or_redoing_an_epoch(second_phase):
    runs = second_phase
    for epoch in (2, 3):
        assert_same_weights(runs, epoch)  # steps 8 and 12, not 4 + 12 or 0 + 8
    for out, name in [(runs["cluster"], "worker0"), (runs["cluster"], "worker1"),
                      (runs["single"], "single")]:
        history = json.loads((out / f"history_{name}.json").read_text())
        assert len(history["loss"]) == 2, name  # epochs 2 and 3: epoch 1 came from the backup
        assert history["iterations"] == 3 * 4, name  # 8 if an epoch were lost, 16 if redone
    assert not (runs["cluster"] / "backup").exists()  # the chief removes it when training ends
    assert runs["temporary_files"] == []


@tf_only
@pytest.mark.parametrize("value,match", [
    (None, "TF_CONFIG unset"),
    ("{not json", "must be JSON"),
    ('{"cluster": {"worker": ["localhost:1"]}}', "must have a `cluster`"),
    ('{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "worker", "index": 1}}',
     "index into its addresses"),
    ('{"cluster": {"worker": ["localhost:1"]}, "task": {"type": "chief", "index": 0}}',
     "name a job of its cluster"),
])
def test_tf_config_is_checked(value, match, monkeypatch):
    from keras_attn import distribute

    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(ValueError, match=match):
        distribute.parse_tf_config(value)


@tf_only
def test_tf_config_as_tensorflow_documents_it():
    from keras_attn import distribute

    config = {"cluster": {"chief": ["host0:2222"], "worker": ["host1:2222", "host2:2222"]},
              "task": {"type": "worker", "index": 1}}
    assert distribute.parse_tf_config(json.dumps(config)) == config


@tf_only
def test_one_process_is_its_own_chief_and_shards_by_data():
    import tensorflow as tf

    from keras_attn import distribute

    assert distribute.task() == (None, None) and distribute.is_chief()
    dataset = distribute.shard_by_data(tf.data.Dataset.range(8).batch(4))
    policy = dataset.options().experimental_distribute.auto_shard_policy
    assert policy == tf.data.experimental.AutoShardPolicy.DATA
    assert [b.numpy().tolist() for b in dataset] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def _stub_strategy(task_type: str, task_id: int):
    """What `WorkerBackupAndRestore` reads of a strategy: its cluster and task."""
    import types

    import tensorflow as tf

    spec = tf.train.ClusterSpec({"worker": ["localhost:1", "localhost:2"]})
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        spec, task_type=task_type, task_id=task_id)
    return types.SimpleNamespace(cluster_resolver=resolver)


def _fit(backup_dir, strategy=None, interrupt_after=None, epochs=3):
    from keras_attn import distribute

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.SGD(0.1), "mse")

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if interrupt_after is not None and epoch + 1 >= interrupt_after:
                raise KeyboardInterrupt

    x = np.arange(32, dtype="float32").reshape(8, 4) / 32
    callbacks = [distribute.WorkerBackupAndRestore(str(backup_dir), strategy), Interrupt()]
    try:
        history = model.fit(x, x[:, :2], batch_size=4, epochs=epochs, shuffle=False,
                            callbacks=callbacks, verbose=0)
    except KeyboardInterrupt:
        return model, None
    return model, history


@tf_only
def test_a_non_chief_restores_the_chief_backup_and_writes_elsewhere(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    backup = tmp_path / "backup"
    _fit(backup, interrupt_after=1)  # one machine: a chief, writing the backup of epoch 1
    files = {p.name: p.read_bytes() for p in backup.iterdir()}
    assert json.loads(files["training_metadata.json"]) == {"epoch": 1, "batch": 0}

    model, history = _fit(backup, _stub_strategy("worker", 1))
    assert len(history.history["loss"]) == 2  # resumed at epoch 2
    assert int(model.optimizer.iterations.numpy()) == 3 * 2
    assert {p.name: p.read_bytes() for p in backup.iterdir()} == files  # untouched, kept
    assert list((tmp_path / "tmp").iterdir()) == []  # its own copies were deleted

    reference, _ = _fit(tmp_path / "uninterrupted")
    for a, b in zip(model.get_weights(), reference.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@tf_only
def test_example_multi_worker_needs_tf_config(tmp_path):
    env = process_env(tmp_path)
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "transformer_translation.py"), "--strategy",
         "multi_worker", "--out", str(tmp_path / "out"), "--num-examples", "100"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env, check=False)
    assert result.returncode != 0
    assert "needs the environment variable `TF_CONFIG`" in result.stderr
    assert not (tmp_path / "out").exists()


@tf_only
def test_keras_has_the_code_the_multi_worker_patch_was_checked_on():
    """Fails when Keras changes a private function `patch_keras_for_multi_worker` wraps or
    relies on. Then check each fix against the new code (the two-worker tests above, with and
    without it), and update `PATCHED_KERAS_SOURCES` or drop the fixes Keras made needless."""
    from keras_attn import distribute

    assert distribute.changed_keras_internals() == []


@tf_only
def test_the_patch_refuses_keras_code_it_was_not_checked_on(monkeypatch):
    from keras.src.backend.tensorflow import trainer

    from keras_attn import distribute

    changed, gone = ("keras.src.backend.tensorflow.trainer:reduce_per_replica",
                     "keras.src.backend.tensorflow.trainer:TensorFlowTrainer.gone")
    monkeypatch.setitem(distribute.PATCHED_KERAS_SOURCES, changed, "0" * 16)
    monkeypatch.setitem(distribute.PATCHED_KERAS_SOURCES, gone, "0" * 16)
    assert distribute.changed_keras_internals() == [changed, gone]
    with pytest.raises(RuntimeError, match="has changed .*reduce_per_replica.*gone"):
        distribute.patch_keras_for_multi_worker()
    assert not hasattr(trainer.reduce_per_replica, "__wrapped__")  # nothing was patched


LIBRARY_LOSS_ON_TWO_REPLICAS = """
import numpy as np, tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from keras_attn.metrics import MaskedSequenceLoss

def train(strategy):
    keras.utils.set_random_seed(0)
    with strategy.scope():
        model = keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(7, 4),
                                  keras.layers.Dense(7)])
        model.compile(keras.optimizers.SGD(0.5), MaskedSequenceLoss())
    ids = np.random.default_rng(0).integers(1, 7, (8, 5)).astype("int32")
    model.fit(ids, ids, batch_size=8, epochs=1, shuffle=False, verbose=0)
    return model.get_weights()

one = train(tf.distribute.get_strategy())
two = train(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]))
print(max(float(np.abs(a - b).max()) for a, b in zip(one, two)))
"""


@tf_only
def test_library_loss_is_averaged_over_replicas(tmp_path):
    """MaskedSequenceLoss gives per-example values, so Keras divides by the replicas: two
    replicas train as one process does."""
    result = subprocess.run([sys.executable, "-c", LIBRARY_LOSS_ON_TWO_REPLICAS],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path,
                            env=process_env(tmp_path), check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(result.stdout.split()[-1]) < 1e-6


JAX_PARALLEL = """
import contextlib, json, keras, numpy as np
from keras_attn.layers import FFN, MultiHead

V, T, D, H = 32, 16, 16, 2

def causal_lm():
    keras.utils.set_random_seed(0)
    ids = keras.Input((T,), dtype="int32")
    x = keras.layers.Embedding(V, D, name="embed")(ids)
    x = keras.layers.LayerNormalization(name="norm1")(
        x + MultiHead(H, D // H, name="attention")(x, use_causal_mask=True))
    x = keras.layers.LayerNormalization(name="norm2")(x + FFN(4 * D, D, name="ffn")(x))
    model = keras.Model(ids, keras.layers.Dense(V, name="head")(x))
    model.compile(keras.optimizers.Adam(1e-2),
                  keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model

start = np.random.default_rng(0).integers(0, V, (64, 1))
tokens = ((start + np.arange(T + 1)) % V).astype("int32")  # counting modulo V

def train(distribution):
    with distribution.scope() if distribution else contextlib.nullcontext():
        model = causal_lm()
        history = model.fit(tokens[:, :-1], tokens[:, 1:], batch_size=16, epochs=2,
                            shuffle=False, verbose=0)
    return model, history.history["loss"]

devices = keras.distribution.list_devices()
data_parallel = keras.distribution.DataParallel(devices=devices)
mesh = keras.distribution.DeviceMesh((1, 2), ("batch", "model"), devices)
layout = keras.distribution.LayoutMap(mesh)
layout["attention/(query|key|value)_dense/kernel"] = (None, "model")  # heads split over devices
layout["attention/output_dense/kernel"] = ("model", None)
layout["ffn/hidden_dense/kernel"] = (None, "model")
layout["ffn/output_dense/kernel"] = ("model", None)
model_parallel = keras.distribution.ModelParallel(layout_map=layout, batch_dim_name="batch")

one, one_loss = train(None)
report = {"devices": len(devices), "one_loss": one_loss}
for name, distribution in [("data", data_parallel), ("model", model_parallel)]:
    model, loss = train(distribution)
    report[name] = {
        "loss": loss,
        "weights": max(float(np.abs(np.asarray(a.value) - np.asarray(b.value)).max())
                       for a, b in zip(model.weights, one.weights)),
        "shards": {w.path: list(w.value.addressable_shards[0].data.shape)
                   for w in model.weights if w.path.endswith("kernel")},
        "batch_layout": list(distribution.get_data_layout((16, T)).axes),
    }
print(json.dumps(report))
"""


@run_once
def test_jax_data_and_model_parallel_train_as_one_device(tmp_path):
    """A small causal LM (Embedding + causal MultiHead + FFN + Dense head) with `model.fit` on
    two JAX CPU devices, split by batch (DataParallel) and by heads (ModelParallel with a
    LayoutMap over the attention and FFN projections), against one device. Measured: losses
    equal to 2e-7, weights after 8 Adam steps (lr 1e-2) within 1.3e-6; the tolerance leaves
    ~10x margin."""
    pytest.importorskip("jax")
    env = process_env(tmp_path)
    env.update(KERAS_BACKEND="jax", XLA_FLAGS="--xla_force_host_platform_device_count=2",
               JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", JAX_PARALLEL], capture_output=True, text=True,
                            timeout=420, cwd=tmp_path, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["devices"] == 2
    for name in ("data", "model"):
        np.testing.assert_allclose(report[name]["loss"], report["one_loss"], rtol=1e-5)
        assert report[name]["weights"] <= 2e-5, (name, report[name]["weights"])
    assert report["data"]["batch_layout"] == ["batch", None]
    assert report["data"]["shards"]["attention/query_dense/kernel"] == [16, 16]  # replicated
    shards = report["model"]["shards"]
    for projection in ("query", "key", "value"):
        assert shards[f"attention/{projection}_dense/kernel"] == [16, 8]  # one head per device
    assert shards["attention/output_dense/kernel"] == [8, 16]
    assert shards["ffn/hidden_dense/kernel"] == [16, 32]
    assert shards["head/kernel"] == [16, 32]  # not in the layout map: replicated


@tf_only
@pytest.mark.slow
def test_translation_example_on_two_workers_resumes(tmp_path):
    """The example CLI itself: `--strategy multi_worker` on two local workers, worker 1 stopped
    after epoch 1, the chief stopping without it, both restarted with `--resume`; only the
    chief scores, draws and exports."""
    out = tmp_path / "out"
    command = [sys.executable, str(EXAMPLES / "transformer_translation.py"), "--strategy",
               "multi_worker", "--out", str(out), "--export-dir", str(tmp_path / "export"),
               "--num-examples", "400", "--epochs", "3", "--batch-size", "64",
               "--max-test", "10"]
    with processes(tmp_path) as group:
        deadline = time.monotonic() + 900
        workers = group.cluster("first", command, {1: ["--interrupt-after", "1"]})
        assert wait(workers[1], deadline) == 3, log(workers[1])[-3000:]
        assert wait(workers[0], time.monotonic() + LOST_PEER_SECONDS) == 1
        metadata = out / "backup" / "training_metadata.json"
        assert json.loads(metadata.read_text())["epoch"] == 1
        deadline = time.monotonic() + 900
        workers = group.cluster("second", [*command, "--resume"])
        assert [wait(p, deadline) for p in workers] == [0, 0], log(workers[0])[-3000:]
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["strategy"] == "multi_worker" and metrics["epochs_run"] == 2
    assert metrics["export_matches_python"] is True
    assert (out / "history.png").exists() and (out / "attention_0.png").exists()
    assert "the chief writes metrics" in log(workers[1])
    assert "exported to" in log(workers[0]) and "exported to" not in log(workers[1])
