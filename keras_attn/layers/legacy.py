"""The argument names of keras_attn 0.1 and 0.2 for blocks, stacks and builders, translated
to today's: a call that uses them still works for one release, with a DeprecationWarning, and a
`.keras` file saved with them loads without one. An earlier name given beside today's is a
ValueError (`said`: the caller's parameters given).

| earlier | now |
|---|---|
| `vocab_size`, `source_vocab_size`, `target_vocab_size` | `vocabulary_size`, `source_vocabulary_size`, `target_vocabulary_size` |
| `embed_dim` | `hidden_dim` |
| `ffn_dim` | `intermediate_dim` |
| `norm_first` | `normalize_first` |
| `epsilon` (of a block or stack) | `layer_norm_epsilon` |
| `tie_embeddings` | `tie_word_embeddings` |
| `max_length` (a stack's position table) | `max_sequence_length` |
| `position_encoding="sinusoidal"` or `"learned"` (the decoder-only stack's embedding) | `position_embedding` |
| `num_heads`, `num_key_value_heads`, `head_dim`, `position_encoding`, `implementation`, `chunk_size`, `sliding_window` of a block or stack | fields of its `attention` (`AttentionConfig`) |
| `attention_window=d` | `sliding_window=d + 1` |
| a block's `use_bias` naming attention projections and `"ffn"` | `attention.use_bias` (the projections) and `use_bias` (the FFN) |
| `gated_ffn=True` with `activation=a` | `activation=` the gated name of `a` (`"swiglu"`, `"geglu"`, `"geglu_tanh"`, `"reglu"`) |
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import threading

from keras_attn._checks import check_positive_int, warn_deprecated
from keras_attn.layers.config import PROJECTIONS, AttentionConfig

RENAMED = {
    "vocab_size": "vocabulary_size",
    "source_vocab_size": "source_vocabulary_size",
    "target_vocab_size": "target_vocabulary_size",
    "embed_dim": "hidden_dim",
    "ffn_dim": "intermediate_dim",
    "norm_first": "normalize_first",
    "epsilon": "layer_norm_epsilon",
    "tie_embeddings": "tie_word_embeddings",
}
ATTENTION_FIELDS = tuple(f.name for f in dataclasses.fields(AttentionConfig))


_CALLS = threading.local()  # .stack: (function, names given, instance) of the calls seen


def records_given(function):
    """Decorate `function` so that `said` knows which of its parameters a call named, even
    those given with their default value (`causal_lm(embed_dim=16, hidden_dim=128)`).

    For builders, and for the `__init__` of classes that take earlier names: there the names
    are those of the outermost decorated `__init__` call on the same object (the user's call),
    not of a subclass's `super().__init__` passing every argument on, so each class of such a
    hierarchy that defines `__init__` is decorated."""
    signature = inspect.signature(function)
    is_method = next(iter(signature.parameters), None) == "self"

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        names = frozenset(signature.bind_partial(*args, **kwargs).arguments)
        stack = _CALLS.__dict__.setdefault("stack", [])
        stack.append((function, names, args[0] if is_method and args else None))
        try:
            return function(*args, **kwargs)
        finally:
            stack.pop()

    wrapper.__signature__ = signature  # Keras reads an `__init__`'s argument names
    return wrapper


def said(function, **values) -> dict:
    """The arguments among `values` (today's names of `function`'s parameters, with the values
    a call received) that the caller gave: those its call named when `function` is decorated
    with `records_given` (for an `__init__`, the outermost decorated one on the same object),
    else those that differ from their defaults (a value equal to its default cannot be told
    from one not given then). `rename` and `take` refuse an earlier name beside one of them."""
    target = inspect.unwrap(function)
    stack = getattr(_CALLS, "stack", [])
    for called, names, instance in reversed(stack):
        if called is target:
            if instance is not None:
                names = next(n for _, n, i in stack if i is instance)
            return {name: value for name, value in values.items() if name in names}
    parameters = inspect.signature(function).parameters
    return {name: value for name, value in values.items()
            if value is not parameters[name].default and value != parameters[name].default}


def _refuse_both(old: str, new: str, kwargs: dict, said: dict | None) -> None:
    """A ValueError when `new` was given beside `old` (in `kwargs` or, as a parameter of the
    caller, in `said`)."""
    given = dict(said or {}, **kwargs)
    if new in given:
        raise ValueError(
            f"Arguments `{old}` (deprecated) and `{new}` say the same thing; give `{new}` "
            f"only. Received: {old}={kwargs[old]!r}, {new}={given[new]!r}")


def rename(kwargs: dict, owner: str, mapping: dict, warn: bool = True,
           said: dict | None = None) -> dict:
    """Pop the arguments of `kwargs` (in place) that `mapping` renames (`{old: new}`):
    `{new: value}`, with a DeprecationWarning when `warn`. An argument given under both names
    (the new one in `kwargs` or in `said`, the caller's parameters given: see `said`) is a
    ValueError."""
    renamed = {}
    for old, new in mapping.items():
        if old in kwargs:
            _refuse_both(old, new, kwargs, said)
            renamed[new] = kwargs.pop(old)
    if renamed and warn:
        warn_deprecated(f"{owner}: " + "; ".join(
            f"`{old}` is `{new}`" for old, new in mapping.items() if new in renamed)
            + " (keras_attn 0.3 names, see CHANGELOG.md).")
    return renamed


def _window(attention_window, sliding_window, warn: bool):
    """`sliding_window`, or the deprecated `attention_window=d` as `d + 1`."""
    check_positive_int("attention_window", attention_window)
    if sliding_window is not None:
        raise ValueError(
            "Arguments `attention_window` (deprecated) and `sliding_window` say the same thing; "
            f"give `sliding_window` only. Received: attention_window={attention_window!r}, "
            f"sliding_window={sliding_window!r}")
    if warn:
        warn_deprecated(
            f"`attention_window={attention_window}` is deprecated: it is "
            f"`sliding_window={attention_window + 1}` (a query sees the keys at distance < "
            "sliding_window, as in keras.layers.MultiHeadAttention).")
    return attention_window + 1


def split_use_bias(use_bias, owner: str | None = None):
    """A block's or stack's `use_bias` of earlier releases, a bool or names of attention
    projections, `"ffn"` and `"head"`: `(attention use_bias, FFN use_bias)`. An untied output
    head now has a bias when the FFN has (`"head"` alone is not expressed). Names warn of the
    deprecation when `owner` (the class, for the message) is given."""
    if isinstance(use_bias, bool):
        return use_bias, use_bias
    names = (use_bias,) if isinstance(use_bias, str) else (
        tuple(use_bias) if isinstance(use_bias, (list, tuple, set, frozenset)) else (use_bias,))
    projections = tuple(name for name in names if name in PROJECTIONS)
    unknown = [name for name in names if name not in PROJECTIONS + ("ffn", "head")]
    if unknown:
        raise ValueError(
            "Received an invalid value for argument `use_bias`, expected a bool or names among "
            f"{PROJECTIONS + ('ffn', 'head')}. Received: use_bias={use_bias!r}")
    if owner is not None:
        warn_deprecated(f"{owner}: `use_bias` naming parts is `attention.use_bias` (the "
                        "projections) and the block's `use_bias` (the FFN) (keras_attn 0.3 "
                        "names, see CHANGELOG.md).")
    return projections or False, "ffn" in names


def take(kwargs: dict, owner: str, warn: bool = True, fields_ok: bool = False,
         said: dict | None = None) -> tuple[dict, dict]:
    """Pop the arguments of earlier releases out of `kwargs` (in place).

    Args:
        kwargs: a constructor's keyword arguments (or a config being loaded).
        owner: the class or function, for the warning.
        warn: whether to warn (a user's call) or not (a saved config).
        fields_ok: the attention fields are arguments of the caller (the model builders):
            taken without a warning.
        said: the caller's own parameters that the call gave (`said`): an earlier name of one
            of them is a ValueError, as in `rename`.

    Returns:
        `(renamed, attention)`: today's names for the renamed arguments, and the attention
        fields given directly (`num_heads`, `implementation`, ...; `attention_window` as
        `sliding_window`), `renamed["gated_ffn"]` when given (the caller folds it into its
        activation: `activations.gated_name`). A `use_bias` left in `kwargs` (a stack's or
        builder's: every part) is split into `attention["use_bias"]` and the FFN's
        `renamed["use_bias"]`.
    """
    renamed, attention, used = {}, {}, []
    for old, new in RENAMED.items():
        if old in kwargs:
            _refuse_both(old, new, kwargs, said)
            renamed[new] = kwargs.pop(old)
            used.append(f"`{old}` is `{new}`")
    for name in ATTENTION_FIELDS:
        if name != "use_bias" and name in kwargs:
            attention[name] = kwargs.pop(name)
            if not fields_ok:
                used.append(f"`{name}` is a field of `attention`")
    if kwargs.get("attention_window", 0) is None:  # saved as "no window": nothing to say
        kwargs.pop("attention_window")
    if "attention_window" in kwargs:
        attention["sliding_window"] = _window(kwargs.pop("attention_window"),
                                              attention.get("sliding_window"), warn)
    if "gated_ffn" in kwargs:  # folded into the activation's name by the caller
        renamed["gated_ffn"] = kwargs.pop("gated_ffn")
        used.append("`gated_ffn=True` is a gated activation name (`\"swiglu\"`, "
                    "`\"geglu_tanh\"`, ...)")
    if "use_bias" in kwargs:  # a stack's or builder's: every part's biases
        attention["use_bias"], renamed["use_bias"] = split_use_bias(kwargs.pop("use_bias"))
        if not fields_ok:
            used.append("`use_bias` is `attention.use_bias` (the projections) and the "
                        "block's `use_bias` (the FFN and the head)")
    if used and warn:
        warn_deprecated(f"{owner}: " + "; ".join(used) + " (keras_attn 0.3 names, see "
                        "CHANGELOG.md).")
    return renamed, attention
