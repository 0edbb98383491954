"""Shared pytest setup: quiet TensorFlow, fixed seeds, a float32 policy for every test, and the
backend switch: under `KERAS_BACKEND=jax` or `torch`, tests marked `tf_only` are skipped."""

import gc
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# JAX compiles thousands of small programs in a run, op by op; LLVM's optimization passes are
# a quarter of each compilation and buy nothing on test shapes (the numbers do not change: the
# passes keep IEEE semantics). Not on TensorFlow: its compiled programs run many times (its CI
# stage took 1847 s with the flag, 1470 s without, each on a clean clone of this machine).
if os.environ.get("KERAS_BACKEND") == "jax":
    os.environ["XLA_FLAGS"] = " ".join(
        [os.environ.get("XLA_FLAGS", ""), "--xla_backend_optimization_level=0"]).strip()

import keras
import numpy as np
import pytest

np.random.seed(1234)  # module-level test data (drawn at collection) is the same on every run


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    np.random.seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session(free_memory=False)
    _collect_what_the_test_left()


def _collect_what_the_test_left():
    """A full `gc.collect()` walks every live object, and a test process keeps growing: 1.3
    million objects after 40 tests, 2.2 million after 160, 1.3-3.1 s a walk (measured on a
    busy machine). Keras walks at every `clear_session` and whenever a layer drops a variable
    (`quantize`: 15 times for a small model). Here the cyclic garbage of the test that just
    ended (its models) is collected, and what survives it is moved to the permanent
    generation, so the next walks see only what later tests create (CI's TensorFlow stage
    went from 1470 to 882 and 964 s, two runs, with this and the layer contract's symbolic
    build). Objects freed by reference counting are freed as ever; a cycle through a frozen
    object is never collected: the largest process of five heavy files peaked at 2.9 GB
    against 2.6 GB."""
    gc.collect()
    gc.freeze()


def pytest_collection_finish(session):
    """What exists once the tests are collected (modules, test data) lives to the end anyway."""
    _collect_what_the_test_left()


# Keras' int8 quantization and LoRA, through our models: the same keras.ops on every backend,
# checked on TensorFlow and torch. On JAX each quantized model compiles op by op (490 of that
# stage's 3025 worker-seconds), so these files are skipped there, with this reason in the summary.
NOT_ON_JAX = ("test_model_robustness.py", "test_int8_models.py", "test_quantization.py",
              "test_lora.py")


def pytest_collection_modifyitems(config, items):
    backend = keras.backend.backend()
    if backend == "tensorflow":
        return
    skip = pytest.mark.skip(reason=f"TensorFlow only; the backend is {backend}")
    skip_jax = pytest.mark.skip(
        reason="int8 and LoRA models: run on TensorFlow and torch, not JAX (conftest.NOT_ON_JAX)")
    for item in items:
        if "tf_only" in item.keywords:
            item.add_marker(skip)
        elif backend == "jax" and item.path.name in NOT_ON_JAX:
            item.add_marker(skip_jax)
