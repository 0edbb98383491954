"""Shared pytest setup: quiet TensorFlow, fixed seeds, a float32 policy for every test, and the
backend switch: under `KERAS_BACKEND=jax` or `torch`, tests marked `tf_only` are skipped."""

import gc
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

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
    keras.backend.clear_session()


def pytest_collection_finish(session):
    """Keras calls `gc.collect()` in `clear_session` (after every test, above) and whenever a
    layer drops a variable (`quantize`, 15 times for a small model); each walks every live
    object: with TensorFlow, keras-hub and transformers imported, 0.35 s a call. What exists
    once the tests are collected (modules, test data) lives to the end anyway: moving it to the
    permanent generation leaves the collections only what the tests create."""
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    if keras.backend.backend() == "tensorflow":
        return
    skip = pytest.mark.skip(reason=f"TensorFlow only; the backend is {keras.backend.backend()}")
    for item in items:
        if "tf_only" in item.keywords:
            item.add_marker(skip)
