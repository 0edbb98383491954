"""Speed paths tuned on particular hardware, each behind a switch.

Nothing here changes what attention computes, only how fast it runs and how much memory it
holds on the way. Each path was measured on one machine (a shared 2-core AMD EPYC CPU, no GPU,
TensorFlow 2.21; the figures are in `benchmarks/RESULTS.md`, section "Tuning switches") and is a
hypothesis about any other: measure again on a GPU or another CPU, and turn a switch off where it
does not pay.

`AUTO_KERNELS` is the table `implementation="auto"` reads: per backend and device, the kernel
measured fastest (`auto_kernel`), each row with the command that measured it and what it
printed; rows not measured yet say so.

Switches, read on every trace (set them with `configure`, before building the graph):

- `loop_parallelism` (int or None, default 2): iterations in flight in the key-block loops of
  the blockwise kernel under TensorFlow (`tf.while_loop(parallel_iterations=...)`). TensorFlow's
  default of 10 computes up to ten `(T, chunk)` score blocks ahead, which multiplies the peak
  memory; 1 leaves a core idle. None uses the backend's default. Other backends loop one
  iteration at a time anyway.
- `block_budget` (int, default 2**25) and `min_chunk_size` (int, default 128): `chunk_size=None`
  in the blockwise kernel picks the largest power of two, at least `min_chunk_size`, that keeps
  one block at `block_budget` scores over all the sequences and heads it spans
  (`auto_chunk_size`); the dense kernel's backward folds row terms only below `block_budget`
  scores per head.
- `fold_row_terms` (bool, default True): where float32 products are exact, a per-row term rides
  along in a product as one more column (`[Q, -L] [K, 1]ᵀ = Q Kᵀ - L`), saving one pass over a
  `(T, S)` block. Never for 16-bit inputs, TF32 or TPU products (the term would be rounded),
  never under XLA (which fuses the pass itself).
- `squeeze_single_matrix` (bool, default True): a batched product whose batch axes are all 1
  runs as a 2-D product (TensorFlow's CPU kernels run the batched form of one matrix slower).
- `xla_barriers` (bool, default True): under TensorFlow's `jit_compile=True`, optimization
  barriers around head transposes and the backward's transposed products, which XLA's CPU
  kernels would otherwise fold into slow product forms.
- `xla_dense_projections` (bool, default True): under XLA, `MultiHead`'s projections use a
  Dense product whose kernel gradient reads a transposed copy (`xla_dense`).
- `fuse_projections` (bool, default False): outside XLA, self-attention projects its input to
  queries, keys and values with one product by the three kernels side by side
  (`fused_dense`), and splits the heads with one transpose: one product, bias add, transpose
  and kernel gradient instead of three in each pass. Off: on the shared 2-core AMD EPYC the
  `causal_lm` training step of `benchmarks/lm_training_speed.py` (T = 128) took 1.07x as long
  with it, twice (benchmarks/RESULTS.md); a hypothesis for other machines.
- `fused_norm_gelu` (bool, default True): outside XLA, TensorFlow runs keras_attn's
  LayerNorms and tanh-GELU with hand-written gradients (`keras_attn.ops.fused`), a few passes
  each instead of TensorFlow's op-by-op derivatives. On the 2-core AMD EPYC the GPT-2-style
  `causal_lm` step of `benchmarks/lm_training_speed.py` took 0.85x-0.96x as long with it at
  T = 128 (five side-by-side runs) and 0.91x-1.04x at T = 1024 (within the noise there;
  benchmarks/RESULTS.md).

Example:
>>> from keras_attn import tuning
>>> with tuning.configure(loop_parallelism=1, fold_row_terms=False):
...     outputs, _ = keras_attn.ops.dot_product_attention(q, k, v, implementation="chunked")
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import keras
from keras import ops

from keras_attn._checks import check_bool, check_int


@dataclasses.dataclass
class Switches:
    """The current settings; see the module docstring for each."""

    loop_parallelism: int | None = 2
    block_budget: int = 2**25
    min_chunk_size: int = 128
    fold_row_terms: bool = True
    squeeze_single_matrix: bool = True
    xla_barriers: bool = True
    xla_dense_projections: bool = True
    fuse_projections: bool = False
    fused_norm_gelu: bool = True


SWITCHES = Switches()


def _check_switch(name: str, value) -> None:
    if name == "loop_parallelism":
        check_int(name, value, 1, allow_none=True)
    elif name in ("block_budget", "min_chunk_size"):
        check_int(name, value, 1)
    elif name in {field.name for field in dataclasses.fields(Switches)}:
        check_bool(name, value)
    else:
        raise ValueError(
            f"Received an unknown tuning switch `{name}`, expected one of "
            f"{[field.name for field in dataclasses.fields(Switches)]}. Received: {name}={value!r}"
        )


@contextlib.contextmanager
def _restoring(previous: dict):
    try:
        yield SWITCHES
    finally:
        for name, value in previous.items():
            setattr(SWITCHES, name, value)


def configure(**switches: Any):
    """Set switches; the settings hold until changed again, or until the `with` block ends
    when used as a context manager.

    Args:
        **switches: switch names and values, e.g. `loop_parallelism=1`.

    Returns:
        A context manager that restores the previous values on exit (ignore it to keep the new
        values).
    """
    for name, value in switches.items():
        _check_switch(name, value)
    previous = {name: getattr(SWITCHES, name) for name in switches}
    for name, value in switches.items():
        setattr(SWITCHES, name, value)
    return _restoring(previous)


# ---- the kernel `implementation="auto"` runs -------------------------------------------------

@dataclasses.dataclass(frozen=True)
class AutoKernel:
    """One row of `AUTO_KERNELS`: on `backend` and `device`, `"auto"` runs `kernel`, chosen by
    the measurement `measured` (the command and what it printed) or, where nothing was measured
    yet, on the hypothesis it states."""

    backend: str
    device: str
    kernel: str
    measured: str


AUTO_KERNELS = (
    AutoKernel("tensorflow", "cpu", "dense",
               "`python benchmarks/attention_speed.py --rounds 7 --modes graph` (2026-12-04, "
               "2-core Xeon, load 7-8): MultiHead fwd+bwd / Keras MHA, dense 0.75 (T128) and "
               "0.68 (T1024), fused 0.92 and 1.03 (Keras' TensorFlow op is a composite)"),
    AutoKernel("jax", "cpu", "dense",
               "`KERAS_BACKEND=jax python benchmarks/attention_speed.py --rounds 7` "
               "(2026-12-04, load 7-8): dense 0.88 (T128) and 0.39 (T1024), fused 1.02 and "
               "0.98 (XLA's CPU attention is autodiff of the unfused formula)"),
    AutoKernel("torch", "cpu", "fused",
               "`KERAS_BACKEND=torch python benchmarks/attention_speed.py --rounds 7` "
               "(2026-12-04, load 7-8): fused 0.97 (T128) and 1.00 (T1024), dense 1.32 and "
               "2.12 (SDPA's CPU flash kernel against eager autograd)"),
    AutoKernel("jax", "gpu", "dense",
               "`bash benchmarks/gpu_check.sh WHEEL_DIR` (2026-12-04, one H200, JAX 0.11.2): "
               "the GPT-2-style causal-LM step / keras-hub's, mixed bfloat16, dense 1.03 "
               "(T1024) and 1.07 (T4096), fused 1.19 and 1.18; a masked "
               "jax.nn.dot_product_attention is XLA's unfused formula there (the 16k step "
               "peaks at 43.1 GiB with either: long sequences want \"chunked\", 1.21 GiB)"),
    AutoKernel("torch", "gpu", "fused",
               "`bash benchmarks/gpu_check.sh WHEEL_DIR` (2026-12-04, one H200, torch 2.11): "
               "the causal-LM step / keras-hub's, fused 1.01 (T1024 and T4096), dense 1.17 "
               "and 1.27; the 16k step peaks at 2.94 GiB fused, 16.99 GiB dense (SDPA's "
               "memory-efficient kernel)"),
)


def device_kind(x: Any = None) -> str:
    """`"cpu"`, `"gpu"` or `"tpu"`: where tensor `x` lives under torch, else where the backend
    computes by default."""
    backend = keras.backend.backend()
    if backend == "torch":
        import torch

        kind = getattr(getattr(x, "device", None), "type", None)
        if kind in (None, "meta"):  # symbolic: the device Keras would put it on
            kind = "cuda" if torch.cuda.is_available() else "cpu"
        return {"cuda": "gpu", "xla": "tpu"}.get(kind, kind)
    if backend == "jax":
        import jax

        return jax.default_backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.config.list_logical_devices("TPU"):
            return "tpu"
        return "gpu" if tf.config.list_logical_devices("GPU") else "cpu"
    return "cpu"


def auto_kernel(x: Any = None) -> str:
    """The kernel `implementation="auto"` runs on this backend and `x`'s device (`x` a
    tensor, or None for the default device): `AUTO_KERNELS`' row, `"dense"` where there is
    none."""
    backend, device = keras.backend.backend(), device_kind(x)
    for row in AUTO_KERNELS:
        if (row.backend, row.device) == (backend, device):
            return row.kernel
    return "dense"


# ---- loops and block sizes -----------------------------------------------------------------

def fori_loop(upper, body, init):
    """`keras.ops.fori_loop(0, upper, body, init)`, with `loop_parallelism` iterations in
    flight under TensorFlow."""
    if keras.backend.backend() == "tensorflow" and SWITCHES.loop_parallelism is not None:
        import tensorflow as tf

        return tf.while_loop(lambda i, _: i < upper, lambda i, carry: (i + 1, body(i, carry)),
                             (0, init), parallel_iterations=SWITCHES.loop_parallelism)[1]
    return ops.fori_loop(0, upper, body, init)


def auto_chunk_size(query_len, key_len=None, lead: int = 1) -> int:
    """The key-block size that `chunk_size=None` means for `query_len` rows per block: the
    largest power of two, at least `min_chunk_size`, keeping a block at `block_budget` scores
    over all the `lead` sequences and heads it spans (512 when `query_len` is unknown). The
    training step holds several such blocks at once (scores, weights and their gradients, for
    each of `loop_parallelism` iterations), so the budget bounds its memory: a causal LM
    training at T = 16,384 with 4 heads peaked at 5.04 GiB with the blocks a single head
    would get (2048 keys) and 2.34 GiB with 512 (benchmarks/RESULTS.md). Sequences whose
    `lead · T · S` scores fit the budget stay one block (the dense kernel's fused path).

    When `key_len` is given and is not an int (unknown inside a graph) a block holds at most
    `max(min_chunk_size, 1024)` keys: the keys are then padded to whole blocks, and a block
    sized for one query row (2**25 keys) would pad a few keys to millions of rows.

    Args:
        query_len: int (or None, unknown), query rows per block.
        key_len: optional int or scalar tensor, the number of keys.
        lead: int, the sequences times heads of one block (the product of the scores'
            leading axes; axes unknown when traced count 1). Defaults to `1`.
    """
    lead = max(1, int(lead))
    if not isinstance(query_len, int) or query_len <= 0:
        size = 512
    else:
        size = SWITCHES.min_chunk_size
        while size * 2 * query_len * lead <= SWITCHES.block_budget:
            size *= 2
    if key_len is not None and not isinstance(key_len, int):
        size = min(size, max(SWITCHES.min_chunk_size, 1024))
    return size


# ---- products --------------------------------------------------------------------------------

def matmul(a, b):
    """`a @ b` over the last two axes; as a 2-D product when every batch axis is 1
    (`squeeze_single_matrix`)."""
    lead = tuple(a.shape[:-2]) + tuple(b.shape[:-2])
    if (not SWITCHES.squeeze_single_matrix or not lead or any(dim != 1 for dim in lead)
            or len(a.shape) != len(b.shape)):
        return ops.matmul(a, b)
    batch_axes = tuple(range(len(a.shape) - 2))
    out = ops.matmul(ops.squeeze(a, axis=batch_axes), ops.squeeze(b, axis=batch_axes))
    for _ in batch_axes:
        out = ops.expand_dims(out, 0)
    return out


def matmul_transposed(a, b):
    """`aᵀ @ b` for a tall `a` `(..., n, m)`, computed as `(bᵀ a)ᵀ` so the big operand is read
    in its stored order; under XLA behind a barrier (`xla_barriers`), or XLA folds it back into
    the transposed-operand product its CPU kernel runs about 3x slower."""
    return ops.swapaxes(xla_barrier(matmul(ops.swapaxes(b, -1, -2), a)), -1, -2)


def exact_float32_products(*tensors) -> bool:
    """Whether products of these tensors are exact float32 ones: not 16-bit, not TF32 on a GPU
    (TensorFlow's and JAX's default there, torch's when allowed), not on a TPU (bfloat16
    passes)."""
    if any(ops.dtype(t) != "float32" for t in tensors):
        return False
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        if tf.config.list_physical_devices("TPU"):
            return False
        return not (tf.config.list_physical_devices("GPU")
                    and tf.config.experimental.tensor_float_32_execution_enabled())
    if backend == "jax":
        import jax

        return jax.default_backend() == "cpu"
    if backend == "torch":
        import torch

        return not torch.cuda.is_available() or (
            torch.get_float32_matmul_precision() == "highest"
            and not torch.backends.cuda.matmul.allow_tf32)
    return False


def exceeds_block_budget(scores) -> bool:
    """Whether a `(..., T, S)` tensor may hold more than `block_budget` entries per head
    (unknown sizes count as more). The dense kernel's backward folds its row term only below
    that size: above it, its peak memory varied from run to run."""
    rows, cols = scores.shape[-2], scores.shape[-1]
    return rows is None or cols is None or rows * cols > SWITCHES.block_budget


def fold_row_terms(*tensors) -> bool:
    """Whether a per-row term may ride along in products of `tensors` (`fold_row_terms`)."""
    return (SWITCHES.fold_row_terms and exact_float32_products(*tensors)
            and not in_xla_context())


# ---- XLA ---------------------------------------------------------------------------------------

def in_xla_context() -> bool:
    """Whether the ops being traced will be compiled by XLA (TensorFlow's `jit_compile=True`).

    Reads TensorFlow's own check (`control_flow_util.GraphOrParentsInXlaContext`, the one its
    gradient code uses), which is not public API: if it moves, this reads as "no XLA".
    """
    if keras.backend.backend() != "tensorflow":
        return False
    try:
        import tensorflow as tf
        from tensorflow.python.ops import control_flow_util

        if tf.executing_eagerly():
            return False
        return bool(control_flow_util.GraphOrParentsInXlaContext(tf.compat.v1.get_default_graph()))
    except (ImportError, AttributeError):  # a moved private API must not break attention
        return False


def xla_barrier(x: Any) -> Any:
    """`x` itself; under XLA (and `xla_barriers`), `x` behind an optimization barrier in both
    passes, so XLA materializes it as written instead of folding a layout change into the
    products on either side. Elsewhere nothing is added."""
    if not SWITCHES.xla_barriers or not in_xla_context():
        return x
    import tensorflow as tf

    try:
        from tensorflow.compiler.tf2xla.ops import gen_xla_ops
    except ImportError:  # not public API either: without it, no barrier
        return x

    def barrier(t):
        return gen_xla_ops.xla_optimization_barrier([t])[0]

    @tf.custom_gradient
    def identity(t):
        # The gradient is this function again, so that it can be differentiated in turn.
        return barrier(t), identity

    return identity(x)


def xla_dense(layer: keras.layers.Dense, inputs: Any) -> Any:
    """`layer(inputs)` for a built `keras.layers.Dense`; under XLA (and
    `xla_dense_projections`), the same product with a kernel gradient `(xᵀ) dy` that reads a
    transposed copy of `x` (behind a barrier), the form XLA's CPU kernels run faster than the
    first-axis contraction `xᵀ dy`. Layers with LoRA, quantized weights or an activity
    regularizer always take `layer(inputs)`.

    Args:
        layer: a built `keras.layers.Dense`.
        inputs: `(..., m)` with `m` the layer's input size.

    Returns:
        `(..., units)`, equal to `layer(inputs)`.
    """
    if (not SWITCHES.xla_dense_projections or not in_xla_context()
            or getattr(layer, "lora_enabled", False)
            or getattr(layer, "quantization_mode", None) is not None or not layer.built
            or layer.activity_regularizer is not None):
        return layer(inputs)
    import tensorflow as tf

    dtype = layer.compute_dtype
    kernel = ops.cast(layer.kernel, dtype)  # (m, n)
    m, n = kernel.shape
    params = (kernel,) if layer.bias is None else (kernel, ops.cast(layer.bias, dtype))

    @tf.custom_gradient
    def dense(x, kernel, *bias):
        rows = ops.reshape(x, (-1, m))  # (B·T, m)
        y = ops.matmul(rows, kernel)
        if bias:
            y = y + bias[0]
        y = ops.reshape(y, tuple(ops.shape(x)[:-1]) + (n,))

        def grad(upstream):
            d_rows = ops.reshape(upstream, (-1, n))  # (B·T, n)
            d_x = ops.reshape(ops.matmul(d_rows, ops.transpose(kernel)), ops.shape(x))
            d_kernel = ops.matmul(xla_barrier(ops.transpose(rows)), d_rows)  # (m, n)
            if not bias:
                return d_x, d_kernel
            d_bias = ops.cast(ops.sum(ops.cast(d_rows, "float32"), axis=0), dtype)
            return d_x, d_kernel, d_bias

        return y, grad

    return layer.activation(dense(ops.cast(inputs, dtype), *params))


# ---- fused projections -----------------------------------------------------------------------

def _plain_dense(layer) -> bool:
    """A built float `keras.layers.Dense` computing `x W + b` only: no LoRA, quantization,
    activation or activity regularizer."""
    return (isinstance(layer, keras.layers.Dense) and layer.built
            and not getattr(layer, "lora_enabled", False)
            and getattr(layer, "quantization_mode", None) is None
            and layer.activity_regularizer is None
            and layer.activation is keras.activations.linear)


def can_fuse(layers) -> bool:
    """Whether `fused_dense(layers, x)` takes one product (`fuse_projections`): plain float
    `Dense` layers of one compute dtype, all with a bias or none, outside XLA (whose compiler
    fuses the products itself, and where `xla_dense` applies)."""
    return (SWITCHES.fuse_projections and not in_xla_context()
            and all(_plain_dense(layer) for layer in layers)
            and len({layer.compute_dtype for layer in layers}) == 1
            and len({layer.bias is None for layer in layers}) == 1)


def fused_dense(layers, inputs) -> Any:
    """`concat([layer(inputs) for layer in layers], -1)` as one product `x [W_1 ... W_n] +
    [b_1 ... b_n]`, for layers that `can_fuse`. The kernels stay the layers' own variables
    (checkpoints, LoRA and quantization see them unchanged); their gradients are slices of
    the product's.

    Args:
        layers: built `keras.layers.Dense` layers with one input size.
        inputs: `(..., m)`.

    Returns:
        `(..., sum of the layers' units)`.
    """
    dtype = layers[0].compute_dtype
    kernel = ops.concatenate([ops.cast(layer.kernel, dtype) for layer in layers], axis=-1)
    outputs = ops.matmul(ops.cast(inputs, dtype), kernel)  # (..., n_1 + ... + n_k)
    if layers[0].bias is not None:
        outputs = outputs + ops.concatenate([ops.cast(layer.bias, dtype) for layer in layers])
    return outputs
