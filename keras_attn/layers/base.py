"""The call contract shared by every attention layer.

`BaseAttention.call(query, key=None, value=None, valid_lens=None, attention_mask=None,
use_causal_mask=False, return_attention_scores=False, training=None)` resolves the defaults
(`key` = `query`, `value` = `key`), merges every kind of mask into one boolean `(B, T, S)` mask
(True = attend), and hands the work to the subclass's `attend`.
"""

from __future__ import annotations

import keras

from keras_attn import ops as attn_ops
from keras_attn._checks import check_positive_int, check_rate  # noqa: F401 (re-exported)


def check_last_dim(name: str, shape, expected, other: str) -> None:
    """Raise if `shape[-1]` is known and differs from `expected`."""
    if shape[-1] is not None and expected is not None and shape[-1] != expected:
        raise ValueError(
            f"Argument `{name}` must have last dimension {expected} to match `{other}`. "
            f"Received: {name}.shape={tuple(shape)}"
        )


class BaseAttention(keras.layers.Layer):
    """Base class: argument defaults, mask merging and the shared return convention.

    Subclasses implement `attend(query, key, value, mask, training)` returning
    `(outputs, weights)`, and `build(query_shape, key_shape=None, value_shape=None)`.

    Args:
        dropout: float in [0, 1), dropout on the attention weights. Defaults to `0.0`.
        seed: optional int seed for that dropout. Defaults to `None`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).
    """

    def __init__(self, dropout: float = 0.0, seed: int | None = None, **kwargs):
        super().__init__(**kwargs)
        check_rate("dropout", dropout)
        self.dropout = dropout
        self.seed = seed
        self.supports_masking = True
        self.seed_generator = keras.random.SeedGenerator(seed) if dropout > 0 else None

    def check_inputs(self, query_shape, key_shape, value_shape) -> None:
        """Batch sizes agree and keys and values have the same length."""
        if len(query_shape) < 2:
            raise ValueError(
                "Argument `query` must have shape (batch_size, query_len, ...). "
                f"Received: query.shape={tuple(query_shape)}"
            )
        for name, shape in (("key", key_shape), ("value", value_shape)):
            if len(shape) < 2:
                raise ValueError(
                    f"Argument `{name}` must have shape (batch_size, key_len, ...). "
                    f"Received: {name}.shape={tuple(shape)}"
                )
            if None not in (shape[0], query_shape[0]) and shape[0] != query_shape[0]:
                raise ValueError(
                    f"Arguments `query` and `{name}` must have the same batch size. Received: "
                    f"query.shape={tuple(query_shape)}, {name}.shape={tuple(shape)}"
                )
        if None not in (key_shape[1], value_shape[1]) and key_shape[1] != value_shape[1]:
            raise ValueError(
                "Arguments `key` and `value` must have the same length (axis 1). Received: "
                f"key.shape={tuple(key_shape)}, value.shape={tuple(value_shape)}"
            )

    def dropout_weights(self, weights, training):
        """Dropout applied to attention weights when training."""
        if training and self.dropout > 0:
            return attn_ops.dropout(weights, self.dropout, seed=self.seed_generator)
        return weights

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
        fold_query_mask=True,
    ):
        """Resolve `key`/`value` defaults and merge all masks into one `(B, T, S)` mask.

        `key_len` overrides the number of keys (a decoding cache is longer than `key`).
        With `fold_query_mask=False` the (explicit or implicit) query mask is left out of the
        merged mask, so a key mask alone stays `(B, 1, S)`; the caller then zeroes the padded
        queries' outputs itself (see `query_padding_mask`).
        Returns `(key, value, mask)`; `mask` is None when nothing masks.
        """
        self_attention = key is None
        key = query if key is None else key
        value = key if value is None else value
        # Keras implicit masks (e.g. Embedding(mask_zero=True)) ride on the tensors.
        query_mask = self.query_padding_mask(query, query_mask)
        if self_attention:
            key_mask = query_mask
        elif key_mask is None:
            key_mask = value_mask if value_mask is not None else getattr(key, "_keras_mask", None)
        mask = attn_ops.merge_masks(
            keras.ops.shape(query)[1],
            keras.ops.shape(key)[1] if key_len is None else key_len,
            valid_lens=valid_lens,
            attention_mask=attention_mask,
            use_causal_mask=use_causal_mask,
            query_mask=query_mask if fold_query_mask else None,
            key_mask=key_mask,
            causal_offset=causal_offset,
            batch_size=query.shape[0],
        )
        return key, value, mask

    @staticmethod
    def query_padding_mask(query, query_mask=None):
        """The `(B, T)` query mask `prepare` folds in: `query_mask` or the implicit Keras one."""
        return query_mask if query_mask is not None else getattr(query, "_keras_mask", None)

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
        key, value, mask = self.prepare(
            query, key, value, valid_lens, attention_mask, use_causal_mask,
            query_mask, key_mask, value_mask,
        )
        outputs, weights = self.attend(query, key, value, mask, training)
        if return_attention_scores:
            return outputs, weights
        return outputs

    def attend(self, query, key, value, mask, training):  # pragma: no cover - abstract
        raise NotImplementedError

    def get_config(self):
        config = super().get_config()
        config.update({"dropout": self.dropout, "seed": self.seed})
        return config
