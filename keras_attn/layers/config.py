"""The configuration of attention and of Transformer blocks: made and checked once, where the
user gives it, serialized once, and passed down unchanged.

- `AttentionConfig`: how a block's attention computes — heads, key/value heads, head size,
  projection biases, positions, the kernel (`implementation`, `chunk_size`, `flash_attention`),
  the sliding window, logit soft-capping and torch's extra keys. `MultiHead` takes it as
  `attention=` (its Keras arguments fill it too); the blocks take it as their first argument.
- `BlockConfig`: a Transformer block's own options (FFN, norms, dropout) with its
  `AttentionConfig`: what a stack passes to each of its blocks.

Every field is checked in the constructor, the one place; the allowed kernels are the
dispatch's (`keras_attn.ops.IMPLEMENTATIONS`). Both are frozen (change one with `replace`) and
serialize as plain dicts (`get_config` / `from_config`), which is how layers save them.

Example:
>>> attention = AttentionConfig(num_heads=8, num_key_value_heads=2, position_encoding="rope",
...                             sliding_window=4096)
>>> block = BlockConfig(attention, intermediate_dim=1024, activation="swiglu", norm="rms",
...                     normalize_first=True, use_bias=False)
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import keras

from keras_attn._checks import (
    as_use_bias,
    check_bool,
    check_int,
    check_number,
    check_one_of,
    check_rate,
)
from keras_attn.layers.activations import get_activation, serialize_activation
from keras_attn.layers.add_norm import NORMS
from keras_attn.ops.dispatch import IMPLEMENTATIONS

# The projections of an attention layer that may have a bias (`use_bias` as names).
PROJECTIONS = ("query", "key", "value", "output", "gate")
# Position encodings inside the attention (a name, or such a layer's config).
ATTENTION_POSITIONS = ("rope", "alibi", "relative")
POSITION_LAYERS = ("RotaryEmbedding", "FrequencyRotaryEmbedding", "AlibiBias",
                   "RelativePositionBias")


def _position_encoding(value):
    """None, a name of `ATTENTION_POSITIONS`, or a position layer's config (a layer given is
    kept as its config, so that every attention layer built from the configuration makes its
    own)."""
    from keras_attn.layers.position_bias import position_layer

    if value is None or (isinstance(value, str) and value in ATTENTION_POSITIONS):
        return value
    if isinstance(value, keras.layers.Layer):
        position_layer(value)  # one of the position layers, else the ValueError
        config = keras.layers.serialize(value)
        config.pop("build_config", None)
        return config
    if isinstance(value, dict) and isinstance(value.get("config"), dict) and (
            value.get("class_name") in POSITION_LAYERS or value.get("registered_name")):
        return value  # a serialized position layer: `MultiHead` builds (and checks) it
    raise ValueError(
        "Received an invalid value for argument `position_encoding`, expected None, one of "
        f"{ATTENTION_POSITIONS} or a RotaryEmbedding, AlibiBias or RelativePositionBias "
        f"layer. Received: position_encoding={value!r}")


@keras.saving.register_keras_serializable(package="keras_attn")
@dataclass(frozen=True)
class AttentionConfig:
    """How attention computes, given once and passed down unchanged.

    Args:
        num_heads: int, query heads `H`. Required by blocks and stacks; `MultiHead` takes its
            own `num_heads` (they must agree when both are given). Defaults to `None`.
        num_key_value_heads: optional int dividing `num_heads`: grouped-query attention,
            each key/value head serving `num_heads // num_key_value_heads` query heads
            (1 = multi-query). Defaults to `None` (one per query head).
        head_dim: optional int, the size of each head. Defaults to `None` (blocks:
            `hidden_dim // num_heads`; `MultiHead`: its `key_dim`).
        use_bias: bool, whether the projections have biases, or the names of those that do
            among `"query"`, `"key"`, `"value"`, `"output"`, `"gate"` (Qwen2: `("query",
            "key", "value")`). Defaults to `True`.
        position_encoding: None, `"rope"` (rotary queries and keys), `"alibi"`, `"relative"`
            (T5 buckets, learned), or a `RotaryEmbedding`, `AlibiBias` or
            `RelativePositionBias` layer (kept as its config: each attention layer builds its
            own). Defaults to `None`.
        implementation: the kernel, one of `keras_attn.ops.IMPLEMENTATIONS`: `"auto"` (the
            kernel measured fastest on this backend and device, `keras_attn.tuning.AUTO_KERNELS`:
            the dense kernel on TensorFlow and JAX CPUs, the fused one on torch), `"dense"`,
            `"fused"` (the backend's own op: torch's SDPA, JAX's `dot_product_attention`,
            Keras' op on TensorFlow), `"chunked"` (exact attention blockwise over keys, memory
            `T · chunk_size`; no attention dropout, no returned weights), `"local"` (with
            `sliding_window`, O(T · window)) or `"linear"` (kernelized attention, not
            softmax). A call a kernel cannot compute runs the dense one
            (`keras_attn.ops.kernel_for`). Defaults to `"auto"`.
        chunk_size: optional int, keys per block of the chunked kernel (`None`: sized by
            `keras_attn.tuning`). Defaults to `None`.
        flash_attention: optional bool, Keras' meaning: `True` asks the backend's flash
            kernel, `False` forbids it, `None` lets the dispatch choose. Defaults to `None`.
        sliding_window: optional int `w`: the query at position p sees the keys j with
            |p - j| < w (with a causal mask, the `w` keys p - w + 1 … p): Keras' and Hugging
            Face Mistral's meaning. Defaults to `None`.
        soft_cap: optional float `c > 0`: scores become `c · tanh(scores / c)` before the mask
            (Gemma 2's attention logit soft-capping). Defaults to `None`.
        use_gate: bool, gate the attention output by `sigmoid(query W_g)` (Keras'
            `use_gate`). Defaults to `False`.
        add_bias_kv: bool, append a learned key and value (torch). Defaults to `False`.
        add_zero_attn: bool, append a zero key and value (torch). Defaults to `False`.

    Example:
    >>> AttentionConfig(num_heads=8, num_key_value_heads=2, position_encoding="rope")
    >>> AttentionConfig(num_heads=4, implementation="chunked", chunk_size=512)
    """

    num_heads: int | None = None
    num_key_value_heads: int | None = None
    head_dim: int | None = None
    use_bias: bool | tuple = True
    position_encoding: str | dict | None = None
    implementation: str = "auto"
    chunk_size: int | None = None
    flash_attention: bool | None = None
    sliding_window: int | None = None
    soft_cap: float | None = None
    use_gate: bool = False
    add_bias_kv: bool = False
    add_zero_attn: bool = False

    def __post_init__(self):
        for name in ("num_heads", "num_key_value_heads", "head_dim", "chunk_size",
                     "sliding_window"):
            value = getattr(self, name)
            check_int(name, value, 1, allow_none=True)
            if value is not None:
                object.__setattr__(self, name, int(value))
        if (self.num_heads is not None and self.num_key_value_heads is not None
                and self.num_heads % self.num_key_value_heads):
            raise ValueError(
                "Received an invalid value for argument `num_key_value_heads`, expected a "
                f"divisor of num_heads={self.num_heads}. Received: "
                f"num_key_value_heads={self.num_key_value_heads}")
        object.__setattr__(self, "use_bias", as_use_bias(self.use_bias, PROJECTIONS))
        object.__setattr__(self, "position_encoding",
                           _position_encoding(self.position_encoding))
        check_one_of("implementation", self.implementation, IMPLEMENTATIONS)
        if self.chunk_size is not None and self.implementation != "chunked":
            raise ValueError(
                "Argument `chunk_size` applies to implementation=\"chunked\" only. Received: "
                f"chunk_size={self.chunk_size!r}, implementation={self.implementation!r}")
        if self.implementation == "local" and self.sliding_window is None:
            raise ValueError(
                "Argument `implementation=\"local\"` needs a `sliding_window`. Received: "
                f"implementation={self.implementation!r}, sliding_window=None")
        if self.flash_attention is not None:
            check_bool("flash_attention", self.flash_attention)
        if self.flash_attention and self.implementation not in ("fused", "auto"):
            raise ValueError(
                "Argument `flash_attention=True` needs implementation=\"fused\" or \"auto\" "
                "(the backend's own op, as Keras' MultiHeadAttention). Received: "
                f"flash_attention=True, implementation={self.implementation!r}")
        check_number("soft_cap", self.soft_cap, 0, strict=True, allow_none=True)
        for name in ("use_gate", "add_bias_kv", "add_zero_attn"):
            check_bool(name, getattr(self, name))

    def check_dropout(self, dropout: float) -> None:
        """Raise if the kernel cannot drop attention weights at rate `dropout`."""
        if self.flash_attention and dropout > 0:
            raise ValueError(
                "Argument `flash_attention=True` takes no dropout on the attention weights (as "
                f"Keras' MultiHeadAttention). Received: flash_attention=True, dropout={dropout!r}")
        if self.implementation == "chunked" and dropout > 0:
            raise ValueError(
                "Argument `implementation=\"chunked\"` has no dropout on the attention "
                "weights, where `dropout` applies too: use dropout=0 or implementation=\"dense\"."
                f" Received: implementation={self.implementation!r}, dropout={dropout!r}")

    def for_cross_attention(self) -> AttentionConfig:
        """The configuration of a decoder's cross-attention: the same heads, biases and
        kernel, without positions or a window (there is no window across two sequences: the
        local kernel becomes `"auto"`)."""
        implementation = "auto" if self.implementation == "local" else self.implementation
        return self.replace(position_encoding=None, sliding_window=None,
                            implementation=implementation)

    def replace(self, **changes) -> AttentionConfig:
        """A copy with `changes` applied (checked as the constructor checks)."""
        return dataclasses.replace(self, **changes)

    def get_config(self) -> dict:
        """The fields that differ from their defaults, as a JSON-able dict."""
        config = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value != field.default:
                config[field.name] = list(value) if isinstance(value, tuple) else value
        return config

    @classmethod
    def from_config(cls, config: dict) -> AttentionConfig:
        return cls(**config)

    @classmethod
    def coerce(cls, value, name: str = "attention") -> AttentionConfig:
        """`value` as an `AttentionConfig`: itself, its config (a dict) or an int (the number
        of heads); anything else is a ValueError naming `name`."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - {f.name for f in dataclasses.fields(cls)})
            if unknown:
                raise ValueError(
                    f"Argument `{name}` has keys that are not AttentionConfig fields: "
                    f"{unknown}. Received: {name}={value!r}")
            return cls.from_config(value)
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(num_heads=value)
        raise ValueError(
            f"Received an invalid value for argument `{name}`, expected an AttentionConfig, "
            f"its config (a dict) or the number of heads (an int). Received: {name}={value!r}")

    @classmethod
    def merge(cls, attention, **given) -> AttentionConfig:
        """`attention` (an `AttentionConfig`, its dict, or None) with the fields in `given`
        set, a given value equal to the field's default meaning "not said": a field set both
        ways must agree. `MultiHead` fills its configuration so from its Keras arguments
        (`num_heads`, `use_bias`, `sliding_window`, ...), the builders from their keywords."""
        base = cls() if attention is None else cls.coerce(attention)
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        changes = {}
        for name, value in given.items():
            if value is defaults[name] or (not isinstance(value, keras.layers.Layer)
                                           and value == defaults[name]):
                continue
            ours = getattr(base, name)
            if ours == value and not isinstance(value, keras.layers.Layer):
                continue  # said both ways alike: the configuration stays the object it is
            if ours != defaults[name] and ours != value:
                raise ValueError(
                    f"Argument `{name}` and the `attention` configuration disagree; give it "
                    f"once. Received: {name}={value!r}, attention.{name}={ours!r}")
            changes[name] = value
        return base.replace(**changes) if changes else base


@keras.saving.register_keras_serializable(package="keras_attn")
@dataclass(frozen=True)
class BlockConfig:
    """A Transformer block's options: its `AttentionConfig`, FFN, norms and dropout. The
    stacks take one and give it to each of their blocks.

    Args:
        attention: an `AttentionConfig` (or its dict, or the number of heads as an int).
        intermediate_dim: int, the hidden size of the FFN.
        activation: the FFN activation: a Keras activation, `"gelu_tanh"`, or a gated one,
            `act(x W_g) ⊙ (x W_1)`: `"swiglu"`, `"geglu"`, `"geglu_tanh"`, `"reglu"`
            (`keras_attn.layers.activations`). Defaults to `"relu"`.
        use_bias: bool, biases in the FFN's projections (and a stack's untied output head).
            Defaults to `True`.
        normalize_first: bool, pre-norm (`x + f(norm(x))`) instead of post-norm
            (`norm(x + f(x))`). Defaults to `False`.
        norm: `"layer"` (`LayerNormalization`) or `"rms"` (`keras.layers.RMSNormalization`).
            Defaults to `"layer"`.
        layer_norm_epsilon: float > 0, the norms' epsilon. Defaults to `1e-5`.
        dropout: float in [0, 1), dropout on the attention weights, the FFN's hidden layer and
            each residual branch (and a stack's embedding). Defaults to `0.0`.

    Example:
    >>> BlockConfig(AttentionConfig(num_heads=4), intermediate_dim=512, dropout=0.1)
    """

    attention: AttentionConfig
    intermediate_dim: int
    activation: object = "relu"
    use_bias: bool = True
    normalize_first: bool = False
    norm: str = "layer"
    layer_norm_epsilon: float = 1e-5
    dropout: float = 0.0

    def __post_init__(self):
        attention = AttentionConfig.coerce(self.attention)
        if attention.num_heads is None:
            raise ValueError(
                "Argument `attention` must give `num_heads` for a Transformer block. "
                f"Received: attention={attention!r}")
        object.__setattr__(self, "attention", attention)
        check_int("intermediate_dim", self.intermediate_dim, 1)
        object.__setattr__(self, "intermediate_dim", int(self.intermediate_dim))
        object.__setattr__(self, "activation", get_activation(self.activation))
        for name in ("use_bias", "normalize_first"):
            check_bool(name, getattr(self, name))
        check_one_of("norm", self.norm, NORMS)
        check_number("layer_norm_epsilon", self.layer_norm_epsilon, 0, strict=True)
        check_rate("dropout", self.dropout)
        attention.check_dropout(self.dropout)

    def replace(self, **changes) -> BlockConfig:
        """A copy with `changes` applied (checked as the constructor checks)."""
        return dataclasses.replace(self, **changes)

    def arguments(self) -> dict:
        """The fields as keyword arguments of a block."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def get_config(self) -> dict:
        config = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        config["attention"] = self.attention.get_config()
        config["activation"] = serialize_activation(self.activation)
        return config

    @classmethod
    def from_config(cls, config: dict) -> BlockConfig:
        return cls(**config)

    @classmethod
    def coerce(cls, value, name: str = "block") -> BlockConfig:
        """`value` as a `BlockConfig`: itself or its config (a dict); anything else is a
        ValueError naming `name`."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            unknown = sorted(set(value) - {f.name for f in dataclasses.fields(cls)})
            if unknown:
                raise ValueError(
                    f"Argument `{name}` has keys that are not BlockConfig fields: {unknown}. "
                    f"Received: {name}={value!r}")
            return cls.from_config(value)
        raise ValueError(
            f"Received an invalid value for argument `{name}`, expected a BlockConfig or its "
            f"config (a dict). Received: {name}={value!r}")
