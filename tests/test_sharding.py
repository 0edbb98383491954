"""Sharding keras_attn models on `keras.distribution`: `keras_attn.models.get_layout_map`.

The checks that need devices run `tests/sharding_check.py` under JAX on 8 virtual CPU devices
(`XLA_FLAGS=--xla_force_host_platform_device_count=8`, which must be set before JAX is
imported: a subprocess, bounded in time, whatever backend runs pytest; `run_once`). Every
builder and every pretrained architecture, under `ModelParallel` on a `(2, 4)` mesh, gives the
outputs, the loss of one SGD step and the weights after it of the same model on one device,
and each large kernel is split as the Megatron layout says (read from the variables'
`.value.sharding`). `DataParallel` over 8 devices is checked on three models in the default
run, on all in a `slow` one. The argument checks and the patterns' coverage run in process on
every backend.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import keras
import numpy as np
import pytest
from backend_utils import run_once
from sharding_check import MODELS

from keras_attn import layers, models

REPO = pathlib.Path(__file__).resolve().parents[1]
CHECK = REPO / "tests" / "sharding_check.py"
TIMEOUT = 600  # seconds; the default run takes 1-2 minutes on this shared 2-core machine
MESH = {"batch": 2, "model": 4}
DATA_PARALLEL = ("causal_lm", "transformer_seq2seq", "bert_mlm")
# Measured (2026-12): outputs at most 5e-7 of their scale apart, losses 2.4e-7, weights after
# one step 1.9e-7 (float32 sums in another order), while the step moved them by 4e-3 to 0.6.
OUTPUT_RTOL, LOSS_RTOL, WEIGHT_ATOL, MIN_STEP = 5e-6, 1e-5, 2e-6, 1e-3


def run_check(tmp_path, args: list[str]) -> dict:
    env = {key: value for key, value in os.environ.items() if key != "XLA_FLAGS"}
    env.update(KERAS_BACKEND="jax", JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="3",
               XLA_FLAGS="--xla_force_host_platform_device_count=8",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])))
    result = subprocess.run([sys.executable, str(CHECK), *args], capture_output=True, text=True,
                            timeout=TIMEOUT, cwd=tmp_path, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["devices"] == 8 and report["mesh"] == MESH
    return report


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    return run_check(tmp_path_factory.mktemp("sharding"), ["--data-parallel", *DATA_PARALLEL])


COLUMN = ("query_dense/kernel", "key_dense/kernel", "value_dense/kernel",
          "ffn/hidden_dense/kernel", "ffn/gate_dense/kernel")
ROW = ("attention/output_dense/kernel", "ffn/output_dense/kernel")


def expected_shard(path: str, shape: list[int]) -> list[int]:
    """One device's slice on the `(batch 2, model 4)` mesh, by the weight's role (Megatron:
    column-parallel first projections, row-parallel second ones; vocabulary-sized weights
    split by feature), written independently of the layout map's patterns."""
    b, m = MESH["batch"], MESH["model"]
    if path.endswith(COLUMN):
        return [shape[0] // b, shape[1] // m]  # (d, heads · head_dim | intermediate_dim)
    if path.endswith(ROW):
        return [shape[0] // m, shape[1] // b]  # (heads · head_dim | intermediate_dim, d)
    if path.endswith(tuple(p.replace("kernel", "bias") for p in COLUMN)):
        return [shape[0] // m]
    if path.endswith(("token_embedding/embeddings", "encoder/embedding/embeddings",
                      "decoder/embedding/embeddings")):
        return [shape[0], shape[1] // m]  # (vocab, d): by feature
    if path.endswith(("head/output_dense/kernel", "decoder/output_dense/kernel",
                      "attention/score_dense/kernel")):
        return [shape[0] // m, shape[1]]  # (d, vocab | 1): by feature
    if path.endswith(tuple(p.replace("kernel", "lora_kernel_b") for p in COLUMN)):
        return [shape[0], shape[1] // m]
    if path.endswith(tuple(p.replace("kernel", "lora_kernel_a") for p in ROW)):
        return [shape[0] // m, shape[1]]
    return shape  # replicated


@run_once
@pytest.mark.parametrize("name", MODELS)
def test_model_parallel_equals_one_device(report, name):
    result = report["models"][name]
    assert result["step"] >= MIN_STEP  # the step moved the weights: the comparison has teeth
    sharded = result["model_parallel"]
    assert sharded["outputs"] <= OUTPUT_RTOL * result["output_scale"], sharded["outputs"]
    assert sharded["loss"] <= LOSS_RTOL * result["loss"], sharded["loss"]
    assert sharded["weights"] <= WEIGHT_ATOL, sharded["weights"]


@run_once
@pytest.mark.parametrize("name", MODELS)
def test_model_parallel_splits_each_large_kernel(report, name):
    placement = report["models"][name]["model_parallel"]["placement"]
    wrong = {path: (where["shard"], expected_shard(path, where["shape"]))
             for path, where in placement.items()
             if where["shard"] != expected_shard(path, where["shape"])}
    assert not wrong, wrong  # path: (one device's shard, expected)
    # The layout map is what placed them: every variable has the sharding it asks for.
    assert all(where["spec"] == (where["asked"] or [None] * len(where["shape"]))
               for where in placement.values())
    split = [path for path, where in placement.items() if where["shard"] != where["shape"]]
    assert any("attention/query_dense/kernel" in path for path in split)
    if name != "bahdanau_seq2seq":  # its GRUs are replicated
        assert any("ffn/output_dense/kernel" in path for path in split)
        total = sum(np.prod(w["shape"]) for w in placement.values())
        on_one = sum(np.prod(w["shard"]) for w in placement.values())
        assert on_one < 0.5 * total, (on_one, total)


def check_data_parallel(result: dict) -> None:
    sharded = result["data_parallel"]
    assert sharded["outputs"] <= OUTPUT_RTOL * result["output_scale"], sharded["outputs"]
    assert sharded["loss"] <= LOSS_RTOL * result["loss"], sharded["loss"]
    assert sharded["weights"] <= WEIGHT_ATOL, sharded["weights"]
    assert all(where["shard"] == where["shape"] for where in sharded["placement"].values())


@run_once
@pytest.mark.parametrize("name", DATA_PARALLEL)
def test_data_parallel_equals_one_device(report, name):
    check_data_parallel(report["models"][name])


@run_once
@pytest.mark.slow
def test_data_parallel_equals_one_device_for_every_model(tmp_path):
    others = [name for name in MODELS if name not in DATA_PARALLEL]
    report = run_check(tmp_path, [*others, "--data-parallel", *others])
    for name in others:
        check_data_parallel(report["models"][name])


@run_once
def test_the_scale_doc_example_runs(tmp_path):
    """docs/scale.md's code block, as written (it sets the backend and the 8 devices)."""
    text = (REPO / "docs" / "scale.md").read_text()
    code = re.findall(r"```python\n(.*?)```", text, re.DOTALL)[0]
    env = dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="3", JAX_PLATFORMS="cpu")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=TIMEOUT, cwd=tmp_path, env=env, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(maxsplit=1) for line in result.stdout.strip().splitlines())
    losses = json.loads(lines["loss"])
    assert losses[1] < losses[0]
    assert lines["decoder/block_0/ffn/hidden_dense/kernel"] == (
        "(64, 256) -> (32, 64) P('batch', 'model')")
    assert lines["decoder/block_0/ffn/output_dense/kernel"] == (
        "(256, 64) -> (64, 32) P('model', 'batch')")
    assert lines["decoder/embedding/token_embedding/embeddings"] == (
        "(512, 64) -> (512, 16) P(None, 'model')")
    assert lines["decoder/head/output_dense/kernel"] == "(64, 512) -> (16, 512) P('model', None)"


def fake_mesh(shape=(2, 4), names=("batch", "model")) -> keras.distribution.DeviceMesh:
    """A mesh of device names: enough for the layout map, on any backend and device count."""
    return keras.distribution.DeviceMesh(shape, names, [f"cpu:{i}" for i in range(8)])


@pytest.mark.parametrize("kwargs,match", [
    ({"device_mesh": "cpu:0"}, "device_mesh"),
    ({"model_parallel_dim_name": "tensor"}, "model_parallel_dim_name"),
    ({"data_parallel_dim_name": "data"}, "data_parallel_dim_name"),
    ({"model_parallel_dim_name": None}, "model_parallel_dim_name"),
    ({"data_parallel_dim_name": "model"}, "two different mesh axes"),
])
def test_get_layout_map_refuses_what_the_mesh_does_not_have(kwargs, match):
    with pytest.raises(ValueError, match=match):
        models.get_layout_map(**{"device_mesh": fake_mesh(), **kwargs})


def test_the_layout_follows_the_parts_under_any_name():
    """A stack named by its user, inside a model of another name, with LoRA, on a mesh of
    other axis names, weights split over the model axis only (`data_parallel_dim_name=None`)."""
    inputs = keras.Input((None,), dtype="int32")
    block = layers.BlockConfig(layers.AttentionConfig(4, position_encoding="rope"), 32,
                                  activation="swiglu", norm="rms", normalize_first=True)
    stack = models.TransformerDecoderOnly(64, 1, 16, block, name="my_lm")
    model = keras.Model(inputs, stack(inputs), name="outer")
    models.enable_lora(model, 2, ("query", "output", "hidden"))
    mesh = fake_mesh((4, 2), ("data", "tensor"))
    layout_map = models.get_layout_map(mesh, "tensor", None)
    axes = {v.path: (layout_map[v.path].axes if layout_map[v.path] else None)
            for v in model.weights}
    assert axes["my_lm/block_0/self_attention/query_dense/kernel"] == (None, "tensor")
    assert axes["my_lm/block_0/self_attention/query_dense/lora_kernel_a"] is None
    assert axes["my_lm/block_0/self_attention/query_dense/lora_kernel_b"] == (None, "tensor")
    assert axes["my_lm/block_0/self_attention/output_dense/kernel"] == ("tensor", None)
    assert axes["my_lm/block_0/self_attention/output_dense/lora_kernel_a"] == ("tensor", None)
    assert axes["my_lm/block_0/self_attention/output_dense/lora_kernel_b"] is None
    assert axes["my_lm/block_0/ffn/hidden_dense/lora_kernel_b"] == (None, "tensor")
    assert axes["my_lm/block_0/ffn/output_dense/kernel"] == ("tensor", None)
    assert axes["my_lm/embedding/token_embedding/embeddings"] == (None, "tensor")
    assert axes["my_lm/head/output_dense/kernel"] == ("tensor", None)
    assert axes["my_lm/head/output_dense/lora_kernel_a"] is None  # the head is not a block's
    assert axes["my_lm/block_0/self_attention_norm/scale"] is None
    # Every rank fits its variable (a wrong rank fails only when the variable is placed).
    assert all(layout is None or len(layout) == len(v.shape)
               for v, layout in zip(model.weights, axes.values()))
