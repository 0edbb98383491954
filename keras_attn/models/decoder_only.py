"""The decoder-only Transformer stack of GPT-2, LLaMA, Mistral and Qwen2: token embeddings,
positions, causal blocks, vocabulary logits, and cached decoding one token at a time."""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_attn._checks import check_bool, check_int, check_one_of, renamed_argument
from keras_attn.layers import legacy
from keras_attn.layers.block_base import call_layer
from keras_attn.layers.config import AttentionConfig, BlockConfig  # noqa: F401 - examples
from keras_attn.layers.decoder_only import TransformerDecoderOnlyBlock
from keras_attn.layers.embedding import OutputHead, TokenEmbedding
from keras_attn.layers.initializers import sublayer_initializer
from keras_attn.models.assembly import _Stack, document_stack, embeddings_initializer
from keras_attn.tuning import in_xla_context

# Positions added to the token embeddings (those inside the attention are the block's
# `attention.position_encoding`).
POSITION_EMBEDDINGS = (None, "sinusoidal", "learned")
# keras_attn 0.2's defaults of the flat block arguments (LLaMA-style).
_LEGACY_DEFAULTS = {"activation": "swiglu", "norm": "rms", "normalize_first": True,
                    "attention": {"position_encoding": "rope"}}

DECODER_ONLY_ARGS_DOC = """
        position_embedding: None, `"sinusoidal"` (embeddings · √d + the sinusoid table) or
            `"learned"` (a table of `max_sequence_length` rows, GPT-2): positions added to the
            token embeddings; positions inside the attention (`"rope"`, `"alibi"`,
            `"relative"`) are `block.attention.position_encoding`. Defaults to `None`.
        max_sequence_length: optional int, the rows of the `"learned"` table (required there)
            and the longest decoding cache. Defaults to `None`.
        tie_word_embeddings: bool, logits from the token table (no bias); else a dense head,
            with a bias when `block.use_bias`. Defaults to `False`."""


@keras.saving.register_keras_serializable(package="keras_attn")
@document_stack(DECODER_ONLY_ARGS_DOC)
class TransformerDecoderOnly(_Stack):
    """A decoder-only Transformer: token embeddings, positions, N blocks, vocabulary logits.

    Every block is causal self-attention and an FFN (`TransformerDecoderOnlyBlock`); the
    logits are float32 under mixed precision. GPT-2: `position_embedding="learned",
    tie_word_embeddings=True` with a `block` of `norm="layer", activation="gelu_tanh",
    normalize_first=True`; LLaMA: rotary positions in the attention
    (`AttentionConfig(position_encoding="rope", use_bias=False, num_key_value_heads=...)`),
    `norm="rms", activation="swiglu", normalize_first=True, use_bias=False`.

    It keeps the decoding contract of `keras_attn.decoding.contract.Decoder`:
    `init_decode_state(batch_size, max_length)` preallocates one key/value cache per block.

    Args:
{args}

    Call arguments:
        inputs: integer token ids `(B, T)`.
        padding_mask: optional boolean `(B, T)`, True at real tokens. Defaults to
            `inputs != pad_id` (nothing when `pad_id` is None).
        return_attention_scores: bool, also return every block's weights (formed only then,
            by the dense kernel). Defaults to `False`.
        training: bool, whether dropout is active.

    Returns:
        float32 logits `(B, T, vocab_size)` for the next token at every position; with
        `return_attention_scores=True` also the weights `(B, num_layers, num_heads, T, T)`.

    Example:
    >>> block = BlockConfig(AttentionConfig(num_heads=4, position_encoding="rope"),
    ...                     intermediate_dim=64, activation="swiglu", norm="rms",
    ...                     normalize_first=True)
    >>> lm = TransformerDecoderOnly(100, num_layers=2, hidden_dim=32, block=block)
    >>> lm(keras.ops.array([[2, 9, 4]])).shape  # (1, 3, 100)

    References:
        Radford et al., 2019, "Language Models are Unsupervised Multitask Learners"
        Touvron et al., 2023, "LLaMA", https://arxiv.org/abs/2302.13971
    """

    block_class = TransformerDecoderOnlyBlock
    blocks_first = True

    @legacy.records_given
    def __init__(self, vocabulary_size: int | None = None, num_layers: int | None = None,
                 hidden_dim: int | None = None, block: BlockConfig | None = None,
                 position_embedding: str | None = None, max_sequence_length: int | None = None,
                 tie_word_embeddings: bool = False, **kwargs):
        # keras_attn 0.2 named the embedding's positions `position_encoding` too, and the
        # table's length `max_length`.
        legacy_defaults, names = dict(_LEGACY_DEFAULTS), {"max_length": "max_sequence_length"}
        if kwargs.get("position_encoding") in POSITION_EMBEDDINGS[1:]:
            names["position_encoding"] = "position_embedding"
            legacy_defaults["attention"] = {}
        said = legacy.said(TransformerDecoderOnly.__init__, position_embedding=position_embedding,
                           max_sequence_length=max_sequence_length,
                           tie_word_embeddings=tie_word_embeddings)
        renamed = legacy.rename(kwargs, type(self).__name__, names,
                                warn=not kwargs.get("_loading", False), said=said)
        position_embedding = renamed.get("position_embedding", position_embedding)
        max_sequence_length = renamed.get("max_sequence_length", max_sequence_length)
        super().__init__(vocabulary_size, num_layers, hidden_dim, block,
                         _legacy_defaults=legacy_defaults, _said=said, **kwargs)
        tie_word_embeddings = self._legacy.pop("tie_word_embeddings", tie_word_embeddings)
        check_one_of("position_embedding", position_embedding, POSITION_EMBEDDINGS)
        check_int("max_sequence_length", max_sequence_length, 1,
                  allow_none=position_embedding != "learned")
        check_bool("tie_word_embeddings", tie_word_embeddings)
        self.position_embedding = position_embedding
        self.max_sequence_length = max_sequence_length
        self.tie_word_embeddings = tie_word_embeddings
        self._assemble()

    def _embedding(self) -> TokenEmbedding:
        position = self.position_embedding
        return TokenEmbedding(
            self.vocabulary_size, self.hidden_dim, position=position,
            max_sequence_length=self.max_sequence_length if position == "learned" else None,
            scale=math.sqrt(self.hidden_dim) if position == "sinusoidal" else None,
            dropout=self.dropout, seed=self.seed,
            embeddings_initializer=sublayer_initializer(
                embeddings_initializer(self.kernel_initializer), "embedding"),
            name="embedding", dtype=self.dtype_policy)

    def _head(self) -> OutputHead:
        return OutputHead(
            self.vocabulary_size, tie_word_embeddings=self.tie_word_embeddings,
            use_bias=self.block.use_bias and not self.tie_word_embeddings,
            kernel_initializer=sublayer_initializer(self.kernel_initializer, "head"),
            name="head", dtype=self.dtype_policy)

    def build(self, inputs_shape, padding_mask_shape=None):
        self._build_parts(inputs_shape)

    def _run_blocks(self, x, padding_mask, caches, index, return_attention, training=None):
        """`x` through the blocks (and their caches at `index`, when given): `x`, the new
        caches and the weights."""
        new_caches, weights = [], []
        for i, block in enumerate(self.blocks):
            kwargs = {} if caches is None else {"cache": caches[i], "cache_update_index": index}
            results = call_layer(block, x, padding_mask=padding_mask,
                                 return_attention_scores=return_attention, training=training,
                                 **kwargs)
            results = results if isinstance(results, tuple) else (results,)
            x = results[0]
            if caches is not None:
                new_caches.append(results[1])
            if return_attention:
                weights.append(results[-1])  # (B, H, T, S)
        return x, new_caches, weights

    def call(self, inputs, padding_mask=None, return_attention_scores=False, training=None):
        x, padding_mask, _ = self._embed(inputs, padding_mask, training=training)  # (B, T, d)
        x, _, weights = self._run_blocks(x, padding_mask, None, None, return_attention_scores,
                                         training)
        logits = self._logits(x)  # (B, T, V)
        if return_attention_scores:
            return logits, ops.cast(ops.stack(weights, axis=1), "float32")  # (B, L, H, T, T)
        return logits

    # ---- the decoding contract (keras_attn.decoding.contract.Decoder) ----------------------

    def init_decode_state(self, batch_size, max_length: int) -> dict:
        """`{"cache": one (k, v) per block}`, each `(B, H_kv, max_length, head_dim)`, zeros."""
        check_int("max_length", max_length, 1)
        if self.max_sequence_length is not None and max_length > self.max_sequence_length:
            raise ValueError(
                f"Argument `max_length` must be at most the model's max_sequence_length="
                f"{self.max_sequence_length}. Received: max_length={max_length}"
            )
        return {"cache": tuple(block.init_cache(batch_size, max_length)
                               for block in self.blocks)}

    def decode_step(self, token_ids, index, state: dict, return_attention_scores: bool = False,
                    return_logits: bool = True, **kwargs):
        """Tokens at positions `index, index + 1, ...` through the stack and the caches.

        Args:
            token_ids: int `(B,)` (one token) or `(B, T)` (a prompt, at once).
            index: scalar int tensor (or int), the position of the first token.
            state: the dict of `init_decode_state` or of the previous call.
            return_attention_scores: bool, also return the last token's weights (for
                heatmaps; keras_attn 0.2's `return_attention` still works, deprecated).
                Defaults to `False`.
            return_logits: bool, compute the logits; `False` only fills the cache (a prompt)
                and returns None in their place, skipping the vocabulary projection.
                Defaults to `True`.

        Returns:
            `(logits, state, attention)`: float32 logits `(B, V)` predicting position
            `index + 1` (`(B, T, V)` for `(B, T)` tokens) or None, the updated state, and the
            weights of the last token, float32 `(B, num_layers, num_heads, S)` (None unless
            asked).
        """
        return_attention = renamed_argument("TransformerDecoderOnly.decode_step", kwargs,
                                            "return_attention", "return_attention_scores",
                                            return_attention_scores, False)
        single = len(token_ids.shape) == 1
        token_ids = ops.cast(token_ids, "int32")
        # A tensor, as the loops pass it: the attention then treats position 0 of the prompt
        # like any other cache position (with the local kernel it falls back to dense).
        index = ops.convert_to_tensor(index, "int32")
        if single:
            token_ids = ops.expand_dims(token_ids, -1)  # (B, 1)
        x = self.embedding(token_ids, start_index=index)  # (B, T, d)
        x, caches, weights = self._run_blocks(x, None, state["cache"], index, return_attention)
        state = {"cache": tuple(caches)}
        logits = None
        if return_logits:
            logits = self._step_logits(x)  # (B, T, V)
            logits = logits[:, 0] if single else logits
        if not return_attention:
            return logits, state, None
        attention = ops.stack([w[:, :, -1, :] for w in weights], axis=1)  # (B, L, H, S)
        return logits, state, ops.cast(attention, "float32")

    def _step_logits(self, x):
        """`self._logits(x)` for the few rows of a decoding step `(B, T, d)`.

        On TensorFlow without XLA a tied float head multiplies by the token table `E`
        `(V, d)` as `(E xᵀ)ᵀ` rather than `x Eᵀ`: TensorFlow's CPU matmul reads the transposed
        table slowly as a right operand (GPT-2's 50,257 x 768 table at 8 rows: 68 ms against
        24.5 ms, on the shared 2-core machine of benchmarks/RESULTS.md), and the transposed
        result is only `(B·T, V)`. XLA (and JAX) run `x Eᵀ` faster (23.4 ms against 46.8 ms):
        they, and other heads (untied, quantized, with a transform) take `self._logits`.
        """
        head = self.head
        table = getattr(head, "token_embedding", None)
        if (keras.backend.backend() != "tensorflow" or in_xla_context()
                or not self.tie_word_embeddings
                or getattr(head, "transform_dense", None) is not None
                or table is None or table.quantization_mode is not None
                or table.reverse_dtype is not None or table.logit_soft_cap is not None):
            return self._logits(x)
        h = self._finish(x)  # (B, T, d)
        rows = ops.reshape(h, (-1, ops.shape(h)[-1]))  # (B·T, d)
        embeddings = ops.cast(table.embeddings, rows.dtype)  # (V, d)
        logits = ops.transpose(ops.matmul(embeddings, ops.transpose(rows)))  # (B·T, V)
        logits = ops.reshape(logits, tuple(ops.shape(h)[:-1]) + (self.vocabulary_size,))
        if head.bias is not None:
            logits = logits + ops.cast(head.bias, logits.dtype)
        return ops.cast(logits, "float32")  # (B, T, V)

    def compute_output_shape(self, inputs_shape, padding_mask_shape=None):
        return tuple(inputs_shape) + (self.vocabulary_size,)

    def compute_output_spec(self, inputs, padding_mask=None, return_attention_scores=False,
                            training=None):
        logits = keras.KerasTensor(tuple(inputs.shape) + (self.vocabulary_size,), dtype="float32")
        if not return_attention_scores:
            return logits
        weights = (inputs.shape[0], self.num_layers, self.num_heads, inputs.shape[1],
                   inputs.shape[1])
        return logits, keras.KerasTensor(weights, dtype="float32")

    def get_config(self):
        config = super().get_config()
        config.update({
            "position_embedding": self.position_embedding,
            "max_sequence_length": self.max_sequence_length,
            "tie_word_embeddings": self.tie_word_embeddings,
        })
        return config
