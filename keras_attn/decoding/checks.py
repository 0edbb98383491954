"""What the decoding functions are given, checked: settings and token ids, never clamped or
silently replaced.

- A value known now (a Python or NumPy number or array, an eager tensor of any backend) is
  checked in Python: a `ValueError` naming the argument, before anything is compiled.
- A tensor whose value is not known yet (a `tf.function` or SavedModel signature being traced,
  a JAX tracer under the caller's own `jax.jit`) is checked by the program itself, with the same
  message: on TensorFlow a `tf.debugging.Assert` (the call fails with
  `tf.errors.InvalidArgumentError`), on JAX a host callback that raises (the call fails with
  `JaxRuntimeError`). torch runs eagerly: its values are always known.

TensorFlow's XLA does not compile assertions: under the caller's own `jit_compile=True`
function, check the values before (an eager call of a decoding function always does, and
`jit_compile=True` of the decoding functions compiles after the checks).
"""

from __future__ import annotations

import functools

import keras
import numpy as np
from keras import ops

from keras_attn._checks import concrete_value

INT32_MAX = 2**31 - 1


def _message(name: str, expected: str) -> str:
    return f"Received an invalid value for argument `{name}`, expected {expected}. Received: "


def _raise_unless(message: str, ok, *data) -> None:
    if not bool(np.all(np.asarray(ok))):
        shown = " ".join(str(np.asarray(d).tolist()) for d in data)
        raise ValueError(message + shown)


def _in_graph(ok, message: str, data: tuple, values: tuple) -> tuple:
    """`values`, computed only once the boolean scalar tensor `ok` holds; the program fails with
    `message` and `data` where it does not (module docstring)."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        check = tf.debugging.Assert(ok, [message, *data], summarize=64)
        with tf.control_dependencies([check]):
            return tuple(tf.identity(v) for v in values)
    if backend == "jax":
        import jax

        jax.debug.callback(functools.partial(_raise_unless, message), ok, *data)
        return values
    # torch runs eagerly: a value that is not known here cannot occur.
    _raise_unless(message, concrete_value(ok), *(concrete_value(d) for d in data))
    return values


# What a setting may be: (what is expected, integer?, the condition on the value (NumPy or
# tensor)).
POSITIVE_INT = ("a positive integer", True, lambda v: v >= 1)
NON_NEGATIVE_INT = ("a non-negative integer", True, lambda v: v >= 0)
NON_NEGATIVE = ("a finite number >= 0", False, lambda v: (v >= 0) & (v < np.inf))
TEMPERATURE = NON_NEGATIVE
PROBABILITY = ("a number in (0, 1]", False, lambda v: (v > 0) & (v <= 1))
FRACTION = ("a number in [0, 1]", False, lambda v: (v >= 0) & (v <= 1))
POSITIVE = ("a finite number > 0", False, lambda v: (v > 0) & (v < np.inf))
SEED = (f"an integer in [0, {INT32_MAX}]", True, lambda v: (v >= 0) & (v <= INT32_MAX))

# keras_attn 0.2's sampling settings by name (`settings`).
SETTINGS = {"max_new_tokens": POSITIVE_INT, "temperature": TEMPERATURE,
            "top_k": NON_NEGATIVE_INT, "top_p": PROBABILITY, "seed": SEED}


def _kind(value) -> str:
    """"int", "float", "bool" or another dtype name, for a number, array or tensor."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):  # beyond int64 too (NumPy holds those as objects)
        return "int"
    dtype = getattr(value, "dtype", None)
    if dtype is None:
        dtype = np.asarray(value).dtype
        if dtype.kind not in "biuf":  # None, str, ...: no number (the caller names it)
            return dtype.name
    dtype = keras.backend.standardize_dtype(dtype)
    return "bool" if dtype == "bool" else "int" if "int" in dtype else (
        "float" if "float" in dtype else dtype)


def scalar(name: str, value, kind: tuple):
    """A scalar setting, checked: a Python number when its value is known now, else the
    tensor, which the program checks when it runs (module docstring).

    Args:
        name: the argument's name, for the messages.
        value: a Python number, or a scalar NumPy array or tensor.
        kind: what the value may be (`POSITIVE_INT`, `TEMPERATURE`, ...).

    Returns:
        An int (integer settings, at most `2**31 - 1`: a larger one means the same there) or
        a float; or a tensor (int32 or float32) whose value is not known yet.

    Raises:
        ValueError: naming `name`, for a known value out of range, a non-scalar, a bool, or a
            float where an integer is expected.
    """
    expected, integer, condition = kind
    message = _message(name, expected)
    shape = np.shape(value) if isinstance(value, (list, tuple)) else getattr(value, "shape",
                                                                             None)
    value_kind = _kind(value)
    if (shape is not None and len(shape) != 0) or value_kind not in ("int", "float") or (
            integer and value_kind != "int"):
        raise ValueError(message + f"{name}={value!r}")
    known = concrete_value(value)
    if known is not None:
        if not bool(condition(known)):
            raise ValueError(message + f"{name}={known.item()!r}")
        return min(int(known), INT32_MAX) if integer else float(known)
    (value,) = _in_graph(condition(value), message + f"{name}=", (value,), (value,))
    if integer:
        value = ops.minimum(value, ops.cast(INT32_MAX, value.dtype))
    return ops.cast(value, "int32" if integer else "float32")


def as_tensor(value, integer: bool):
    """A checked setting (`scalar`) as an int32 or float32 scalar tensor."""
    dtype = "int32" if integer else "float32"
    return ops.cast(value, dtype) if hasattr(value, "dtype") else ops.convert_to_tensor(
        value, dtype)


def one_of(name: str, value, allowed: tuple):
    """A scalar int `value` checked to be one of the ints `allowed`: a ValueError when its
    value is known now, else the program fails with the same message; int32."""
    message = _message(name, f"one of {allowed}")
    if _kind(value) != "int" or len(getattr(value, "shape", ())) != 0:
        raise ValueError(message + f"{name}={value!r}")
    known = concrete_value(value)
    if known is not None:
        if int(known) not in allowed:
            raise ValueError(message + f"{name}={known.item()!r}")
        return ops.convert_to_tensor(int(known), "int32")
    ok = ops.any(ops.equal(ops.cast(value, "int32"), ops.convert_to_tensor(allowed, "int32")))
    (value,) = _in_graph(ok, message + f"{name}=", (value,), (value,))
    return ops.cast(value, "int32")


def settings(caps: dict | None = None, **values) -> dict:
    """The decoding settings `values` (names of `SETTINGS`), checked, as int32 / float32 scalar
    tensors.

    Args:
        caps: optional `{name: int}`: an integer setting above its cap means the same as the
            cap (`max_new_tokens` beyond `max_length`), so it is taken down to it. Defaults to
            `None`.
        **values: each a Python number or a scalar (NumPy array, tensor), e.g.
            `temperature=0.8`.

    Returns:
        `{name: tensor}`, in the order given.

    Raises:
        ValueError: naming the setting, as `scalar`.
    """
    caps = caps or {}
    checked = {}
    for name, value in values.items():
        kind = SETTINGS[name]
        value = scalar(name, value, kind)
        if name in caps:
            value = (min(value, caps[name]) if isinstance(value, int)
                     else ops.minimum(value, caps[name]))
        checked[name] = as_tensor(value, kind[1])
    return checked


def token_ids(name: str, ids, vocab_size: int | None = None, right_padded: bool = False,
              pad_id: int = 0):
    """Integer ids `(B, T)`, checked, as int32.

    Args:
        name: the argument's name, for the messages.
        ids: integer `(B, T)` ids (a nested list, NumPy array or tensor).
        vocab_size: optional int, ids must be below it. Defaults to `None` (no upper bound).
        right_padded: bool, each row must be its tokens (at least one), then only `pad_id`.
            Defaults to `False`.
        pad_id: int, the padding id. Defaults to `0`.

    Returns:
        int32 `(B, T)`.

    Raises:
        ValueError: naming `name`, for ids of another rank or dtype, or (known values) ids
            out of range or not right-padded.
    """
    if not hasattr(ids, "shape"):
        ids = np.asarray(ids)
    if len(ids.shape) != 2 or _kind(ids) != "int":
        raise ValueError(
            f"Argument `{name}` must be integer token ids of shape (batch_size, length). "
            f"Received: {name}.shape={tuple(ids.shape)}, dtype={_kind(ids)}"
        )
    bound = f"[0, {vocab_size})" if vocab_size is not None else ">= 0"
    range_message = _message(name, f"token ids in {bound}")
    padding_message = (
        f"Argument `{name}` must be right-padded with {pad_id}: each row its tokens (at least "
        f"one, e.g. <bos>), then only padding; left padding and padding between tokens are not "
        f"supported. Received: ")
    known = concrete_value(ids)
    if known is not None:
        bad = (known < 0) | (known >= vocab_size if vocab_size is not None else False)
        if bad.any():
            row, column = np.argwhere(bad)[0]
            raise ValueError(range_message + f"{name}[{row}, {column}]={known[row, column]}")
        if right_padded and known.shape[1] == 0:
            raise ValueError(padding_message + f"{name}.shape={known.shape}")
        if right_padded:
            row = _first_unpadded_row(known != pad_id)
            if row is not None:
                raise ValueError(padding_message + f"{name}[{row}]={known[row].tolist()}")
        return ops.convert_to_tensor(known, "int32")
    low, high = ops.min(ids), ops.max(ids)
    ok = low >= 0
    if vocab_size is not None:
        ok = ops.logical_and(ok, high < vocab_size)
    (ids,) = _in_graph(ok, range_message + f"the smallest and largest id of {name}: ",
                       (low, high), (ids,))
    if right_padded:
        present = ops.not_equal(ids, pad_id)  # (B, T)
        # A row is right-padded when its first position holds a token and no token follows
        # padding.
        wrong = ops.logical_or(ops.logical_not(present[:, 0]), ops.any(ops.logical_and(
            present[:, 1:], ops.logical_not(present[:, :-1])), axis=1))  # (B,)
        first = ops.argmax(ops.cast(wrong, "int32"))
        (ids,) = _in_graph(ops.logical_not(ops.any(wrong)),
                           padding_message + f"a row index and that row of {name}: ",
                           (first, ops.take(ids, first, axis=0)), (ids,))
    return ops.cast(ids, "int32")


def prompt_lengths(lengths, ids):
    """Each row's prompt length, int32 `(B,)`, checked in `[1, P]` for ids `(B, P)` (a
    ValueError for known values, else a failed call with the same message)."""
    if not hasattr(lengths, "shape"):
        lengths = np.asarray(lengths)
    if len(lengths.shape) != 1 or _kind(lengths) != "int":
        raise ValueError(_message("prompt_lengths", "integer lengths of shape (batch_size,)")
                         + f"prompt_lengths.shape={tuple(lengths.shape)}, "
                         f"dtype={_kind(lengths)}")
    message = _message("prompt_lengths", "one length per prompt row, each in [1, the prompt "
                                         "length]")
    known, width = concrete_value(lengths), ids.shape[1]
    if known is not None and width is not None and concrete_value(ids) is not None:
        if known.shape[0] != ids.shape[0] or np.any(known < 1) or np.any(known > width):
            raise ValueError(message + f"prompt_lengths={known.tolist()} for prompt_ids of "
                                       f"shape {tuple(ids.shape)}")
        return ops.convert_to_tensor(known, "int32")
    lengths = ops.cast(lengths, "int32")
    ok = ops.logical_and(ops.all(lengths >= 1),
                         ops.all(lengths <= ops.cast(ops.shape(ids)[1], "int32")))
    ok = ops.logical_and(ok, ops.equal(ops.shape(lengths)[0], ops.shape(ids)[0]))
    (lengths,) = _in_graph(ok, message + "prompt_lengths: ", (lengths,), (lengths,))
    return lengths


def _first_unpadded_row(present: np.ndarray):
    """The first row of the boolean `(B, T)` `present` that is not tokens-then-padding."""
    wrong = ~present[:, 0] | np.any(present[:, 1:] & ~present[:, :-1], axis=1)
    return int(np.argmax(wrong)) if wrong.any() else None


def vocabulary_size(layer) -> int | None:
    """`layer.vocabulary_size` (`vocab_size` of keras_attn 0.2's and the Bahdanau stacks) when
    it is an integer (keras_attn's encoders and decoders), else None (a model of its own
    keeping the decoding contract)."""
    size = getattr(layer, "vocabulary_size", getattr(layer, "vocab_size", None))
    return int(size) if isinstance(size, (int, np.integer)) and not isinstance(
        size, bool) else None


def length(name: str, value, minimum: int) -> None:
    """Raise unless `value` is an integer in `[minimum, 2**31 - 2]` (positions are int32)."""
    if (isinstance(value, bool) or not isinstance(value, (int, np.integer))
            or not minimum <= value <= INT32_MAX - 1):
        raise ValueError(_message(name, f"an integer in [{minimum}, {INT32_MAX - 1}] (positions "
                                        "are int32)") + f"{name}={value!r}")


def stop_tokens(stop_token_ids, vocab_size, never_emitted) -> tuple | None:
    """`stop_token_ids` as a tuple of ints, or None (no id ends a row), checked: each a token
    the search can emit, below `vocab_size` (when known) and not one of `never_emitted`.

    Args:
        stop_token_ids: None, an int, or a tuple or list of ints (an empty one is None).
        vocab_size: optional int, the model's vocabulary size.
        never_emitted: the ids the search never chooses (padding, `<bos>`).

    Returns:
        A tuple of ints, or None.

    Raises:
        ValueError: naming `stop_token_ids`.
    """
    if stop_token_ids is None:
        return None
    name = "stop_token_ids"
    ids = tuple(stop_token_ids) if isinstance(stop_token_ids, (tuple, list)) else (
        stop_token_ids,)
    expected = "None (no end token), or a token id the model can emit or a tuple of them"
    for end in ids:
        if isinstance(end, bool) or not isinstance(end, (int, np.integer)) or end < 0:
            raise ValueError(_message(name, expected) + f"{name}={stop_token_ids!r}")
        if vocab_size is not None and end >= vocab_size:
            raise ValueError(_message(name, expected + f", below the vocabulary size "
                                      f"{vocab_size}") + f"{name}={stop_token_ids!r}")
        if int(end) in tuple(int(t) for t in never_emitted):
            raise ValueError(_message(name, expected + f", not one of the ids never emitted "
                                      f"{tuple(never_emitted)} (padding, <bos>)") +
                             f"{name}={stop_token_ids!r}")
    return tuple(int(end) for end in ids) or None
