"""The one model assembly every keras_attn Transformer stack is: token embedding with positions
(`TokenEmbedding`) -> blocks -> final norm (pre-LN) -> output head (`OutputHead`).

`TransformerEncoder`, `TransformerDecoder`, `TransformerDecoderOnly` and `CMLMDecoder` differ
only in their block, their embedding's defaults and whether they end in logits; the attention
kernel (`implementation`, `chunk_size`, `sliding_window`) reaches every block, and padding is
`pad_id` (None: no id is padding) or an explicit mask.
"""

from __future__ import annotations

import math
import typing

import keras
from keras import ops

from keras_attn._checks import check_int
from keras_attn.layers import legacy
from keras_attn.layers.activations import gated_name
from keras_attn.layers.add_norm import make_norm
from keras_attn.layers.block_base import head_dim
from keras_attn.layers.config import AttentionConfig, BlockConfig
from keras_attn.layers.embedding import OutputHead, TokenEmbedding
from keras_attn.layers.initializers import sublayer_initializer
from keras_attn.layers.quantization import QuantizedSublayers
from keras_attn.tokens import PAD_ID

STACK_ARGS_DOC = """        vocabulary_size: int, number of tokens.
        num_layers: int, number of blocks.
        hidden_dim: int, model size `d`.
        block: a `keras_attn.layers.BlockConfig` (or its config): every block's attention
            (`AttentionConfig`: heads, positions, kernel, window ...), FFN, norms and dropout
            (which the embedding takes too). With `normalize_first=True` a final norm closes
            the stack.
        pad_id: optional int, the padding id, hidden from every attention; `None`: no id is
            padding (pass `padding_mask` to the call instead). Defaults to `0`.
        kernel_initializer: initializer of the dense kernels; every sublayer draws its own
            (`keras_attn.layers.initializers`). Defaults to `"glorot_uniform"`.
        seed: optional int seed for the dropouts. Defaults to `None`."""

LEGACY_DOC = """        The arguments of keras_attn 0.2 (`vocab_size`, `embed_dim`, `num_heads`,
        `ffn_dim`,
        `dropout`, `norm_first`, `activation`, `epsilon`, `implementation`, ...) still make the
        `block`, with a DeprecationWarning (`keras_attn.layers.legacy`)."""


def document_stack(extra: str = ""):
    """A class decorator: the stack's docstring gets the shared `Args:` (its `{args}`)."""

    def decorate(cls):
        cls.__doc__ = cls.__doc__.format(args=STACK_ARGS_DOC + extra + "\n\n" + LEGACY_DOC)
        return cls

    return decorate


def embeddings_initializer(kernel_initializer):
    """Keras' `Embedding` default (uniform in ±0.05), seeded when `kernel_initializer` is,
    so that a seeded model is reproducible whole."""
    seed = kernel_initializer.get_config().get("seed") if isinstance(
        kernel_initializer, keras.initializers.Initializer) else None
    return keras.initializers.RandomUniform(-0.05, 0.05, seed=seed)


# The block arguments of keras_attn 0.2's stacks that kept their names.
_LEGACY_BLOCK_ARGS = ("dropout", "activation", "norm")


def legacy_block(kwargs: dict, owner: str, defaults: dict, warn: bool = True,
                 said: dict | None = None, block: BlockConfig | None = None):
    """The `BlockConfig` that keras_attn 0.2's flat stack arguments in `kwargs` describe
    (popped), or None when there are none; `defaults` are the stack's earlier defaults, `said`
    its parameters given (`legacy.said`), `block` the one given (then flat arguments are a
    ValueError).

    Returns:
        `(block, renamed)`: the block (or None) and the stack's own renamed arguments
        (`vocabulary_size`, `hidden_dim`, `tie_word_embeddings`).
    """
    renamed, fields = legacy.take(kwargs, owner, warn, said=said)
    flat = {name: kwargs.pop(name) for name in _LEGACY_BLOCK_ARGS if name in kwargs}
    for name in ("intermediate_dim", "normalize_first", "layer_norm_epsilon", "use_bias"):
        if name in renamed:
            flat[name] = renamed.pop(name)
    gated = renamed.pop("gated_ffn", False)
    if not fields and not flat and not gated:
        return None, renamed
    if block is not None:
        raise ValueError(f"{owner}: give the blocks' options in `block` only, not also as "
                         "arguments of keras_attn 0.2.")
    given = dict(defaults)
    attention = dict(given.pop("attention", {}), **fields)
    given.update(flat)
    if gated:
        given["activation"] = gated_name(given.get("activation", "relu"))
    if "intermediate_dim" not in given:
        raise ValueError(f"{owner}: argument `intermediate_dim` (earlier `ffn_dim`) is "
                         "required with the flat block arguments, or give `block`.")
    return BlockConfig(attention=AttentionConfig(**attention), **given), renamed


def builder_block(owner: str, kwargs: dict, attention, attention_defaults: dict,
                  given: dict | None = None, **block) -> BlockConfig:
    """The `BlockConfig` of a model builder's keywords, made once.

    Args:
        owner: the builder's name, for messages.
        kwargs: the builder's `**kwargs`: the attention fields in it (`num_key_value_heads`,
            `implementation`, `sliding_window`, ...) and the block fields (`activation`,
            `norm`, `use_bias`, ...) are popped, and keras_attn 0.2's names translated (with a
            DeprecationWarning); what stays is the stacks' own (`kernel_initializer`, `seed`,
            `pad_id`, and renamed `hidden_dim`, ... for the caller to pop).
        attention: the builder's `attention` (an `AttentionConfig`, its dict, or None).
        attention_defaults: the builder's own attention keywords (`num_heads`,
            `position_encoding`) with their values; a value left at the builder's default
            gives way to what `attention` says.
        given: the builder's parameters the call gave (`legacy.said`): their earlier names
            beside them are a ValueError.
        **block: the block fields the builder takes (with their values).
    """
    renamed, fields = legacy.take(kwargs, owner, fields_ok=True, said=given)
    for name in ("intermediate_dim", "normalize_first", "layer_norm_epsilon", "use_bias"):
        if name in renamed:
            block[name] = renamed.pop(name)
    for name in _LEGACY_BLOCK_ARGS + ("normalize_first", "layer_norm_epsilon", "use_bias"):
        if name in kwargs:
            block[name] = kwargs.pop(name)
    if renamed.pop("gated_ffn", False):
        block["activation"] = gated_name(block.get("activation", "relu"))
    kwargs.update(renamed)  # the stacks' own renamed arguments (hidden_dim, ...)
    said = None if attention is None else AttentionConfig.coerce(attention)
    for name, (value, default) in attention_defaults.items():
        if name in fields:
            continue
        if value == default and said is not None and getattr(said, name) is not None:
            continue  # the builder's default gives way to the configuration
        fields[name] = value
    return BlockConfig(attention=AttentionConfig.merge(attention, **fields), **block)


class _Stack(QuantizedSublayers, keras.layers.Layer):
    """Embedding -> blocks -> final norm -> head; the arguments every stack shares.

    Subclasses set `block_class` (and `blocks_first`, `legacy_defaults`), and may override
    `_embedding`, `_head` and `_block_arguments`.
    """

    block_class: type = None
    # The order of `weights` (and of `get_weights()` lists) of keras_attn 0.1's stacks.
    blocks_first: bool = False
    # keras_attn 0.2's defaults of the flat block arguments (`legacy_block`).
    legacy_defaults: typing.ClassVar[dict] = {}

    def __init__(self, vocabulary_size: int | None = None, num_layers: int | None = None,
                 hidden_dim: int | None = None, block: BlockConfig | None = None,
                 pad_id: int | None = PAD_ID, kernel_initializer="glorot_uniform",
                 seed: int | None = None, **kwargs):
        defaults = kwargs.pop("_legacy_defaults", self.legacy_defaults)
        said = dict(kwargs.pop("_said", {}), **legacy.said(
            _Stack.__init__, vocabulary_size=vocabulary_size, hidden_dim=hidden_dim))
        legacy_given, renamed = legacy_block(kwargs, type(self).__name__, defaults,
                                             warn=not kwargs.pop("_loading", False),
                                             said=said, block=block)
        super().__init__(**kwargs)
        vocabulary_size = renamed.pop("vocabulary_size", vocabulary_size)
        hidden_dim = renamed.pop("hidden_dim", hidden_dim)
        self._legacy = renamed  # a subclass's renamed arguments (`tie_word_embeddings`, ...)
        if legacy_given is not None:
            if block is not None:
                raise ValueError(
                    f"{type(self).__name__}: give the blocks' options in `block` only, not "
                    "also as arguments of keras_attn 0.2.")
            block = legacy_given
        if block is None or isinstance(block, int):
            raise ValueError(
                "Argument `block` is required: a BlockConfig (attention, FFN, norms, dropout), "
                "the fourth argument (keras_attn 0.2's fourth was `num_heads`: give "
                "`block=BlockConfig(AttentionConfig(num_heads), intermediate_dim, ...)`, or "
                f"keywords). Received: block={block!r}")
        for name, value in (("vocabulary_size", vocabulary_size), ("num_layers", num_layers),
                            ("hidden_dim", hidden_dim)):
            check_int(name, value, 1)
        check_int("pad_id", pad_id, 0, allow_none=True)
        check_int("seed", seed, 0, allow_none=True)
        self.block = BlockConfig.coerce(block)
        head_dim(hidden_dim, self.block.attention)  # heads divide the width, or a head_dim
        self.vocabulary_size, self.num_layers = int(vocabulary_size), int(num_layers)
        self.hidden_dim = int(hidden_dim)
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.seed, self.pad_id = seed, pad_id
        self.supports_masking = True

    # The block configuration's fields the stack reads, as attributes.
    num_heads = property(lambda self: self.block.attention.num_heads)
    dropout = property(lambda self: self.block.dropout)
    normalize_first = property(lambda self: self.block.normalize_first)

    # ---- the parts ---------------------------------------------------------------------------

    def _assemble(self, embedding=None, head=None) -> None:
        """Create the parts (call at the end of the subclass' `__init__`)."""
        blocks = [self.block_class(config=self.block, **self._block_arguments(f"block_{i}"))
                  for i in range(self.num_layers)]
        if self.blocks_first:
            self.blocks = blocks
        self.embedding = embedding or self._embedding()
        self.final_norm = None
        if self.normalize_first:  # pre-norm leaves the residual stream unnormalized
            self.final_norm = make_norm(self.block.norm, self.block.layer_norm_epsilon,
                                        "final_norm", self.dtype_policy)
        if not self.blocks_first:
            self.blocks = blocks
        self.head = head if head is not None else self._head()
        if self.head is not None and self.head.tie_word_embeddings:
            self.head.tie(self.embedding.token_embedding)

    def _embedding(self) -> TokenEmbedding:
        """Vaswani et al.'s: token vectors · √d + the sinusoid table, then dropout."""
        return TokenEmbedding(
            self.vocabulary_size, self.hidden_dim, position="sinusoidal",
            scale=math.sqrt(self.hidden_dim), dropout=self.dropout, seed=self.seed,
            embeddings_initializer=sublayer_initializer(
                embeddings_initializer(self.kernel_initializer), "embedding"),
            name="embedding", dtype=self.dtype_policy)

    def _head(self) -> OutputHead | None:
        return OutputHead(self.vocabulary_size, kernel_initializer=sublayer_initializer(
            self.kernel_initializer, "head"), name="head", dtype=self.dtype_policy)

    def _block_arguments(self, name: str) -> dict:
        """A block's own arguments besides the configuration."""
        return {"kernel_initializer": sublayer_initializer(self.kernel_initializer, name),
                "seed": self.seed, "name": name, "dtype": self.dtype_policy}

    def _build_parts(self, ids_shape, *block_shapes) -> tuple:
        """Build embedding, blocks, final norm and head; returns the embedded shape."""
        if len(ids_shape) != 2:
            raise ValueError(
                "Argument `inputs` must be integer token ids of shape (batch_size, seq_len). "
                f"Received: inputs.shape={tuple(ids_shape)}")
        embedded = tuple(ids_shape) + (self.hidden_dim,)
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
            "vocabulary_size": self.vocabulary_size, "num_layers": self.num_layers,
            "hidden_dim": self.hidden_dim, "block": self.block.get_config(),
            "pad_id": self.pad_id,
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "seed": self.seed, "dtype": self.dtype_config(),
        })
        return config

    @classmethod
    def from_config(cls, config):
        # A config of keras_attn 0.2 (flat block arguments) loads without a warning.
        return cls(**config, _loading=True)
