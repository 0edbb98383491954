"""Values and gradients on whichever Keras backend runs the tests (TensorFlow, JAX or torch)."""

from __future__ import annotations

import keras
import numpy as np
import pytest

# A test that starts its own backend in a subprocess (JAX on virtual devices) gets the same
# answer whichever backend runs pytest: it runs once, in the default (TensorFlow) stage of CI.
run_once = pytest.mark.skipif(
    keras.backend.backend() != "tensorflow",
    reason="runs its own backend in a subprocess: once, in the TensorFlow run")


def examples(count: int) -> int:
    """Hypothesis examples for a property test: `count` on TensorFlow, a quarter (at least 5)
    on JAX and torch. The code under test is the same on every backend, and each example is
    compiled afresh on JAX, so the other backends check a sample of what TensorFlow searches."""
    return count if keras.backend.backend() == "tensorflow" else max(5, count // 4)


def rand(*shape, scale=1.0) -> np.ndarray:
    """Standard normal float32 numbers (NumPy's global generator, which `conftest.py` seeds
    before every test, so each test sees the same numbers however the tests are split)."""
    return (scale * np.random.standard_normal(shape)).astype("float32")


def dense_weights(dense) -> tuple:
    """A built `keras.layers.Dense`'s `(kernel, bias)` as NumPy arrays (bias None without)."""
    bias = None if dense.bias is None else to_np(dense.bias)
    return to_np(dense.kernel), bias


def dtype_of(x) -> str:
    """A tensor's dtype as Keras names it ("float32"); torch dtypes do not compare to strings."""
    return keras.backend.standardize_dtype(x.dtype)


def as_np(x) -> np.ndarray:
    """A tensor of any backend as a NumPy array of its own dtype (torch tensors that require
    gradients are detached)."""
    return keras.ops.convert_to_numpy(x)


def assert_allclose(actual, desired, **kwargs):
    """`np.testing.assert_allclose` for tensors of any backend."""
    np.testing.assert_allclose(as_np(actual), as_np(desired), **kwargs)


def assert_array_equal(actual, desired, **kwargs):
    """`np.testing.assert_array_equal` for tensors of any backend."""
    np.testing.assert_array_equal(as_np(actual), as_np(desired), **kwargs)


def to_np(x) -> np.ndarray:
    """A tensor of any backend (any float dtype) as a float32 NumPy array; None stays None."""
    if x is None:
        return None
    return keras.ops.convert_to_numpy(keras.ops.cast(x, "float32"))


def value_and_grads(fn, inputs, cotangent):
    """`fn(*inputs)` and the gradients of `sum(fn(*inputs) * cotangent)` with respect to each
    input, as NumPy arrays.

    Args:
        fn: a function of tensors returning one tensor.
        inputs: list of NumPy arrays (their dtype is kept, e.g. float32 or bfloat16 via keras).
        cotangent: NumPy array with the shape of the output.

    Returns:
        `(output, [gradient per input])`, float32 NumPy arrays.
    """
    backend = keras.backend.backend()
    cotangent = np.asarray(cotangent, "float32")
    # Gradients with respect to floating inputs; integer inputs (lengths) get zeros.
    floats = [i for i, x in enumerate(inputs)
              if keras.backend.is_float_dtype(keras.backend.standardize_dtype(
                  keras.ops.convert_to_tensor(x).dtype))]
    if backend == "tensorflow":
        import tensorflow as tf

        xs = [tf.convert_to_tensor(x) for x in inputs]
        with tf.GradientTape() as tape:
            tape.watch([xs[i] for i in floats])
            out = fn(*xs)
            loss = tf.reduce_sum(tf.cast(out, "float32") * cotangent)
        found = tape.gradient(loss, [xs[i] for i in floats], unconnected_gradients="zero")
    elif backend == "jax":
        import jax
        import jax.numpy as jnp

        xs = [jnp.asarray(x) for x in inputs]

        def loss_fn(float_xs, other_xs):
            full = list(other_xs)
            for i, x in zip(floats, float_xs):
                full[i] = x
            out = fn(*full)
            return jnp.sum(out.astype("float32") * cotangent), out

        # One compiled program for the forward and backward pass: run op by op, each new shape
        # of each primitive compiles on its own (hundreds of compilations a layer). Every input
        # is an argument, so the traced program is the one a caller's `jax.jit` would run.
        found, out = jax.jit(jax.grad(loss_fn, has_aux=True))([xs[i] for i in floats], xs)
    elif backend == "torch":
        import torch

        xs = [keras.ops.convert_to_tensor(x).detach() for x in inputs]
        for i in floats:
            xs[i].requires_grad_(True)
        out = fn(*xs)
        loss = (out.float() * torch.as_tensor(cotangent, device=out.device)).sum()
        found = torch.autograd.grad(loss, [xs[i] for i in floats], allow_unused=True)
        found = [torch.zeros_like(xs[i]) if g is None else g for i, g in zip(floats, found)]
    else:  # pragma: no cover
        raise NotImplementedError(backend)
    grads = [np.zeros(np.shape(x), "float32") for x in inputs]
    for i, grad in zip(floats, found):
        grads[i] = grad
    return to_np(out), [to_np(g) for g in grads]


def layer_value_and_grads(layer, inputs: list, cotangent, **call_kwargs):
    """A built layer's output on `inputs` (positional NumPy arrays) and the gradients of
    `sum(output * cotangent)` with respect to each input and then each trainable weight,
    through `layer.stateless_call` (so any backend differentiates it)."""
    trainable = [v.value for v in layer.trainable_variables]
    frozen = [v.value for v in layer.non_trainable_variables]
    count = len(inputs)

    def fn(*values):
        outputs, _ = layer.stateless_call(list(values[count:]), frozen, *values[:count],
                                          **call_kwargs)
        return outputs[0] if isinstance(outputs, (tuple, list)) else outputs

    arrays = list(inputs) + [keras.ops.convert_to_numpy(t) for t in trainable]
    return value_and_grads(fn, arrays, cotangent)


def call_traced(fn, *inputs):
    """`fn(*inputs)` with the inputs' values unknown while `fn` is traced: inside a
    `tf.function` on TensorFlow, a `jax.jit` on JAX; torch has no graph, so it runs `fn`
    eagerly. Checks of values must then happen in the compiled program itself."""
    backend = keras.backend.backend()
    inputs = [keras.ops.convert_to_tensor(x) for x in inputs]
    if backend == "tensorflow":
        import tensorflow as tf

        return tf.function(fn)(*inputs)
    if backend == "jax":
        import jax

        return jax.jit(fn)(*inputs)
    return fn(*inputs)


def randomize(model, seed: int = 0, scale: float = 0.3) -> None:
    """Larger random weights than the initializers give (norm scales around 1), so a small
    model's outputs vary with every input."""
    rng = np.random.default_rng(seed)
    for variable in model.weights:
        value = scale * rng.standard_normal(variable.shape)
        if "gamma" in variable.path or "scale" in variable.path:
            value += 1.0
        variable.assign(value.astype(variable.dtype))
