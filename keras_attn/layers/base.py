"""The call contract shared by every attention layer.

`BaseAttention.call(query, key=None, value=None, valid_lens=None, attention_mask=None,
use_causal_mask=False, return_attention_scores=False, training=None)` resolves the defaults
(`key` = `query`, `value` = `key`), casts integer inputs to the compute dtype, checks ranks and
sizes, turns every mask (arguments and Keras implicit masks) into one `AttentionMask`, zeroes the
inputs at positions the mask hides everywhere (the one place a layer does so), and hands the work
to the subclass's `attend`.
"""

from __future__ import annotations

import inspect
import numbers

import keras
from keras import ops

from keras_attn import ops as attn_ops
from keras_attn._checks import (  # noqa: F401 - re-exported for the layers
    check_int,
    check_positive_int,
    check_rate,
    static_int,
)
from keras_attn.ops import AttentionMask
from keras_attn.ops.masks import hide_positions


def as_shape(name: str, shape) -> tuple:
    """`shape` (a tuple, list or `TensorShape` of sizes, None for unknown) as a tuple; anything
    else is a ValueError naming the argument `<name>_shape`. A symbolic size (JAX's, when Keras
    infers the output of a layer that calls this one, on inputs of unknown batch or length) is
    unknown: None."""
    sizes = tuple(shape) if isinstance(shape, (tuple, list)) or hasattr(
        shape, "as_list") else None
    if sizes is not None:
        sizes = tuple(None if _is_symbolic(s) else s for s in sizes)
    if sizes is None or not all(s is None or (isinstance(s, numbers.Integral)
                                              and not isinstance(s, bool)) for s in sizes):
        raise ValueError(
            f"Argument `{name}_shape` must be a shape: a tuple of sizes (None for unknown). "
            f"Received: {name}_shape={shape!r}"
        )
    return tuple(None if s is None else int(s) for s in sizes)


def _is_symbolic(size) -> bool:
    if keras.backend.backend() != "jax" or isinstance(size, (numbers.Integral, type(None))):
        return False
    from jax import export

    return export.is_symbolic_dim(size)


def check_last_dim(name: str, shape, expected, other: str) -> None:
    """Raise if `shape[-1]` is known and differs from `expected`."""
    if shape[-1] is not None and expected is not None and shape[-1] != expected:
        raise ValueError(
            f"Argument `{name}` must have last dimension {expected} to match `{other}`. "
            f"Received: {name}.shape={tuple(shape)}"
        )


def padding_masks(query, key, value, query_mask=None, key_mask=None, value_mask=None,
                  self_attention=False, cached=False):
    """`(query_mask, key_mask)`: the padding masks of a call, explicit or the Keras implicit
    masks of the inputs (e.g. `Embedding(mask_zero=True)`). Self-attention keys take the
    query's padding; keys of a cache (`cached`) take only an explicit key or value mask, since
    the cache holds earlier keys too."""
    query_mask = query_mask if query_mask is not None else getattr(query, "_keras_mask", None)
    if cached:
        key_mask = key_mask if key_mask is not None else value_mask
    elif self_attention:
        key_mask = query_mask if key_mask is None else key_mask
    elif key_mask is None:
        key_mask = value_mask if value_mask is not None else getattr(key, "_keras_mask", None)
    return query_mask, key_mask


class BaseAttention(keras.layers.Layer):
    """Base class: argument defaults, input checks, the mask, the return convention.

    Subclasses implement `attend(query, key, value, mask, training, need_weights)` returning
    `(outputs, weights)` (`mask` an `AttentionMask` or None), `build`,
    `compute_output_shape(query_shape, key_shape=None, value_shape=None)` and, when they return
    weights, `weights_shape(query_shape, key_shape)`. `input_ranks` lists the ranks the inputs
    may have.

    Args:
        dropout: float in [0, 1), dropout on the attention weights. Defaults to `0.0`.
        seed: optional int seed for that dropout. Defaults to `None`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).
    """

    input_ranks: tuple[int, ...] = (3,)

    def __init__(self, dropout: float = 0.0, seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        check_rate("dropout", dropout)
        check_int("seed", seed, 0, allow_none=True)
        self.dropout = dropout
        self.seed = seed
        self.supports_masking = True
        self.seed_generator = keras.random.SeedGenerator(seed) if dropout > 0 else None

    def check_inputs(self, query_shape, key_shape, value_shape) -> None:
        """Ranks are among `input_ranks`, batch sizes agree, keys and values have one length."""
        ranks = " or ".join(str(r) for r in self.input_ranks)
        query_shape, key_shape, value_shape = (as_shape(n, s) for n, s in (
            ("query", query_shape), ("key", key_shape), ("value", value_shape)))
        for name, shape in (("query", query_shape), ("key", key_shape), ("value", value_shape)):
            if len(shape) not in self.input_ranks:
                raise ValueError(
                    f"Argument `{name}` must have rank {ranks}: (batch_size, length"
                    f"{', dim' if 3 in self.input_ranks else ''}). "
                    f"Received: {name}.shape={tuple(shape)}"
                )
            if None not in (shape[0], query_shape[0]) and shape[0] != query_shape[0]:
                raise ValueError(
                    f"Arguments `query` and `{name}` must have the same batch size. Received: "
                    f"query.shape={tuple(query_shape)}, {name}.shape={tuple(shape)}"
                )
        if None not in (key_shape[1], value_shape[1]) and key_shape[1] != value_shape[1]:
            raise ValueError(
                "Arguments `key` and `value` must be equal in length (axis 1). Received: "
                f"key.shape={tuple(key_shape)}, value.shape={tuple(value_shape)}"
            )

    def dropout_weights(self, weights, training):
        """Dropout applied to attention weights when training."""
        if training and self.dropout > 0:
            return attn_ops.dropout(weights, self.dropout, seed=self.seed_generator)
        return weights

    @staticmethod
    def masked_weights(scores, mask):
        """Float32 softmax weights of `(B, T, S)` scores under `mask` (an `AttentionMask` or
        None): hidden keys and padded queries get exactly zero weight."""
        if mask is None:
            return attn_ops.masked_softmax(scores)
        weights = attn_ops.masked_softmax(scores, mask=mask.block(rank=len(scores.shape)))
        if mask.query_valid is not None:
            weights = hide_positions(weights, mask.query_valid)
        return weights

    def as_float(self, name: str, x):
        """`x` as a floating tensor: integers and booleans are cast to the compute dtype."""
        x = ops.convert_to_tensor(x)
        dtype = keras.backend.standardize_dtype(x.dtype)
        if keras.backend.is_float_dtype(dtype):
            return x
        if "int" in dtype or dtype == "bool":
            return ops.cast(x, self.compute_dtype)
        raise ValueError(
            f"Argument `{name}` must be numeric. Received: {name}.dtype={dtype}"
        )

    def prepare(
        self,
        query,
        key=None,
        value=None,
        valid_lens=None,
        attention_mask=None,
        use_causal_mask=False,
        query_mask=None,
        key_mask=None,
        value_mask=None,
        key_len=None,
        causal_offset=0,
        window=None,
        num_global=0,
    ):
        """Resolve defaults, check the inputs, build the `AttentionMask`.

        `key_len` overrides the number of keys (a decoding cache is longer than `key`); the
        implicit mask of the query is then not taken as the keys' (the cache holds earlier
        keys). Inputs at positions hidden from every query are zeroed here, once, before any
        projection (`AttentionMask.hide_inputs`), so a non-finite number there reaches neither
        outputs nor gradients, weight gradients included.

        Returns:
            `(query, key, value, mask)`: float tensors and an `AttentionMask` (None when
            nothing masks).
        """
        self_attention = key is None
        key = query if key is None else key
        value = key if value is None else value
        query_mask, key_mask = padding_masks(query, key, value, query_mask, key_mask, value_mask,
                                             self_attention, cached=key_len is not None)
        # Keys that are the queries, with the queries' padding: zeroing the queries zeroes them.
        keys_follow_queries = self_attention and (key_mask is query_mask and valid_lens is None
                                                  or key_len is not None)
        inputs = {"query": query, "key": key, "value": value}
        query = self.as_float("query", query)
        key = query if inputs["key"] is inputs["query"] else self.as_float("key", key)
        value = key if inputs["value"] is inputs["key"] else self.as_float("value", value)
        self.check_inputs(query.shape, key.shape, value.shape)
        mask = AttentionMask.build(
            ops.shape(query)[1], ops.shape(key)[1] if key_len is None else key_len,
            query.shape[0], valid_lens, attention_mask, use_causal_mask, causal_offset,
            window, num_global, query_mask, key_mask,
        )
        if not mask.masks_keys and mask.query_valid is None and static_int(mask.offset) == 0:
            return query, key, value, None
        if keys_follow_queries:
            query = key = value = mask.hide_inputs(query)[0]
        elif key_len is not None:  # the key mask covers a cache: the keys come in there
            query = mask.hide_inputs(query)[0]
        else:
            query, key, value = mask.hide_inputs(query, key, value)
        return query, key, value, mask

    def call(
        self,
        query,
        key=None,
        value=None,
        valid_lens=None,
        attention_mask=None,
        use_causal_mask=False,
        return_attention_scores=False,
        training=None,
        query_mask=None,
        key_mask=None,
        value_mask=None,
    ):
        query, key, value, mask = self.prepare(
            query, key, value, valid_lens, attention_mask, use_causal_mask,
            query_mask, key_mask, value_mask,
        )
        outputs, weights = self.attend(query, key, value, mask, training,
                                       need_weights=bool(return_attention_scores))
        if return_attention_scores:
            return outputs, weights
        return outputs

    def attend(self, query, key, value, mask, training, need_weights=True):  # pragma: no cover
        raise NotImplementedError

    def weights_shape(self, query_shape, key_shape) -> tuple:
        """Shape of the attention weights: `(B, T, S)`."""
        return (query_shape[0], query_shape[1], key_shape[1])

    def compute_output_spec(self, *args, **kwargs):
        bound = inspect.signature(self.call).bind(*args, **kwargs).arguments
        query, key, value = bound["query"], bound.get("key"), bound.get("value")
        key = query if key is None else key
        value = key if value is None else value
        outputs = keras.KerasTensor(
            self.compute_output_shape(query.shape, key.shape, value.shape),
            dtype=self.compute_dtype)
        if not bound.get("return_attention_scores", False):
            return outputs
        weights = keras.KerasTensor(self.weights_shape(query.shape, key.shape),
                                    dtype=self.compute_dtype)
        return outputs, weights

    def get_config(self):
        config = super().get_config()
        config.update({"dropout": self.dropout, "seed": self.seed})
        return config
