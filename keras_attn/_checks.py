"""Argument checks shared by every module: a ValueError that names the argument, says what was
expected and shows what came in. This module imports nothing of keras_attn, so every
other module can use it."""

from __future__ import annotations

import os
import sys
import warnings

import keras
import numpy as np

_LIBRARY_DIRS = tuple(os.path.dirname(os.path.abspath(module.__file__)) + os.sep
                      for module in (sys.modules[__name__.rsplit(".", 1)[0]], keras))


def warn_deprecated(message: str) -> None:
    """A DeprecationWarning attributed to the first caller outside keras_attn and Keras, so
    that Python's default filters show it to the user whose code asked for it (a warning
    attributed to library code is hidden)."""
    level, frame = 2, sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(
            _LIBRARY_DIRS):
        frame, level = frame.f_back, level + 1
    warnings.warn(message, DeprecationWarning, stacklevel=level)


def renamed_argument(owner: str, kwargs: dict, old: str, new: str, value, default=None):
    """The value of the argument `new` of `owner`, or of its keras_attn 0.2 name `old` found
    in `kwargs` (with a DeprecationWarning): `kwargs` holds a function's extra keyword
    arguments, of which `old` is the only one allowed (others are a TypeError, as Python
    says); both names at once are a ValueError."""
    unknown = sorted(set(kwargs) - {old})
    if unknown:
        raise TypeError(f"{owner}() got an unexpected keyword argument {unknown[0]!r}")
    if old not in kwargs:
        return value
    if value is not default:
        raise ValueError(f"Arguments `{old}` (deprecated) and `{new}` say the same thing; give "
                         f"`{new}` only. Received: {old}={kwargs[old]!r}, {new}={value!r}")
    warn_deprecated(f"{owner}: `{old}` is `{new}` (keras_attn 0.3 names, see CHANGELOG.md).")
    return kwargs[old]


def _fail(name: str, expected: str, value) -> None:
    raise ValueError(
        f"Received an invalid value for argument `{name}`, expected {expected}. "
        f"Received: {name}={value!r}"
    )


def check_int(name: str, value, minimum: int = 1, allow_none: bool = False) -> None:
    """Raise unless `value` is an integer `>= minimum` (or None when `allow_none`)."""
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        expected = {1: "a positive integer", 0: "a non-negative integer"}.get(
            minimum, f"an integer >= {minimum}"
        )
        _fail(name, expected, value)


def as_int(name: str, value, minimum: int = 1, allow_none: bool = False) -> int | None:
    """`value` as a Python int (NumPy integers included) after `check_int`, so that it never
    reaches a Keras layer, which takes Python ints only."""
    check_int(name, value, minimum, allow_none)
    return None if value is None else int(value)


def check_positive_int(name: str, value, allow_none: bool = False) -> None:
    """Raise unless `value` is a positive integer (or None when `allow_none`)."""
    check_int(name, value, 1, allow_none)


def check_rate(name: str, value) -> None:
    """Raise unless `value` is a number in [0, 1)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1:
        _fail(name, "a float in [0, 1)", value)


def as_rate(name: str, value) -> float:
    """`value` as a Python float in [0, 1): anything `float()` takes (NumPy scalars, 0-d
    arrays), else the ValueError of `check_rate`."""
    try:
        value = float(value)
    except (TypeError, ValueError):
        _fail(name, "a float in [0, 1)", value)
    check_rate(name, value)
    return value


def check_bool(name: str, value) -> None:
    """Raise unless `value` is a bool."""
    if not isinstance(value, bool):
        _fail(name, "a bool", value)


def check_number(name: str, value, minimum: float | None = None, strict: bool = False,
                 allow_none: bool = False) -> None:
    """Raise unless `value` is a finite real number (not a bool), `> minimum` when `strict`,
    else `>= minimum` (no bound when `minimum` is None); None passes when `allow_none`."""
    if value is None and allow_none:
        return
    number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_))
    if not number or not np.isfinite(value) or (
            minimum is not None and (value <= minimum if strict else value < minimum)):
        bound = "" if minimum is None else f" {'>' if strict else '>='} {minimum}"
        _fail(name, f"a finite number{bound}", value)


def check_one_of(name: str, value, options) -> None:
    """Raise unless `value` is one of `options`."""
    if value not in options:
        _fail(name, "one of " + ", ".join(repr(option) for option in options), value)


def static_int(value):
    """`value` as a Python int when it is known without running a graph, else None."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return int(value)
    concrete = concrete_value(value)
    if concrete is not None and concrete.ndim == 0 and np.issubdtype(concrete.dtype, np.integer):
        return int(concrete)
    return None


def concrete_value(x):
    """`x` as a NumPy array when its value is known now (NumPy data, an eager tensor), or None
    when it is symbolic (a tensor being traced, a Keras symbolic tensor)."""
    if isinstance(x, (str, bytes)):
        return None
    if isinstance(x, (np.ndarray, np.generic, list, tuple, int, float)):
        return np.asarray(x)
    if isinstance(x, keras.KerasTensor):
        return None
    backend = keras.backend.backend()
    try:
        if backend == "tensorflow":
            import tensorflow as tf

            if tf.is_tensor(x) and not tf.is_symbolic_tensor(x):
                return x.numpy()
            return None
        if backend == "jax":
            import jax

            return None if isinstance(x, jax.core.Tracer) else np.asarray(x)
        if backend == "torch":
            import torch

            # Under `torch.compile` a value read is a graph break: treat it as symbolic.
            return None if torch.compiler.is_compiling() else x.detach().cpu().numpy()
    except (AttributeError, TypeError, ValueError, RuntimeError):
        return None
    return None


def as_use_bias(use_bias, projections: tuple) -> bool | tuple:
    """`use_bias` as a bool, or a tuple of names among `projections` (in their order)."""
    if isinstance(use_bias, bool):
        return use_bias
    names = (use_bias,) if isinstance(use_bias, str) else use_bias
    if not isinstance(names, (tuple, list, set, frozenset)) or not all(
            name in projections for name in names):
        raise ValueError(
            "Received an invalid value for argument `use_bias`, expected a bool or a "
            f"collection of projection names among {projections}. Received: "
            f"use_bias={use_bias!r}"
        )
    return tuple(name for name in projections if name in names)


def as_output_shape(output_dim, output_shape) -> tuple:
    """`(output_dim, output_shape)`: the int of a one-axis output (else None) and the tuple
    (None when neither is given); both may be given when they agree."""
    if output_shape is not None:
        shape = (output_shape,) if isinstance(output_shape, (int, np.integer)) else output_shape
        if not isinstance(shape, (tuple, list)) or not shape or any(
                isinstance(d, bool) or static_int(d) is None or d < 1 for d in shape):
            raise ValueError(
                "Received an invalid value for argument `output_shape`, expected a positive "
                f"int or a tuple of them. Received: output_shape={output_shape!r}"
            )
        shape = tuple(int(d) for d in shape)
        if output_dim is not None and shape != (output_dim,):
            raise ValueError(
                "Arguments `output_dim` and `output_shape` disagree; give one. Received: "
                f"output_dim={output_dim!r}, output_shape={output_shape!r}"
            )
        return (shape[0] if len(shape) == 1 else None), shape
    return output_dim, (None if output_dim is None else (output_dim,))


def as_path(name: str, value) -> str:
    """`value` (a str or `os.PathLike`, not empty) as a str path, else the ValueError naming
    `name` (None, an empty string, bytes and numbers are refused: `""` would mean the working
    directory without saying so)."""
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value:
        _fail(name, "a non-empty path (str or os.PathLike)", value)
    return value


def check_new_directory(name: str, value) -> str:
    """`value` as a str path where a directory may be written without replacing anything:
    it does not exist yet, or it is an empty directory. Otherwise the ValueError naming
    `name` (an existing file, or a directory with files in it, is never written into)."""
    path = as_path(name, value)
    if os.path.exists(path) and not os.path.isdir(path):
        _fail(name, "a directory to write (this path is an existing file)", value)
    if os.path.isdir(path) and os.listdir(path):
        found = sorted(os.listdir(path))
        raise ValueError(
            f"Received an invalid value for argument `{name}`, expected a new or empty "
            f"directory: nothing already there is replaced. Received: {name}={value!r}, "
            f"which holds {found[:8]}")
    return path
