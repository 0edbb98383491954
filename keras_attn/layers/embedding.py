"""The two ends of every keras_attn language model: token ids to vectors with their positions
(`TokenEmbedding`), and vectors to vocabulary logits (`OutputHead`, its projection untied or
tied to the token table). `TokenAndPositionEmbedding` is the learned-positions case under its
keras-hub name."""

from __future__ import annotations

import keras
from keras import ops

from keras_attn._checks import (
    check_bool,
    check_int,
    check_number,
    check_one_of,
    check_rate,
    static_int,
)
from keras_attn.layers import legacy
from keras_attn.layers.add_norm import NORMS, make_norm
from keras_attn.layers.dropout import Dropout
from keras_attn.layers.initializers import sublayer_initializer
from keras_attn.layers.position_encoding import sinusoidal_table
from keras_attn.layers.quantization import QuantizedSublayers

POSITIONS = (None, "sinusoidal", "learned")


class _TokenTable(keras.layers.ReversibleEmbedding):
    """Keras' `ReversibleEmbedding` (tied table: `ids -> E[ids]`, and `x -> x Eᵀ` with
    `reverse=True`, int8 and int4 included), quantizable as a subclass, and loading the table
    its parent read from a keras_attn 0.1 file (`TokenEmbedding.load_own_variables`)."""

    _loaded_by_parent = False

    def quantize(self, mode=None, type_check=True, config=None):
        # Keras refuses subclasses by default; this one changes nothing quantization touches.
        super().quantize(mode, type_check=False, config=config)

    def load_own_variables(self, store):
        if self._loaded_by_parent and not len(store.keys()):
            return
        super().load_own_variables(store)


def _check_positions(inputs, start_index, sequence_length: int):
    """The positions `start_index + t` of `inputs` `(B, T)`, int32 `(T,)`, refused when one
    reaches `sequence_length`: a ValueError when the length and the start are known now, else
    (TensorFlow graphs, e.g. inside `fit` and `predict`) an assertion that fails the call with
    the same message instead of an out-of-range gather."""
    length = ops.shape(inputs)[1]
    positions = ops.arange(length, dtype="int32") + ops.cast(start_index, "int32")  # (T,)
    message = (f"Argument `inputs` has more positions than the sequence_length="
               f"{sequence_length} this layer embeds (start_index + length must be at most "
               f"{sequence_length})")
    known_length, known_start = static_int(length), static_int(start_index)
    if known_length is not None and known_start is not None:
        if known_start + known_length > sequence_length:
            raise ValueError(f"{message}. Received: inputs.shape={tuple(inputs.shape)}, "
                             f"start_index={known_start}")
        return positions
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        last = ops.cast(start_index, "int32") + ops.cast(length, "int32")
        check = tf.debugging.assert_less_equal(last, sequence_length, message=message)
        with tf.control_dependencies([check]):
            positions = tf.identity(positions)
    return positions


# keras_attn 0.2's argument names of the embedding and the head.
_RENAMED = {"vocab_size": "vocabulary_size", "embed_dim": "hidden_dim",
            "sequence_length": "max_sequence_length", "epsilon": "layer_norm_epsilon",
            "tie_embeddings": "tie_word_embeddings"}


@keras.saving.register_keras_serializable(package="keras_attn")
class TokenEmbedding(QuantizedSublayers, keras.layers.Layer):
    """Token ids to vectors with their positions, the input end of every keras_attn model.

    `y = Dropout(Norm(E[ids] · scale + P[start_index + t] + S[token_type_ids]))`, each term
    optional: `P` is the sinusoid table of Vaswani et al. (`position="sinusoidal"`, added in
    float32) or a learned table of `max_sequence_length` rows (`"learned"`); with `position=None`
    the positions are the attention's business (RoPE, ALiBi, T5 buckets). `S` embeds segment
    ids (BERT's token types), `Norm` is BERT's LayerNorm after the embedding. The token table
    (`token_embedding`, a `keras.layers.ReversibleEmbedding`) also serves a tied `OutputHead`,
    quantized or not.

    Args:
        vocabulary_size: int, rows of the token table.
        hidden_dim: int, `d`.
        position: `None`, `"sinusoidal"` or `"learned"`. Defaults to `None`.
        max_sequence_length: int, the positions a `"learned"` table holds (required there,
            unused otherwise). Defaults to `None`.
        scale: optional float > 0 multiplying the token vectors, e.g. `sqrt(d)` (Vaswani et
            al.). Defaults to `None` (no scaling).
        num_segments: optional int, rows of the segment table. Defaults to `None` (none).
        norm: optional `"layer"` or `"rms"`, a norm after the sum. Defaults to `None`.
        layer_norm_epsilon: float, that norm's epsilon. Defaults to `1e-5`.
        dropout: float in [0, 1), dropout on the output. Defaults to `0.0`.
        seed: optional int seed for the dropout. Defaults to `None`.
        embeddings_initializer: initializer of the tables (each its own, see
            `keras_attn.layers.initializers`). Defaults to `"uniform"`.

    Call arguments:
        inputs: integer token ids `(B, T)`.
        start_index: int or scalar tensor, the position of `inputs[:, 0]` (decoding).
            Defaults to `0`.
        token_type_ids: optional integer `(B, T)` segment ids. Defaults to zeros.
        training: bool, whether dropout is active.

    Returns:
        `(B, T, hidden_dim)`.

    Example:
    >>> layer = TokenEmbedding(100, 16, position="learned", max_sequence_length=32)
    >>> layer(keras.ops.array([[5, 6, 7]])).shape  # (1, 3, 16)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", https://arxiv.org/abs/1706.03762
        Devlin et al., 2019, "BERT", https://arxiv.org/abs/1810.04805
    """

    @legacy.records_given
    def __init__(self, vocabulary_size: int | None = None, hidden_dim: int | None = None,
                 position: str | None = None, max_sequence_length: int | None = None,
                 scale: float | None = None, num_segments: int | None = None,
                 norm: str | None = None, layer_norm_epsilon: float = 1e-5,
                 dropout: float = 0.0, seed: int | None = None,
                 embeddings_initializer="uniform", **kwargs):
        renamed = legacy.rename(kwargs, type(self).__name__, _RENAMED,
                                warn=not kwargs.pop("_loading", False), said=legacy.said(
                                    TokenEmbedding.__init__, vocabulary_size=vocabulary_size,
                                    hidden_dim=hidden_dim, max_sequence_length=max_sequence_length,
                                    layer_norm_epsilon=layer_norm_epsilon))
        vocabulary_size = renamed.get("vocabulary_size", vocabulary_size)
        hidden_dim = renamed.get("hidden_dim", hidden_dim)
        max_sequence_length = renamed.get("max_sequence_length", max_sequence_length)
        layer_norm_epsilon = renamed.get("layer_norm_epsilon", layer_norm_epsilon)
        super().__init__(**kwargs)
        check_int("vocabulary_size", vocabulary_size, 1)
        check_int("hidden_dim", hidden_dim, 1)
        check_one_of("position", position, POSITIONS)
        check_int("max_sequence_length", max_sequence_length, 1,
                  allow_none=position != "learned")
        check_number("scale", scale, 0, strict=True, allow_none=True)
        check_int("num_segments", num_segments, 1, allow_none=True)
        check_one_of("norm", norm, (None,) + NORMS)
        check_number("layer_norm_epsilon", layer_norm_epsilon, 0, strict=True)
        check_rate("dropout", dropout)
        self.vocabulary_size, self.hidden_dim = int(vocabulary_size), int(hidden_dim)
        self.position = position
        self.max_sequence_length = (None if max_sequence_length is None
                                    else int(max_sequence_length))
        self.scale = scale
        self.num_segments = num_segments
        self.norm, self.layer_norm_epsilon = norm, layer_norm_epsilon
        self.dropout, self.seed = dropout, seed
        self.embeddings_initializer = keras.initializers.get(embeddings_initializer)
        policy = self.dtype_policy
        self.token_embedding = _TokenTable(
            self.vocabulary_size, self.hidden_dim,
            embeddings_initializer=sublayer_initializer(self.embeddings_initializer,
                                                        "token_embedding"),
            name="token_embedding", dtype=policy)
        self.position_embedding = None
        if position == "learned":
            self.position_embedding = keras.layers.Embedding(
                self.max_sequence_length, self.hidden_dim,
                embeddings_initializer=sublayer_initializer(self.embeddings_initializer,
                                                            "position_embedding"),
                name="position_embedding", dtype=policy)
        self.token_type_embedding = None
        if num_segments is not None:
            self.token_type_embedding = keras.layers.Embedding(
                num_segments, self.hidden_dim,
                embeddings_initializer=sublayer_initializer(self.embeddings_initializer,
                                                            "token_type_embedding"),
                name="token_type_embedding", dtype=policy)
        self.embedding_norm = None if norm is None else make_norm(
            norm, layer_norm_epsilon, "embedding_norm", policy)
        self.dropout_layer = Dropout(dropout, seed=seed, name="dropout", dtype=policy)

    def build(self, inputs_shape, token_type_ids_shape=None):
        if len(inputs_shape) != 2:
            raise ValueError(
                "Argument `inputs` must be integer token ids of shape (batch_size, seq_len). "
                f"Received: inputs.shape={tuple(inputs_shape)}")
        self.token_embedding.build(inputs_shape)
        if self.position_embedding is not None:
            self.position_embedding.build((None,))
        if self.token_type_embedding is not None:
            self.token_type_embedding.build(inputs_shape)
        if self.embedding_norm is not None:
            self.embedding_norm.build(tuple(inputs_shape) + (self.hidden_dim,))

    def call(self, inputs, start_index=0, token_type_ids=None, training=None):
        x = self.token_embedding(inputs)  # (B, T, d)
        if self.scale is not None:
            x = x * ops.cast(self.scale, x.dtype)
        if self.position == "sinusoidal":
            table = sinusoidal_table(ops.shape(inputs)[1], self.hidden_dim,
                                     start_index=start_index)  # (T, d) float32
            x = ops.cast(ops.cast(x, "float32") + table, x.dtype)
        elif self.position == "learned":
            positions = _check_positions(inputs, start_index,
                                         self.max_sequence_length)  # (T,)
            x = x + self.position_embedding(positions)[None]
        if self.token_type_embedding is not None:
            if token_type_ids is None:
                token_type_ids = ops.zeros_like(inputs)
            x = x + self.token_type_embedding(token_type_ids)
        if self.embedding_norm is not None:
            x = self.embedding_norm(x)
        return self.dropout_layer(x, training=training)

    def load_own_variables(self, store):
        # keras_attn 0.1 stored a decoder-only model's token table as the weights of this
        # layer's place (a plain `Embedding` named "embedding"): read it into the table.
        if len(store.keys()) == 1 and not self._trainable_variables:
            self.token_embedding.load_own_variables(store)
            self.token_embedding._loaded_by_parent = True
            return
        super().load_own_variables(store)

    def compute_output_shape(self, inputs_shape, token_type_ids_shape=None):
        return tuple(inputs_shape) + (self.hidden_dim,)

    def compute_output_spec(self, inputs, start_index=0, token_type_ids=None, training=None):
        return keras.KerasTensor(tuple(inputs.shape) + (self.hidden_dim,),
                                 dtype=self.compute_dtype)

    @classmethod
    def from_config(cls, config):
        return cls(**config, _loading=True)  # keras_attn 0.2's names load without a warning

    def get_config(self):
        config = super().get_config()
        config.update({
            "vocabulary_size": self.vocabulary_size, "hidden_dim": self.hidden_dim,
            "position": self.position, "max_sequence_length": self.max_sequence_length,
            "scale": self.scale, "num_segments": self.num_segments, "norm": self.norm,
            "layer_norm_epsilon": self.layer_norm_epsilon, "dropout": self.dropout,
            "seed": self.seed,
            "embeddings_initializer": keras.initializers.serialize(
                self.embeddings_initializer),
            "dtype": self.dtype_config(),
        })
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
class TokenAndPositionEmbedding(TokenEmbedding):
    """Token embedding plus a learned position embedding: `E[ids] + P[positions]`.

    `TokenEmbedding(position="learned")` under keras-hub's name and arguments.

    Args:
        vocabulary_size: int, number of tokens.
        sequence_length: int, number of positions with an embedding of their own (the longest
            input, prompt and generated tokens included). A longer input is refused, inside
            `fit` and `predict` too.
        embedding_dim: int, `d`.
        mask_zero: bool, token id 0 is padding: the output carries the Keras implicit mask
            `ids != 0`. Defaults to `False`.
        embeddings_initializer: initializer of both tables. Defaults to `"uniform"`.

    Call arguments:
        inputs: integer token ids `(B, T)`.
        start_index: int or scalar tensor, the position of the first token (decoding).
            Defaults to `0`.

    Returns:
        `(B, T, embedding_dim)`.

    Example:
    >>> TokenAndPositionEmbedding(100, 32, 16)(keras.ops.array([[5, 6, 7]])).shape  # (1, 3, 16)
    """

    @legacy.records_given
    def __init__(self, vocabulary_size: int | None = None, sequence_length: int | None = None,
                 embedding_dim: int | None = None, mask_zero: bool = False,
                 embeddings_initializer="uniform", **kwargs):
        loading = kwargs.pop("_loading", False)
        vocabulary_size = legacy.rename(kwargs, type(self).__name__, {
            "vocab_size": "vocabulary_size"}, warn=not loading, said=legacy.said(
            TokenAndPositionEmbedding.__init__, vocabulary_size=vocabulary_size)).get(
            "vocabulary_size", vocabulary_size)
        check_int("sequence_length", sequence_length, 1)
        check_int("embedding_dim", embedding_dim, 1)
        check_bool("mask_zero", mask_zero)
        super().__init__(vocabulary_size, embedding_dim, position="learned",
                         max_sequence_length=sequence_length,
                         embeddings_initializer=embeddings_initializer, **kwargs)
        self.embedding_dim = int(embedding_dim)
        self.mask_zero = mask_zero
        self.supports_masking = mask_zero

    def build(self, inputs_shape):
        super().build(inputs_shape)

    def call(self, inputs, start_index=0):
        return super().call(inputs, start_index=start_index)

    def compute_mask(self, inputs, mask=None):
        return ops.not_equal(inputs, 0) if self.mask_zero else None

    def compute_output_spec(self, inputs, start_index=0):
        return super().compute_output_spec(inputs)

    def get_config(self):
        config = keras.layers.Layer.get_config(self)
        config.update({
            "vocabulary_size": self.vocabulary_size,
            "sequence_length": self.max_sequence_length,
            "embedding_dim": self.embedding_dim,
            "mask_zero": self.mask_zero,
            "embeddings_initializer": keras.initializers.serialize(self.embeddings_initializer),
            "dtype": self.dtype_config(),
        })
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
class OutputHead(QuantizedSublayers, keras.layers.Layer):
    """Hidden states to vocabulary logits, the output end of every keras_attn model.

    `logits = T(x) W + b` in float32, where `W` is a dense kernel, or with
    `tie_word_embeddings=True` the transposed token table of the model's `TokenEmbedding` (Press and
    Wolf, 2017; int8/int4-quantized tables keep their scales). The optional transform
    `T(x) = Norm(act(x W_t + b_t))` is BERT's masked-LM head (`transform_activation="gelu"`);
    without it `T(x) = x`.

    Args:
        vocabulary_size: int, number of logits.
        tie_word_embeddings: bool, project with the token table (`tie` links it). Defaults
            to `False`.
        use_bias: bool, a bias `b` on the logits. Defaults to `True`.
        transform_activation: optional activation: adds the transform `T`. Defaults to `None`.
        layer_norm_epsilon: float, the transform's LayerNorm epsilon. Defaults to `1e-5`.
        kernel_initializer: initializer of the dense kernels (each its own). Defaults to
            `"glorot_uniform"`.

    Call arguments:
        inputs: `(B, T, d)`.

    Returns:
        float32 logits `(B, T, vocabulary_size)`.

    Example:
    >>> head = OutputHead(100)
    >>> head(keras.ops.ones((2, 3, 16))).shape  # (2, 3, 100)

    References:
        Press and Wolf, 2017, "Using the Output Embedding to Improve Language Models",
        https://arxiv.org/abs/1608.05859
    """

    @legacy.records_given
    def __init__(self, vocabulary_size: int | None = None, tie_word_embeddings: bool = False,
                 use_bias: bool = True, transform_activation=None,
                 layer_norm_epsilon: float = 1e-5, kernel_initializer="glorot_uniform",
                 **kwargs):
        renamed = legacy.rename(kwargs, type(self).__name__, _RENAMED,
                                warn=not kwargs.pop("_loading", False), said=legacy.said(
                                    OutputHead.__init__, vocabulary_size=vocabulary_size,
                                    tie_word_embeddings=tie_word_embeddings,
                                    layer_norm_epsilon=layer_norm_epsilon))
        vocabulary_size = renamed.get("vocabulary_size", vocabulary_size)
        tie_word_embeddings = renamed.get("tie_word_embeddings", tie_word_embeddings)
        layer_norm_epsilon = renamed.get("layer_norm_epsilon", layer_norm_epsilon)
        super().__init__(**kwargs)
        check_int("vocabulary_size", vocabulary_size, 1)
        check_bool("tie_word_embeddings", tie_word_embeddings)
        check_bool("use_bias", use_bias)
        check_number("layer_norm_epsilon", layer_norm_epsilon, 0, strict=True)
        self.vocabulary_size = int(vocabulary_size)
        self.tie_word_embeddings, self.use_bias = tie_word_embeddings, use_bias
        self.layer_norm_epsilon = layer_norm_epsilon
        self.transform_activation = (None if transform_activation is None
                                     else keras.activations.get(transform_activation))
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.token_embedding = None

    def tie(self, token_embedding: keras.layers.ReversibleEmbedding) -> None:
        """Project with `token_embedding`'s table (before the head is built)."""
        if not isinstance(token_embedding, keras.layers.ReversibleEmbedding):
            raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
                "Argument `token_embedding` must be a keras.layers.ReversibleEmbedding (the "
                "`token_embedding` of a TokenEmbedding). Received: "
                f"token_embedding={token_embedding!r}")
        self.token_embedding = token_embedding

    def _dense(self, units: int, name: str, **kwargs) -> keras.layers.Dense:
        return keras.layers.Dense(
            units, kernel_initializer=sublayer_initializer(self.kernel_initializer, name),
            name=name, dtype=self.dtype_policy, **kwargs)

    def build(self, inputs_shape):
        dim = inputs_shape[-1]
        if dim is None:
            raise ValueError("Argument `inputs` must have a known last dimension. "
                             f"Received: inputs.shape={tuple(inputs_shape)}")
        self.transform_dense = self.transform_norm = None
        if self.transform_activation is not None:
            self.transform_dense = self._dense(dim, "transform_dense",
                                               activation=self.transform_activation)
            self.transform_dense.build(inputs_shape)
            self.transform_norm = keras.layers.LayerNormalization(
                epsilon=self.layer_norm_epsilon, name="transform_norm",
                dtype=self.dtype_policy)
            self.transform_norm.build(inputs_shape)
        self.output_dense = self.bias = None
        if not self.tie_word_embeddings:
            self.output_dense = self._dense(self.vocabulary_size, "output_dense",
                                            use_bias=self.use_bias)
            self.output_dense.build(inputs_shape)
            return
        table = self.token_embedding
        if table is None or (table.input_dim, table.output_dim) != (self.vocabulary_size, dim):
            raise ValueError(
                "A tied OutputHead needs a token table of shape "
                f"(vocabulary_size={self.vocabulary_size}, {dim}) linked with "
                f"`tie(token_embedding)` before it is built. Received: token_embedding={table!r}")
        if self.use_bias:
            self.bias = self.add_weight(name="bias", shape=(self.vocabulary_size,),
                                        initializer="zeros")

    def call(self, inputs):
        x = inputs  # (B, T, d)
        if self.transform_dense is not None:
            x = self.transform_norm(self.transform_dense(x))  # (B, T, d)
        if self.output_dense is not None:
            return ops.cast(self.output_dense(x), "float32")  # (B, T, V)
        logits = self.token_embedding(x, reverse=True)  # x Eᵀ: (B, T, V)
        if self.bias is not None:
            logits = logits + ops.cast(self.bias, logits.dtype)
        return ops.cast(logits, "float32")

    def compute_output_shape(self, inputs_shape):
        return tuple(inputs_shape[:-1]) + (self.vocabulary_size,)

    def compute_output_spec(self, inputs):
        return keras.KerasTensor(self.compute_output_shape(inputs.shape), dtype="float32")

    @property
    def tie_embeddings(self) -> bool:
        """Deprecated: `tie_word_embeddings`."""
        return self.tie_word_embeddings

    @classmethod
    def from_config(cls, config):
        return cls(**config, _loading=True)  # keras_attn 0.2's names load without a warning

    def get_config(self):
        config = super().get_config()
        config.update({
            "vocabulary_size": self.vocabulary_size,
            "tie_word_embeddings": self.tie_word_embeddings, "use_bias": self.use_bias,
            "transform_activation": (None if self.transform_activation is None else
                                     keras.activations.serialize(self.transform_activation)),
            "layer_norm_epsilon": self.layer_norm_epsilon,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "dtype": self.dtype_config(),
        })
        return config
