"""The Transformer of "Attention Is All You Need": encoder and decoder stacks, cached decoding
one token at a time, and the sequence-to-sequence model builder."""

from __future__ import annotations

import keras
from keras import ops

from keras_attn._checks import renamed_argument
from keras_attn.layers import legacy
from keras_attn.layers.base import check_positive_int
from keras_attn.layers.block_base import call_layer
from keras_attn.layers.config import AttentionConfig, BlockConfig
from keras_attn.layers.embedding import OutputHead, TokenEmbedding
from keras_attn.layers.initializers import sublayer_initializer
from keras_attn.layers.transformer_blocks import (
    TransformerDecoderBlock,
    TransformerEncoderBlock,
)
from keras_attn.models.assembly import _Stack, builder_block, document_stack


@keras.saving.register_keras_serializable(package="keras_attn")
@document_stack()
class TransformerEncoder(_Stack):
    """Transformer encoder: token embedding · √d + sinusoidal positions + dropout, N blocks.

    Padding (`pad_id`, or the call's `padding_mask`) is hidden from every self-attention, and
    the output carries it as the Keras implicit mask. With `block.normalize_first` a final
    norm closes the stack. Other inputs and outputs by composition: `embedding` replaces the
    embedding (BERT: learned positions, segments and a LayerNorm, see `TokenEmbedding`) and
    `head` adds an output head (BERT's masked-LM head, see `OutputHead`).

    Args:
{args}
        embedding: optional `TokenEmbedding` of `hidden_dim` to use instead. Defaults to `None`.
        head: optional `OutputHead`: the encoder then returns its logits. Defaults to `None`.

    Call arguments:
        inputs: integer token ids `(B, S)`.
        padding_mask: optional boolean `(B, S)`, True at real tokens. Defaults to
            `inputs != pad_id`.
        token_type_ids: optional integer `(B, S)`, for an embedding with segments.
        return_attention_scores: bool, also return every block's weights (formed only then).
            Defaults to `False`.
        training: bool, whether dropout is active.

    Returns:
        `(B, S, hidden_dim)` with the padding as implicit mask, or with a `head` float32
        logits `(B, S, vocabulary_size)`; with `return_attention_scores=True` also the weights
        `(B, num_layers, num_heads, S, S)`.

    Example:
    >>> block = BlockConfig(AttentionConfig(num_heads=4), intermediate_dim=64)
    >>> encoder = TransformerEncoder(100, num_layers=2, hidden_dim=32, block=block)
    >>> encoder(keras.ops.array([[5, 6, 7, 0]])).shape  # (1, 4, 32)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", https://arxiv.org/abs/1706.03762
        Devlin et al., 2019, "BERT", https://arxiv.org/abs/1810.04805
    """

    block_class = TransformerEncoderBlock

    def __init__(self, vocabulary_size: int | None = None, num_layers: int | None = None,
                 hidden_dim: int | None = None, block: BlockConfig | None = None,
                 embedding: TokenEmbedding | None = None, head: OutputHead | None = None,
                 **kwargs):
        embedding, head = (_part(part) for part in (embedding, head))
        super().__init__(vocabulary_size, num_layers, hidden_dim, block, **kwargs)
        self._given = {"embedding": embedding is not None, "head": head is not None}
        self._assemble(embedding, head)

    def _head(self):
        return None

    def build(self, inputs_shape, padding_mask_shape=None, token_type_ids_shape=None):
        self._build_parts(inputs_shape)

    def call(self, inputs, padding_mask=None, token_type_ids=None,
             return_attention_scores=False, training=None):
        x, padding_mask, _ = self._embed(inputs, padding_mask, training=training,
                                         token_type_ids=token_type_ids)  # (B, S, d), (B, S)
        weights = []
        for block in self.blocks:
            x = block(x, padding_mask=padding_mask,
                      return_attention_scores=return_attention_scores, training=training)
            if return_attention_scores:
                x, w = x
                weights.append(w)  # (B, H, S, S)
        x = self._finish(x) if self.head is None else self._logits(x)
        if return_attention_scores:
            return x, ops.cast(ops.stack(weights, axis=1), "float32")  # (B, L, H, S, S)
        return x

    def compute_mask(self, inputs, mask=None):
        # The padding of `pad_id` (an explicit `padding_mask` is the caller's to pass on).
        return None if self.head is not None else self.padding_mask(inputs)

    def compute_output_spec(self, inputs, padding_mask=None, token_type_ids=None,
                            return_attention_scores=False, training=None):
        if self.head is None:
            outputs = keras.KerasTensor(tuple(inputs.shape) + (self.hidden_dim,),
                                        dtype=self.compute_dtype)
        else:
            outputs = keras.KerasTensor(tuple(inputs.shape) + (self.vocabulary_size,), "float32")
        if not return_attention_scores:
            return outputs
        weights = (inputs.shape[0], self.num_layers, self.num_heads) + (inputs.shape[1],) * 2
        return outputs, keras.KerasTensor(weights, dtype="float32")

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        last = self.hidden_dim if self.head is None else self.vocabulary_size
        return tuple(inputs_shape) + (last,)

    def get_config(self):
        config = super().get_config()
        for part, given in self._given.items():
            if given:
                config[part] = keras.layers.serialize(getattr(self, part))
                config[part].pop("build_config", None)  # built by the encoder
        return config


def _part(part):
    """A part given to a stack as a layer or as its config (built later by the stack)."""
    if not isinstance(part, dict):
        return part
    part = {key: value for key, value in part.items() if key != "build_config"}
    return keras.layers.deserialize(part)


@keras.saving.register_keras_serializable(package="keras_attn")
@document_stack()
class TransformerDecoder(_Stack):
    """Transformer decoder: embedding · √d + positions + dropout, N blocks, vocabulary logits.

    Target padding (`pad_id`) is hidden by the causal self-attention's key mask and padded
    queries get a zero context; source padding is hidden from the cross-attention. The logits
    are float32 under mixed precision. It keeps the decoding contract of
    `keras_attn.decoding.contract.Decoder` (a static-shape state: self-attention caches
    preallocated to `max_length`, the projected encoder keys and values, the source mask).

    Args:
{args}

    Call arguments:
        inputs: integer target ids `(B, T)`, starting with `<bos>`.
        encoder_outputs: `(B, S, encoder_dim)`.
        encoder_padding_mask: optional boolean `(B, S)`, True at real source tokens. Defaults
            to the implicit mask of `encoder_outputs` (which `TransformerEncoder` sets).
        return_attention_scores: bool, also return the cross-attention weights of every layer
            (computed only then). Defaults to `False`.
        training: bool, whether dropout is active.
        padding_mask: optional boolean `(B, T)`, True at real target tokens. Defaults to
            `inputs != pad_id` (nothing when `pad_id` is None).

    Returns:
        float32 logits `(B, T, vocabulary_size)`; with `return_attention_scores=True` also the
        weights `(B, num_layers, num_heads, T, S)`.

    Example:
    >>> block = BlockConfig(AttentionConfig(num_heads=4), intermediate_dim=64)
    >>> decoder = TransformerDecoder(100, num_layers=2, hidden_dim=32, block=block)
    >>> logits = decoder(keras.ops.array([[2, 9, 4]]), keras.ops.ones((1, 5, 32)))  # (1, 3, 100)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", https://arxiv.org/abs/1706.03762
    """

    block_class = TransformerDecoderBlock

    def __init__(self, vocabulary_size: int | None = None, num_layers: int | None = None,
                 hidden_dim: int | None = None, block: BlockConfig | None = None, **kwargs):
        super().__init__(vocabulary_size, num_layers, hidden_dim, block, **kwargs)
        self._assemble()

    def build(self, inputs_shape, encoder_outputs_shape=None, *args):
        encoder_outputs_shape = encoder_outputs_shape or tuple(inputs_shape) + (self.hidden_dim,)
        self._build_parts(inputs_shape, encoder_outputs_shape)

    def _run_blocks(self, x, return_attention, encoder_outputs=None, encoder_padding_mask=None,
                    decoder_padding_mask=None, state=None, index=None, training=None):
        """The blocks over `x` (with the decoding `state`'s caches at `index`, when given):
        `x`, the new self-attention caches and the cross-attention weights (lists)."""
        caches, weights = [], []
        for i, block in enumerate(self.blocks):
            cached = {} if state is None else {
                "self_attention_cache": state["self_attention_cache"][i],
                "self_attention_cache_update_index": index,
                "cross_attention_cache": state["cross_attention_cache"][i]}
            results = call_layer(block, x, encoder_outputs,
                                 decoder_padding_mask=decoder_padding_mask,
                                 encoder_padding_mask=encoder_padding_mask,
                                 return_attention_scores=return_attention, training=training,
                                 **cached)
            results = results if isinstance(results, tuple) else (results,)
            x = results[0]
            if state is not None:
                caches.append(results[1])
            if return_attention:
                weights.append(results[-1])  # (B, H, T, S)
        return x, caches, weights

    def call(self, inputs, encoder_outputs, encoder_padding_mask=None,
             return_attention_scores=False, training=None, padding_mask=None):
        x, padding_mask, encoder_padding_mask = self._embed(
            inputs, padding_mask, encoder_outputs, encoder_padding_mask, training)  # (B, T, d)
        x, _, weights = self._run_blocks(
            x, return_attention_scores, encoder_outputs, encoder_padding_mask,
            decoder_padding_mask=padding_mask, training=training)
        logits = self._logits(x)  # (B, T, V)
        if return_attention_scores:
            return logits, ops.cast(ops.stack(weights, axis=1), "float32")  # (B, L, H, T, S)
        return logits

    # ---- the decoding contract (keras_attn.decoding.contract.Decoder) ----------------------

    def init_decode_state(self, encoder_outputs, source_ids, max_length: int) -> dict:
        """The decoding state: `"self_attention_cache"`, one all-zero `(k, v)` per layer, each
        `(B, num_heads, max_length, head_dim)`; `"cross_attention_cache"`, one `(k, v)` per
        layer, each `(B, num_heads, S, head_dim)`; `"encoder_padding_mask"`, `(B, S)`."""
        check_positive_int("max_length", max_length)
        batch_size = ops.shape(source_ids)[0]
        padding_mask = (ops.ones_like(source_ids, "bool") if self.pad_id is None
                        else ops.not_equal(source_ids, self.pad_id))  # (B, S)
        return {
            "self_attention_cache": tuple(
                block.init_self_attention_cache(batch_size, max_length) for block in self.blocks
            ),
            "cross_attention_cache": tuple(
                block.compute_cross_attention_cache(encoder_outputs, padding_mask)
                for block in self.blocks
            ),
            "encoder_padding_mask": padding_mask,
        }

    def decode_step(self, token_ids, index, state: dict, return_attention_scores: bool = False,
                    **kwargs):
        """One target token `(B,)` at position `index` through the stack and the caches: float32
        logits `(B, V)` for position `index + 1`, the state, and with `return_attention_scores`
        the cross-attention weights `(B, num_layers, num_heads, S)` (else None; defaults to
        `False`: only callers that draw them ask; keras_attn 0.2's `return_attention` still
        works, deprecated)."""
        return_attention = renamed_argument("TransformerDecoder.decode_step", kwargs,
                                            "return_attention", "return_attention_scores",
                                            return_attention_scores, False)
        token_ids = ops.expand_dims(ops.cast(token_ids, "int32"), -1)  # (B, 1)
        x = self.embedding(token_ids, start_index=index)  # (B, 1, d)
        x, caches, weights = self._run_blocks(
            x, return_attention, encoder_padding_mask=state["encoder_padding_mask"],
            state=state, index=index)
        logits = self._logits(x)[:, 0, :]  # (B, V)
        state = dict(state, self_attention_cache=tuple(caches))
        if not return_attention:
            return logits, state, None
        attention = ops.stack([w[:, :, 0, :] for w in weights], axis=1)  # (B, L, H, S)
        return logits, state, ops.cast(attention, "float32")

    def compute_output_shape(self, inputs_shape, encoder_outputs_shape=None, *args):
        return tuple(inputs_shape) + (self.vocabulary_size,)

    def compute_output_spec(self, inputs, encoder_outputs, encoder_padding_mask=None,
                            return_attention_scores=False, training=None, padding_mask=None):
        logits = keras.KerasTensor(tuple(inputs.shape) + (self.vocabulary_size,), dtype="float32")
        if not return_attention_scores:
            return logits
        weights_shape = (inputs.shape[0], self.num_layers, self.num_heads, inputs.shape[1],
                         encoder_outputs.shape[1])
        return logits, keras.KerasTensor(weights_shape, dtype="float32")


@legacy.records_given
def transformer_seq2seq(
    source_vocabulary_size: int | None = None,
    target_vocabulary_size: int | None = None,
    num_layers: int = 2,
    hidden_dim: int = 128,
    num_heads: int = 4,
    intermediate_dim: int = 512,
    dropout: float = 0.1,
    normalize_first: bool = False,
    attention: AttentionConfig | None = None,
    name: str = "transformer_seq2seq",
    **kwargs,
) -> keras.Model:
    """A Transformer encoder-decoder as a functional `keras.Model`.

    `logits = decoder(target_in_ids, encoder(source_ids))`, teacher-forced: `target_in_ids` is
    the target shifted right (`<bos>` first), and the logits predict the next token at every
    position. Token id 0 is padding on both sides. The model contains the layers `"encoder"`
    (`TransformerEncoder`) and `"decoder"` (`TransformerDecoder`), so
    `keras_attn.decoding.generate` decodes with its static cache.

    Args:
        source_vocabulary_size: int, number of source tokens.
        target_vocabulary_size: int, number of target tokens (size of the logits).
        num_layers: int, blocks in the encoder and in the decoder. Defaults to `2`.
        hidden_dim: int, model size `d`. Defaults to `128`.
        num_heads: int, attention heads; must divide `hidden_dim`. Defaults to `4` (or
            `attention.num_heads`).
        intermediate_dim: int, hidden size of the feed-forward networks. Defaults to `512`.
        dropout: float in [0, 1), dropout everywhere the paper puts it. Defaults to `0.1`.
        normalize_first: bool, pre-LN blocks instead of post-LN. Defaults to `False`.
        attention: optional `AttentionConfig` of both stacks; its fields may also be given
            here as keywords: `implementation` (`"dense"`, `"chunked"`: needs `dropout=0`,
            `"local"`: with `sliding_window`), `chunk_size`, `sliding_window` (self-attention
            sees the keys at distance `< sliding_window`; causal in the decoder), ...
            Defaults to `None`.
        name: str, the model name. Defaults to `"transformer_seq2seq"`.
        **kwargs: the attention fields above; the blocks' `activation`, `norm`,
            `layer_norm_epsilon`, `use_bias`; the stacks' `kernel_initializer`, `seed`,
            `pad_id`.

    Returns:
        An uncompiled `keras.Model` with inputs `source_ids` `(B, S)` and `target_in_ids`
        `(B, T)` (int32) and output float32 logits `(B, T, target_vocabulary_size)`.

    Example:
    >>> model = transformer_seq2seq(100, 120, num_layers=1, hidden_dim=32, num_heads=4,
    ...                             intermediate_dim=64)
    >>> model.compile("adam", loss=keras_attn.metrics.masked_sparse_categorical_crossentropy)
    >>> logits = model([keras.ops.array([[5, 6, 0]]), keras.ops.array([[2, 7]])])  # (1, 2, 120)

    References:
        Vaswani et al., 2017, "Attention Is All You Need", https://arxiv.org/abs/1706.03762
    """
    encoder, decoder = seq2seq_stacks("transformer_seq2seq", TransformerDecoder, kwargs, {
        "source_vocabulary_size": source_vocabulary_size,
        "target_vocabulary_size": target_vocabulary_size, "num_layers": num_layers,
        "hidden_dim": hidden_dim, "num_heads": num_heads, "intermediate_dim": intermediate_dim,
        "dropout": dropout, "normalize_first": normalize_first, "attention": attention})
    source_ids = keras.Input(shape=(None,), dtype="int32", name="source_ids")
    target_in_ids = keras.Input(shape=(None,), dtype="int32", name="target_in_ids")
    encoder_outputs = encoder(source_ids)  # (B, S, d)
    source_mask = encoder.padding_mask(source_ids)  # (B, S)
    logits = decoder(target_in_ids, encoder_outputs, encoder_padding_mask=source_mask)
    return keras.Model([source_ids, target_in_ids], logits, name=name)


def seq2seq_stacks(owner: str, decoder_class, kwargs: dict, arguments: dict,
                   per_stack_initializer: bool = True) -> tuple:
    """`(TransformerEncoder, decoder_class)` named "encoder" and "decoder" of an
    encoder-decoder builder's `arguments` and `**kwargs` (`builder_block`): one `BlockConfig`
    for both, and (`per_stack_initializer`) a given initializer made one per stack (a seeded
    one derives a seed per stack: the stacks' sublayers have the same names, and would start
    as copies)."""
    # The arguments given (their earlier names beside them are refused); nat_seq2seq has
    # transformer_seq2seq's defaults.
    given = legacy.said(transformer_seq2seq, **{name: arguments[name] for name in (
        "source_vocabulary_size", "target_vocabulary_size", "hidden_dim", "intermediate_dim",
        "normalize_first")})
    block = builder_block(
        owner, kwargs, arguments["attention"],
        {"num_heads": (arguments["num_heads"], 4)}, given=given,
        intermediate_dim=arguments["intermediate_dim"], dropout=arguments["dropout"],
        normalize_first=arguments["normalize_first"])
    sizes = {name: kwargs.pop(name, arguments[name]) for name in (
        "source_vocabulary_size", "target_vocabulary_size", "hidden_dim")}
    init = kwargs.pop("kernel_initializer", None)
    stacks = []
    for part, cls, vocabulary in (("encoder", TransformerEncoder, "source_vocabulary_size"),
                                  ("decoder", decoder_class, "target_vocabulary_size")):
        own = {} if init is None else {"kernel_initializer": (
            sublayer_initializer(init, part) if per_stack_initializer else init)}
        stacks.append(cls(sizes[vocabulary], arguments["num_layers"], sizes["hidden_dim"],
                          block, name=part, **own, **kwargs))
    return tuple(stacks)
