"""The one model assembly every keras_attn Transformer stack is: token embedding with positions
(`TokenEmbedding`) -> blocks -> final norm (pre-LN) -> output head (`OutputHead`).

`TransformerEncoder`, `TransformerDecoder`, `TransformerDecoderOnly` and `CMLMDecoder` differ
only in their block, their embedding's defaults and whether they end in logits; the attention
kernel (`implementation`, `chunk_size`, `sliding_window`) reaches every block, and padding is
`pad_id` (None: no id is padding) or an explicit mask.
"""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_attn._checks import check_bool, check_int, check_number
from keras_attn.layers.add_norm import make_norm
from keras_attn.layers.base import check_positive_int, check_rate
from keras_attn.layers.block_base import (
    _get_activation,
    _head_dim,
    check_kernel_choice,
    deprecated_window,
    serialize_activation,
)
from keras_attn.layers.embedding import OutputHead, TokenEmbedding
from keras_attn.layers.initializers import sublayer_initializer
from keras_attn.layers.quantization import QuantizedSublayers
from keras_attn.tokens import PAD_ID

STACK_ARGS_DOC = """        vocab_size: int, number of tokens.
        num_layers: int, number of blocks.
        embed_dim: int, model size `d`.
        num_heads: int, attention heads per block; must divide `embed_dim`.
        ffn_dim: int, hidden size of each block's FFN.
        dropout: float in [0, 1), dropout after the embedding and in every block.
            Defaults to `0.0`.
        norm_first: bool, pre-LN blocks and a final norm. Defaults to `{norm_first}`.
        activation: FFN activation (`"gelu_tanh"`, `"swiglu"`, `"geglu"` or a Keras one).
            Defaults to `"{activation}"`.
        epsilon: float, the norms' epsilon. Defaults to `1e-5`.
        kernel_initializer: initializer of the dense kernels; every sublayer draws its own
            (`keras_attn.layers.initializers`). Defaults to `"glorot_uniform"`.
        seed: optional int seed for the dropouts. Defaults to `None`.
        implementation: the attention kernel of every block: `"dense"`, `"chunked"` (exact,
            memory linear in the keys, no attention dropout) or `"local"` (with
            `sliding_window`). Defaults to `"dense"`.
        chunk_size: optional int, keys per block of the chunked kernel. Defaults to `None`.
        sliding_window: optional int `w`, self-attention sees the keys at distance `< w`
            (Keras' meaning; `attention_window=d`, deprecated, is `w = d + 1`). Defaults to
            `None`.
        pad_id: optional int, the padding id, hidden from every attention; `None`: no id is
            padding (pass `padding_mask` to the call instead). Defaults to `0`."""


def document_stack(norm_first: bool = False, activation: str = "relu"):
    """A class decorator: the stack's docstring gets the shared `Args:` (its `{args}`)."""

    def decorate(cls):
        cls.__doc__ = cls.__doc__.format(args=STACK_ARGS_DOC.format(
            norm_first=norm_first, activation=activation))
        return cls

    return decorate


def embeddings_initializer(kernel_initializer):
    """Keras' `Embedding` default (uniform in ±0.05), seeded when `kernel_initializer` is,
    so that a seeded model is reproducible whole."""
    seed = kernel_initializer.get_config().get("seed") if isinstance(
        kernel_initializer, keras.initializers.Initializer) else None
    return keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)


class _Stack(QuantizedSublayers, keras.layers.Layer):
    """Embedding -> blocks -> final norm -> head; the arguments every stack shares.

    Subclasses set `block_class` (and `blocks_first`), and may override `_embedding`, `_head`,
    `_block_kwargs` and `_norm_kind`.
    """

    block_class: type = None
    # The order of `weights` (and of `get_weights()` lists) of keras_attn 0.1's stacks.
    blocks_first: bool = False

    def __init__(self, vocab_size: int, num_layers: int, embed_dim: int, num_heads: int,
                 ffn_dim: int, dropout: float = 0.0, norm_first: bool = False,
                 activation="relu", epsilon: float = 1e-5, kernel_initializer="glorot_uniform",
                 seed: int | None = None, implementation: str = "dense",
                 chunk_size: int | None = None, sliding_window: int | None = None,
                 pad_id: int | None = PAD_ID, **kwargs):
        sliding_window = deprecated_window(kwargs.pop("attention_window", None), sliding_window)
        super().__init__(**kwargs)
        for name, value in (("vocab_size", vocab_size), ("num_layers", num_layers),
                            ("embed_dim", embed_dim), ("num_heads", num_heads),
                            ("ffn_dim", ffn_dim)):
            check_positive_int(name, value)
        check_rate("dropout", dropout)
        check_bool("norm_first", norm_first)
        check_number("epsilon", epsilon, 0, strict=True)
        check_kernel_choice(implementation, chunk_size, sliding_window, dropout)
        check_int("pad_id", pad_id, 0, allow_none=True)
        self.vocab_size, self.num_layers, self.embed_dim = vocab_size, num_layers, embed_dim
        self.num_heads, self.ffn_dim, self.dropout = num_heads, ffn_dim, dropout
        self.norm_first, self.epsilon = norm_first, epsilon
        self.activation = _get_activation(activation)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.seed = seed
        self.implementation, self.chunk_size = implementation, chunk_size
        self.sliding_window, self.pad_id = sliding_window, pad_id
        self.supports_masking = True

    # ---- the parts ---------------------------------------------------------------------------

    def _assemble(self, embedding=None, head=None) -> None:
        """Create the parts (call at the end of the subclass' `__init__`)."""
        self._check_heads()
        blocks = [self.block_class(**self._block_kwargs(f"block_{i}"), name=f"block_{i}")
                  for i in range(self.num_layers)]
        if self.blocks_first:
            self.blocks = blocks
        self.embedding = embedding or self._embedding()
        self.final_norm = None
        if self.norm_first:  # pre-LN leaves the residual stream unnormalized
            self.final_norm = make_norm(self._norm_kind(), self.epsilon, "final_norm",
                                        self.dtype_policy)
        if not self.blocks_first:
            self.blocks = blocks
        self.head = head if head is not None else self._head()
        if self.head is not None and self.head.tie_embeddings:
            self.head.tie(self.embedding.token_embedding)

    def _check_heads(self) -> None:
        _head_dim(self.embed_dim, self.num_heads)

    def _norm_kind(self) -> str:
        return "layer"

    def _embedding(self) -> TokenEmbedding:
        """Vaswani et al.'s: token vectors · √d + the sinusoid table, then dropout."""
        return TokenEmbedding(
            self.vocab_size, self.embed_dim, position="sinusoidal",
            scale=math.sqrt(self.embed_dim), dropout=self.dropout, seed=self.seed,
            embeddings_initializer=sublayer_initializer(
                embeddings_initializer(self.kernel_initializer), "embedding"),
            name="embedding", dtype=self.dtype_policy)

    def _head(self) -> OutputHead | None:
        return OutputHead(self.vocab_size, kernel_initializer=sublayer_initializer(
            self.kernel_initializer, "head"), name="head", dtype=self.dtype_policy)

    def _block_kwargs(self, name: str) -> dict:
        return {
            "num_heads": self.num_heads, "ffn_dim": self.ffn_dim, "dropout": self.dropout,
            "norm_first": self.norm_first, "activation": self.activation,
            "epsilon": self.epsilon,
            "kernel_initializer": sublayer_initializer(self.kernel_initializer, name),
            "seed": self.seed, "implementation": self.implementation,
            "chunk_size": self.chunk_size, "sliding_window": self.sliding_window,
            "dtype": self.dtype_policy,
        }

    def _build_parts(self, ids_shape, *block_shapes) -> tuple:
        """Build embedding, blocks, final norm and head; returns the embedded shape."""
        if len(ids_shape) != 2:
            raise ValueError(
                "Argument `inputs` must be integer token ids of shape (batch_size, seq_len). "
                f"Received: inputs.shape={tuple(ids_shape)}")
        embedded = tuple(ids_shape) + (self.embed_dim,)
        self.embedding.build(ids_shape)
        for block in self.blocks:
            block.build(embedded, *block_shapes)
        if self.final_norm is not None:
            self.final_norm.build(embedded)
        if self.head is not None:
            self.head.build(embedded)
        return embedded

    # ---- the pieces of a forward pass ------------------------------------------------------

    def padding_mask(self, token_ids, padding_mask=None):
        """Boolean `(B, T)`, True at real tokens: `padding_mask` when given, else
        `token_ids != pad_id`, or None when `pad_id` is None."""
        if padding_mask is not None:
            return ops.cast(padding_mask, "bool")
        if self.pad_id is None:
            return None
        return ops.not_equal(token_ids, self.pad_id)

    def _embed(self, inputs, padding_mask=None, encoder_outputs=None, encoder_padding_mask=None,
               training=None, **embedding_kwargs):
        """The opening of every stack's call: `(x, padding_mask, encoder_padding_mask)`, the
        embedded ids `(B, T, d)`, their padding mask `(B, T)` (`padding_mask`) and the source
        padding (`encoder_padding_mask`, default the implicit mask of `encoder_outputs`)."""
        if encoder_padding_mask is None and encoder_outputs is not None:
            encoder_padding_mask = getattr(encoder_outputs, "_keras_mask", None)
        x = self.embedding(inputs, training=training, **embedding_kwargs)  # (B, T, d)
        return x, self.padding_mask(inputs, padding_mask), encoder_padding_mask

    def _finish(self, x):
        return x if self.final_norm is None else self.final_norm(x)

    def _logits(self, x):
        """float32 logits of the last hidden states (final norm, then the head)."""
        return self.head(self._finish(x))

    # ---- keras_attn 0.1 weight paths (the sublayers sat on the stack itself) -----------------

    @property
    def token_embedding(self):
        """The token table (`keras.layers.ReversibleEmbedding`)."""
        return self.embedding.token_embedding

    @property
    def output_dense(self):
        """The untied vocabulary projection (`keras.layers.Dense`), else None."""
        return None if self.head is None else getattr(self.head, "output_dense", None)

    def get_config(self):
        config = super().get_config()
        config.update({
            "vocab_size": self.vocab_size, "num_layers": self.num_layers,
            "embed_dim": self.embed_dim, "num_heads": self.num_heads, "ffn_dim": self.ffn_dim,
            "dropout": self.dropout, "norm_first": self.norm_first,
            "activation": serialize_activation(self.activation), "epsilon": self.epsilon,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "seed": self.seed, "implementation": self.implementation,
            "chunk_size": self.chunk_size, "sliding_window": self.sliding_window,
            "pad_id": self.pad_id, "dtype": self.dtype_config(),
        })
        return config
