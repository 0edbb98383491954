"""One normalized description of a pretrained Transformer, whatever it was saved by.

`ArchitectureSpec` is what `spec_from_hf_config` (Hugging Face `config.json`) and
`spec_from_keras_hub` (a keras-hub backbone or task) return, and what a keras_attn model is
built from. Its fields name the computation, not the checkpoint's spelling:

- a block is `normalize_first` (pre-norm: `x + attn(norm(x))`, then `x + ffn(norm(x))`; Llama,
  Mistral, Qwen2, GPT-2) or post-norm (`norm(x + attn(x))`, then `norm(x + ffn(x))`; BERT);
- the FFN is `gated` (`act(x W_gate) * (x W_hidden)`, then `W_output`; SwiGLU) or plain
  (`act(x W_hidden)`, then `W_output`);
- attention scores are scaled by `1 / sqrt(head_dim)` always (a checkpoint scaling otherwise is
  refused); `num_kv_heads < num_heads` is grouped-query attention (query head `h` reads
  key/value head `h // (num_heads // num_kv_heads)`);
- positions are `"rope"` (rotary, inverse frequencies from `rope_inverse_frequencies()`) or
  `"learned"` (a `(max_sequence_length, hidden_dim)` table added to the token embeddings, position
  ids counted from 0);
- `sliding_window=w`: the query at position p sees the keys p - w + 1 ... p (keras_attn's and
  Hugging Face Mistral's meaning), in every layer.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from keras_attn._checks import check_int, warn_deprecated
from keras_attn.layers import legacy
from keras_attn.ops.rope import rope_inverse_frequencies

# keras_attn 0.2's field names (readable, and accepted by `replace`, for one release).
RENAMED_FIELDS = {"vocab_size": "vocabulary_size", "hidden_size": "hidden_dim",
                  "intermediate_size": "intermediate_dim", "num_kv_heads": "num_key_value_heads",
                  "norm_eps": "layer_norm_epsilon", "norm_first": "normalize_first",
                  "max_positions": "max_sequence_length", "type_vocab_size": "num_segments",
                  "head_norm_eps": "head_layer_norm_epsilon"}
ARCHITECTURES = ("llama", "mistral", "qwen2", "gpt2", "bert")
TASKS = ("causal_lm", "masked_lm", "encoder")
# Activation names of the spec and their formulas (keras: `keras.activations.<name>`).
ACTIVATIONS = {
    "silu": "x * sigmoid(x)",
    "gelu": "x * Φ(x), the exact (erf) GELU: keras.activations.gelu(x, approximate=False)",
    "gelu_tanh": "the tanh approximation of GELU: keras.activations.gelu(x, approximate=True)",
    "relu": "max(x, 0)",
}


@dataclass(frozen=True)
class ArchitectureSpec:
    """The architecture of a pretrained checkpoint, in keras_attn's terms.

    Args:
        architecture: str, the family: `"llama"`, `"mistral"`, `"qwen2"`, `"gpt2"` or `"bert"`.
        task: str, the head: `"causal_lm"` (next-token logits), `"masked_lm"` (BERT's MLM head)
            or `"encoder"` (hidden states and BERT's pooler, no head).
        source: str, what it was read from, e.g. `"LlamaForCausalLM"`,
            `"keras_hub.LlamaCausalLM"`.
        vocabulary_size: int, rows of the token embedding (and columns of the logits).
        hidden_dim: int, the model width `d`.
        num_layers: int, Transformer blocks.
        num_heads: int, query heads.
        num_key_value_heads: int, key/value heads (`< num_heads`: grouped-query attention).
        head_dim: int, the size of one head (`num_heads * head_dim` may differ from
            `hidden_dim`).
        intermediate_dim: int, the FFN's inner width.
        causal: bool, whether a position attends only to itself and earlier positions.
        norm: str, `"rms"` (`x / sqrt(mean(x²) + eps) * scale`) or `"layer"`
            (`(x - mean) / sqrt(var + eps) * scale + offset`).
        layer_norm_epsilon: float, the norms' epsilon (inside the square root).
        normalize_first: bool, pre-norm (True) or post-norm (False) blocks.
        activation: str, the FFN activation, a key of `ACTIVATIONS`.
        gated_ffn: bool, whether the FFN is gated (SwiGLU-style).
        query_bias: bool, whether the query projection has a bias.
        key_bias: bool, likewise the key projection.
        value_bias: bool, likewise the value projection.
        output_bias: bool, likewise the attention's output projection.
        ffn_bias: bool, whether the FFN's projections have biases.
        position: str, `"rope"` or `"learned"`.
        max_sequence_length: int or None, the longest sequence the checkpoint was configured
            for (the learned table's rows; for RoPE informative only, None when unrecorded).
        rope_theta: float or None, the RoPE base (None without RoPE).
        rope_type: str or None, `"default"`, `"linear"`, `"llama3"` or `"yarn"` (None without
            RoPE).
        rope_factor: float or None, the scaling factor of `"linear"`, `"llama3"` and `"yarn"`.
        rope_low_freq_factor: float or None, `"llama3"` only.
        rope_high_freq_factor: float or None, `"llama3"` only.
        rope_original_max_positions: int or None, `"llama3"`'s and `"yarn"`'s pretraining
            length.
        rope_beta_fast: float or None, `"yarn"` only (None: 32).
        rope_beta_slow: float or None, `"yarn"` only (None: 1).
        rope_truncate: bool, `"yarn"` only: whole-dimension correction range.
        rope_attention_scaling: float, what cos and sin are multiplied by (so the rotated
            queries and keys); 1 but for `"yarn"`.
        sliding_window: int or None, the local attention span of every layer.
        num_segments: int, rows of the token-type (segment) embedding; 0 for none.
        embedding_norm: bool, a norm right after the summed embeddings (BERT).
        final_norm: bool, a norm after the last block (pre-norm models).
        tie_word_embeddings: bool, whether the output projection is the token embedding
            transposed (no `lm_head/kernel` or `mlm_head/decoder/kernel` weight).
        head_activation: str or None, the activation of BERT's MLM head transform.
        head_layer_norm_epsilon: float or None, the epsilon of the MLM head's layer norm.
        pooler: bool, whether BERT's pooler (dense + tanh on the first token) is present.
        bos_token_id: int or None, the begin-of-sequence id.
        eos_token_ids: tuple of int, the ids that end generation (may be empty).
        pad_token_id: int or None, the padding id (None: the checkpoint has none).
        dtype: str, the dtype of the weights, `"float32"`, `"bfloat16"` or `"float16"`: the
            one the config declares (`spec_from_hf_config`), that of the loaded arrays
            (`load_hf_checkpoint`) or of the backbone's variables (`spec_from_keras_hub`).
        dropout: float, dropout on residual branches and hidden states (fine-tuning).
        attention_dropout: float, dropout on attention weights.
        embedding_dropout: float, dropout on the summed embeddings.
    """

    architecture: str
    task: str
    source: str
    vocabulary_size: int
    hidden_dim: int
    num_layers: int
    num_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_dim: int
    causal: bool
    norm: str
    layer_norm_epsilon: float
    normalize_first: bool
    activation: str
    gated_ffn: bool
    query_bias: bool
    key_bias: bool
    value_bias: bool
    output_bias: bool
    ffn_bias: bool
    position: str
    max_sequence_length: int | None
    rope_theta: float | None = None
    rope_type: str | None = None
    rope_factor: float | None = None
    rope_low_freq_factor: float | None = None
    rope_high_freq_factor: float | None = None
    rope_original_max_positions: int | None = None
    rope_beta_fast: float | None = None
    rope_beta_slow: float | None = None
    rope_truncate: bool = True
    rope_attention_scaling: float = 1.0
    sliding_window: int | None = None
    num_segments: int = 0
    embedding_norm: bool = False
    final_norm: bool = True
    tie_word_embeddings: bool = False
    head_activation: str | None = None
    head_layer_norm_epsilon: float | None = None
    pooler: bool = False
    bos_token_id: int | None = None
    eos_token_ids: tuple[int, ...] = ()
    pad_token_id: int | None = None
    dtype: str = "float32"
    dropout: float = 0.0
    attention_dropout: float = 0.0
    embedding_dropout: float = 0.0

    def __post_init__(self):
        if self.architecture not in ARCHITECTURES:
            raise ValueError(f"Received an invalid value for argument `architecture`, expected "
                             f"one of {ARCHITECTURES}. Received: "
                             f"architecture={self.architecture!r}")
        if self.task not in TASKS:
            raise ValueError(f"Received an invalid value for argument `task`, expected one of "
                             f"{TASKS}. Received: task={self.task!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"Received an invalid value for argument `activation`, expected "
                             f"one of {sorted(ACTIVATIONS)}. Received: "
                             f"activation={self.activation!r}")
        for name in ("vocabulary_size", "hidden_dim", "num_layers", "num_heads",
                     "num_key_value_heads", "head_dim", "intermediate_dim"):
            check_int(name, getattr(self, name))
        if self.num_heads % self.num_key_value_heads:
            raise ValueError("Received an invalid value for argument `num_key_value_heads`, "
                             f"expected a divisor of num_heads={self.num_heads}. Received: "
                             f"num_key_value_heads={self.num_key_value_heads}")

    def rope_inverse_frequencies(self) -> np.ndarray:
        """The `(head_dim // 2,)` float32 inverse frequencies of the rotary embedding.

        Raises:
            ValueError: the spec has no rotary positions.
        """
        if self.position != "rope":
            raise ValueError(f"The {self.source} spec has {self.position!r} positions, no "
                             "rotary embedding.")
        return rope_inverse_frequencies(
            self.head_dim, self.rope_theta, self.rope_type, self.rope_factor,
            self.rope_low_freq_factor, self.rope_high_freq_factor,
            self.rope_original_max_positions, self.rope_beta_fast, self.rope_beta_slow,
            self.rope_truncate)

    def replace(self, **changes) -> ArchitectureSpec:
        """A copy with `changes` applied (e.g. `spec.replace(dtype="float32")`); the field
        names of keras_attn 0.2 (`hidden_size`, `num_kv_heads`, ...) still work, with a
        DeprecationWarning."""
        changes.update(legacy.rename(changes, "ArchitectureSpec.replace", RENAMED_FIELDS))
        return dataclasses.replace(self, **changes)


def _deprecated_field(old: str, new: str):
    def read(self):
        warn_deprecated(f"ArchitectureSpec: `{old}` is `{new}` (keras_attn 0.3 names, see "
                        "CHANGELOG.md).")
        return getattr(self, new)

    return property(read, doc=f"Deprecated: `{new}`.")


for _old, _new in RENAMED_FIELDS.items():
    setattr(ArchitectureSpec, _old, _deprecated_field(_old, _new))
