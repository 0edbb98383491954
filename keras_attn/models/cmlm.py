"""The two heads of a conditional masked language model (Mask-Predict): a bidirectional
decoder that predicts the masked target tokens, and a target-length classifier.

Ghazvininejad et al., 2019, "Mask-Predict: Parallel Decoding of Conditional Masked Language
Models", https://arxiv.org/abs/1904.09324. The model builder is
`keras_attn.models.nat_seq2seq`; the decoding loop `keras_attn.decoding.mask_predict`.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_attn._checks import check_positive_int
from keras_attn.layers import legacy
from keras_attn.layers.config import AttentionConfig, BlockConfig  # noqa: F401 - examples
from keras_attn.layers.embedding import TokenEmbedding
from keras_attn.layers.initializers import sublayer_initializer
from keras_attn.layers.quantization import QuantizedSublayers
from keras_attn.layers.transformer_blocks import TransformerDecoderBlock
from keras_attn.models.assembly import _Stack, document_stack, embeddings_initializer
from keras_attn.tokens import BOS_ID, EOS_ID, mask_id

# Logit of the ids a masked-LM decoder never emits: finite, so a loss stays finite.
_NEVER = -1e9


@keras.saving.register_keras_serializable(package="keras_attn")
@document_stack()
class CMLMDecoder(_Stack):
    """The decoder of a conditional masked language model: no causal mask, one parallel pass.

    The target ids are words, `<mask>` (id `mask_id(vocabulary_size) = vocabulary_size`, outside the
    vocabulary) and padding (`pad_id`). Every non-padding position attends to every other one
    (bidirectional self-attention) and to the encoder (cross-attention, source padding
    hidden); the logits predict the word at every position. Padding, `<bos>` and `<eos>` get
    the logit -1e9, and `<mask>` has no logit column, so the decoder never emits them. The
    embedding has `vocabulary_size + 1` rows, the last one for `<mask>`.

    Args:
{args}

    Call arguments:
        inputs: integer ids `(B, T)`: words, `<mask>`, padding.
        encoder_outputs: `(B, S, encoder_dim)`.
        encoder_padding_mask: optional boolean `(B, S)`, True at real source tokens. Defaults
            to the implicit mask of `encoder_outputs`.
        training: bool, whether dropout is active.
        padding_mask: optional boolean `(B, T)`, True at real target positions (words and
            `<mask>`). Defaults to `inputs != pad_id` (nothing when `pad_id` is None).

    Returns:
        float32 logits `(B, T, vocabulary_size)`.

    Example:
    >>> decoder = CMLMDecoder(20, num_layers=1, hidden_dim=16,
    ...                       block=BlockConfig(AttentionConfig(2), intermediate_dim=32))
    >>> decoder(keras.ops.array([[20, 7, 20, 0]]), keras.ops.ones((1, 5, 16))).shape
    (1, 4, 20)

    References:
        Ghazvininejad et al., 2019, "Mask-Predict", https://arxiv.org/abs/1904.09324
    """

    block_class = TransformerDecoderBlock

    def __init__(self, vocabulary_size: int | None = None, num_layers: int | None = None,
                 hidden_dim: int | None = None, block: BlockConfig | None = None, **kwargs):
        super().__init__(vocabulary_size, num_layers, hidden_dim, block, **kwargs)
        self._assemble()

    @property
    def mask_id(self) -> int:
        """The `<mask>` id, `vocabulary_size`."""
        return mask_id(self.vocabulary_size)

    def _embedding(self) -> TokenEmbedding:
        return TokenEmbedding(
            self.mask_id + 1, self.hidden_dim, position="sinusoidal",
            scale=math.sqrt(self.hidden_dim), dropout=self.dropout, seed=self.seed,
            embeddings_initializer=sublayer_initializer(
                embeddings_initializer(self.kernel_initializer), "embedding"),
            name="embedding", dtype=self.dtype_policy)

    def _block_arguments(self, name: str) -> dict:
        return dict(super()._block_arguments(name), causal=False)

    def build(self, inputs_shape, encoder_outputs_shape=None, *args):
        encoder_outputs_shape = encoder_outputs_shape or tuple(inputs_shape) + (self.hidden_dim,)
        self._build_parts(inputs_shape, encoder_outputs_shape)

    def call(self, inputs, encoder_outputs, encoder_padding_mask=None, training=None,
             padding_mask=None):
        x, padding_mask, encoder_padding_mask = self._embed(
            inputs, padding_mask, encoder_outputs, encoder_padding_mask, training)  # (B, T, d)
        for block in self.blocks:
            x = block(x, encoder_outputs, decoder_padding_mask=padding_mask,
                      encoder_padding_mask=encoder_padding_mask, training=training)
        logits = self._logits(x)  # (B, T, V)
        ids = ops.arange(self.vocabulary_size, dtype="int32")  # (V,)
        never = ops.logical_or(ops.equal(ids, BOS_ID), ops.equal(ids, EOS_ID))
        if self.pad_id is not None:
            never = ops.logical_or(never, ops.equal(ids, self.pad_id))
        return ops.where(never, _NEVER, logits)  # (B, T, V)

    def compute_output_shape(self, inputs_shape, encoder_outputs_shape=None, *args):
        return tuple(inputs_shape) + (self.vocabulary_size,)

    def compute_output_spec(self, inputs, encoder_outputs, encoder_padding_mask=None,
                            training=None, padding_mask=None):
        return keras.KerasTensor(tuple(inputs.shape) + (self.vocabulary_size,), dtype="float32")


@keras.saving.register_keras_serializable(package="keras_attn")
class LengthPredictor(QuantizedSublayers, keras.layers.Layer):
    """Target-length classifier: the mean of the encoder states over the real source tokens,
    then a linear layer over the lengths `0..max_target_length`.

    `logits = Dense(mean_{s: source_s != pad} h_s)`; a source with no tokens pools to zeros.

    Args:
        max_target_length: int, the longest target length; the logits have
            `max_target_length + 1` classes (keras_attn 0.2 called it `max_length`).
        kernel_initializer: initializer of the kernel. Defaults to `"glorot_uniform"`.

    Call arguments:
        encoder_outputs: `(B, S, d)`.
        padding_mask: optional boolean `(B, S)`, True at real source tokens. Defaults to the
            implicit mask of `encoder_outputs`, else every position counts.

    Returns:
        float32 logits `(B, max_target_length + 1)`: class `n` is the target length `n`.

    Example:
    >>> LengthPredictor(10)(keras.ops.ones((2, 5, 16))).shape
    (2, 11)
    """

    def __init__(self, max_target_length: int | None = None,
                 kernel_initializer="glorot_uniform", **kwargs):
        max_target_length = legacy.rename(
            kwargs, "LengthPredictor", {"max_length": "max_target_length"},
            warn=not kwargs.pop("_loading", False), said=legacy.said(
                LengthPredictor.__init__, max_target_length=max_target_length),
        ).get("max_target_length", max_target_length)
        super().__init__(**kwargs)
        check_positive_int("max_target_length", max_target_length)
        self.max_target_length = max_target_length
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True

    def build(self, encoder_outputs_shape, padding_mask_shape=None):
        self.dense = keras.layers.Dense(
            self.max_target_length + 1, name="dense", dtype=self.dtype_policy,
            kernel_initializer=sublayer_initializer(self.kernel_initializer, "dense"))
        self.dense.build((encoder_outputs_shape[0], encoder_outputs_shape[-1]))

    def call(self, encoder_outputs, padding_mask=None):
        if padding_mask is None:
            padding_mask = getattr(encoder_outputs, "_keras_mask", None)
        x = ops.cast(encoder_outputs, "float32")
        if padding_mask is None:
            pooled = ops.mean(x, axis=1)  # (B, d)
        else:
            weights = ops.cast(padding_mask, "float32")[..., None]  # (B, S, 1)
            pooled = ops.divide_no_nan(ops.sum(x * weights, axis=1),
                                       ops.sum(weights, axis=1))  # (B, d)
        pooled = ops.cast(pooled, self.compute_dtype)
        return ops.cast(self.dense(pooled), "float32")  # (B, max_target_length + 1)

    def compute_mask(self, encoder_outputs, padding_mask=None):
        return None

    def compute_output_shape(self, encoder_outputs_shape, padding_mask_shape=None):
        return (encoder_outputs_shape[0], self.max_target_length + 1)

    def compute_output_spec(self, encoder_outputs, padding_mask=None):
        return keras.KerasTensor(self.compute_output_shape(encoder_outputs.shape),
                                 dtype="float32")

    def get_config(self):
        config = super().get_config()
        config["max_target_length"] = self.max_target_length
        config["kernel_initializer"] = keras.initializers.serialize(self.kernel_initializer)
        config["dtype"] = self.dtype_config()
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config, _loading=True)  # keras_attn 0.2's names load without a warning
