"""Shared pytest setup: quiet TensorFlow, fixed seeds, and a float32 policy for every test."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np
import pytest


@pytest.fixture(autouse=True)
def _fresh_keras_state():
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    np.random.seed(1234)
    yield
    keras.config.set_dtype_policy("float32")
    keras.backend.clear_session()
