"""Running a decoding function as one compiled program on the current backend.

TensorFlow: a `tf.function` (optionally XLA) whose inputs have an unknown batch size and length,
traced once per model and settings; inside a function being traced (a SavedModel signature)
the ops join that graph. JAX: `jax.jit` of a stateless call, the model's variables passed as
arguments (captured, they would be compiled into the program as constants: a copy of every
weight, and a compilation that grows with the model). torch: a Python loop over the token
steps (`keras.ops.while_loop` is one there), each step compiled with `torch.compile` where
compiling pays (`keras_attn.decoding.stepwise`; `torch_mode` says where), under
`torch.no_grad()`.
"""

from __future__ import annotations

import weakref

import keras

from keras_attn.decoding import stepwise
from keras_attn.decoding.contract import Decoder

_COMPILED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def torch_mode(model, jit_compile) -> str | None:
    """How torch runs the decoding steps of `model` (a `keras_attn.decoding.stepwise` mode).

    `jit_compile=True`: compiled, by Inductor with CUDA graphs (`"reduce-overhead"`) on a GPU,
    by TorchDynamo's graph capture alone (`"eager"`) on a CPU (on the tests' 2-layer d64 model,
    one thread, a step took 5.2 ms with Inductor against 3.25 ms with the capture alone, and
    compiled in 43 s against 19 s). `False`: eagerly, each Keras
    call in Python. `None` (the default): compiled on a GPU, where a step without compiling is
    mostly kernel launches and Python; eagerly on a CPU, where compiling (seconds to a minute
    per model and settings) only pays back over thousands of tokens at GPT-2's size
    (docs/performance.md has the figures).
    """
    if jit_compile is False:
        return None
    variables = getattr(model, "variables", None) or ()
    if variables and getattr(variables[0].value, "is_cuda", False):  # the weights on a GPU
        return "reduce-overhead"
    return "eager" if jit_compile else None


def run(fn, model, arrays: tuple, options: dict, jit_compile: bool | None = False,
        on_step=None, companions: tuple = (), autograph: bool = True):
    """`fn(model, *arrays, **options)`, compiled once per model, `fn` and `options`.

    Args:
        fn: the decoding function; `options` are Python values (static), `arrays` tensors.
        model: the model decoded (a weak key of the cache of compiled functions).
        arrays: tensors: integer ids first, then scalars (a sampler's numbers).
        options: keyword arguments fixed for the compiled function; an option with a
            `compile_key()` (a sampler) is told apart by it (one program serves every value of
            its numbers, which `fn` takes from `arrays`).
        jit_compile: bool or None: under TensorFlow, compile with XLA (None: no); under torch,
            compile each step (`torch_mode`); JAX always compiles.
        on_step: optional callback of the decoding loops' steps
            (`keras_attn.decoding.stepwise.compiling`, for streaming): the loop then runs in
            Python, eagerly on TensorFlow and JAX, its steps compiled on torch as
            `jit_compile` says.
        companions: other models `fn` runs (a speculative decoding's draft, also in
            `options`): on JAX their variables are arguments of the program too. Defaults
            to `()`.
        autograph: bool, TensorFlow: convert `fn`'s Python control flow with AutoGraph;
            `False` traces it as it is (a function written on `keras.ops` alone, its loops
            `keras.ops.while_loop`), which traces faster (speculative decoding's rounds: 6 s
            against 9 s on the tests' models, on the shared 2-core machine). Defaults to
            `True`.

    Returns:
        What `fn` returns.
    """
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        with torch.no_grad(), stepwise.compiling(torch_mode(model, jit_compile), on_step):
            return fn(model, *arrays, **options)
    if on_step is not None:
        with stepwise.compiling(None, on_step):
            return fn(model, *arrays, **options)
    jit_compile = bool(jit_compile)
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.inside_function():
            return fn(model, *arrays, **options)
        arrays = tuple(tf.convert_to_tensor(a) for a in arrays)
        key = (fn.__name__, "tf", jit_compile, _static(options),
               tuple(a.dtype for a in arrays), tuple(len(a.shape) for a in arrays))
    else:
        key = (fn.__name__, "jax", _static(options))
    compiled = _COMPILED.setdefault(model, {})
    if key not in compiled:
        model_ref = weakref.ref(model)  # the cache must not keep the model alive

        def call(*arrays):
            return fn(model_ref(), *arrays, **options)

        if backend == "tensorflow":
            signature = [tf.TensorSpec([None] * len(a.shape), a.dtype) for a in arrays]
            compiled[key] = tf.function(call, input_signature=signature,
                                        jit_compile=jit_compile,
                                        autograph=autograph)
        else:
            import jax

            def stateless(values, *arrays):
                model = model_ref()
                mapping = list(zip(_variables(model, companions), values))
                with keras.StatelessScope(state_mapping=mapping):
                    return fn(model, *arrays, **options)

            compiled[key] = jax.jit(stateless)
    if backend == "jax":
        return compiled[key]([v.value for v in _variables(model, companions)], *arrays)
    return compiled[key](*arrays)


def _variables(model, companions: tuple) -> list:
    """The variables of `model`, then of each companion."""
    return [v for m in (model,) + tuple(companions) for v in m.variables]


def compilations(model) -> int:
    """How many programs `run` has compiled for `model` so far: JAX's `jax.jit` programs,
    TensorFlow's traces (a new prompt, temperature or seed compiles none; a new `max_length`
    or sampler kind does). torch: `keras_attn.decoding.stepwise.compilations()`."""
    total = 0
    for fn in _COMPILED.get(model, {}).values():
        if hasattr(fn, "experimental_get_tracing_count"):  # a tf.function
            total += fn.experimental_get_tracing_count()
        else:
            total += fn._cache_size()  # a jax.jit function
    return total


def _static(options: dict) -> tuple:
    """The options as a hashable key (a sampler by its `compile_key()`)."""
    return tuple((name, value.compile_key() if hasattr(value, "compile_key") else value)
                 for name, value in sorted(options.items(), key=lambda item: item[0]))


def has_layer(model, name: str) -> bool:
    """Whether `model` (any object) has a layer called `name`."""
    try:
        model.get_layer(name)
    except (AttributeError, ValueError):
        return False
    return True


def contract_layer(model, name: str, kind: str, methods=("init_decode_state", "decode_step")):
    """The layer `name` of `model`, or a ValueError that says what `model` must be (`kind`).

    With `methods` (the default) the layer must keep the decoding contract,
    `keras_attn.decoding.contract.Decoder`; `methods=()` only looks the layer up.
    """
    try:
        layer = model.get_layer(name)
    except (AttributeError, ValueError) as error:
        raise ValueError(
            f"Argument `model` must be {kind}. Received: model={model!r}"
        ) from error
    if not methods:
        return layer
    missing = [method for method in methods if not callable(getattr(layer, method, None))]
    if missing or not isinstance(layer, Decoder):
        raise ValueError(
            f"Argument `model` has a {name!r} layer without a `{(missing or methods)[0]}` "
            "method, so it cannot be decoded step by step (see "
            f"keras_attn.decoding.contract.Decoder). Received: {name}={layer!r}"
        )
    return layer
