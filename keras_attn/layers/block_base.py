"""What every Transformer block shares: the arguments (kernel choice, sliding window,
positions, biases), the sublayers built from them (`MultiHead`, `FFN`, norms), the pre- and
post-LN residual wiring, and the config. The blocks: `keras_attn.layers.transformer_blocks`
(encoder, decoder) and `keras_attn.layers.decoder_only`."""

from __future__ import annotations

import keras

from keras_attn._checks import check_bool, check_number, check_one_of, warn_deprecated
from keras_attn.layers.add_norm import NORMS, AddNorm, make_norm
from keras_attn.layers.base import check_positive_int, check_rate
from keras_attn.layers.dropout import Dropout
from keras_attn.layers.ffn import FFN, GATED
from keras_attn.layers.initializers import sublayer_initializer
from keras_attn.layers.multi_head import MultiHead
from keras_attn.layers.position_bias import RelativePositionBias
from keras_attn.layers.quantization import QuantizedSublayers
from keras_attn.ops import fused

IMPLEMENTATIONS = ("dense", "chunked", "local", "fused", "auto")
ATTENTION_POSITIONS = (None, "rope", "alibi", "relative")


@keras.saving.register_keras_serializable(package="keras_attn")
def gelu_tanh(x):
    """GELU with the tanh approximation (GPT-2's `gelu_new`, PyTorch's `approximate="tanh"`).
    Blocks and stacks take it as `activation="gelu_tanh"`. Under TensorFlow outside XLA its
    gradient is the closed form (`keras_attn.ops.fused.gelu_tanh`)."""
    if fused.use_fused():
        return fused.gelu_tanh(x)
    return keras.activations.gelu(x, approximate=True)


def _get_activation(activation):
    """A Keras activation, `"gelu_tanh"`, or the name of a gated one (`"swiglu"`, `"geglu"`)
    as it is."""
    if isinstance(activation, str) and activation in GATED:
        return activation
    if activation in ("gelu_tanh", "keras_attn>gelu_tanh"):
        return gelu_tanh
    try:
        return keras.activations.get(activation)
    except ValueError as error:
        raise ValueError(
            "Received an invalid value for argument `activation`. "
            f"Received: activation={activation!r}"
        ) from error


def serialize_activation(activation):
    """The config form of what `_get_activation` returns."""
    if activation is gelu_tanh:
        return "gelu_tanh"
    return activation if isinstance(activation, str) else keras.activations.serialize(activation)


def deprecated_window(attention_window, sliding_window):
    """`sliding_window`, or the deprecated `attention_window=d` as `sliding_window=d + 1` (a
    query sees keys within distance `d`), with a DeprecationWarning."""
    if attention_window is None:
        return sliding_window
    check_positive_int("attention_window", attention_window)
    if sliding_window is not None:
        raise ValueError(
            "Arguments `attention_window` (deprecated) and `sliding_window` say the same thing; "
            f"give `sliding_window` only. Received: attention_window={attention_window!r}, "
            f"sliding_window={sliding_window!r}")
    warn_deprecated(
        f"`attention_window={attention_window}` is deprecated: it is "
        f"`sliding_window={attention_window + 1}` (a query sees the keys at distance < "
        "sliding_window, as in keras.layers.MultiHeadAttention).")
    return attention_window + 1


def check_kernel_choice(implementation, chunk_size, sliding_window, dropout) -> None:
    """The attention kernel arguments of blocks and stacks, checked where they are given."""
    check_one_of("implementation", implementation, IMPLEMENTATIONS)
    check_positive_int("chunk_size", chunk_size, allow_none=True)
    check_positive_int("sliding_window", sliding_window, allow_none=True)
    if chunk_size is not None and implementation != "chunked":
        raise ValueError(
            "Argument `chunk_size` applies to implementation=\"chunked\" only. Received: "
            f"chunk_size={chunk_size!r}, implementation={implementation!r}")
    if implementation == "local" and sliding_window is None:
        raise ValueError(
            "Argument `implementation=\"local\"` needs a `sliding_window`. Received: "
            f"implementation={implementation!r}, sliding_window=None")
    if implementation == "chunked" and dropout > 0:
        raise ValueError(
            "Argument `implementation=\"chunked\"` has no dropout on the attention weights, "
            "where `dropout` applies too: use dropout=0 or implementation=\"dense\". Received: "
            f"implementation={implementation!r}, dropout={dropout!r}")


# Names `use_bias` may hold besides the attention projections (`MultiHead`'s): the block's
# FFN, and a stack's untied output head.
BIAS_PARTS = ("ffn", "head")


def check_use_bias(use_bias):
    """`use_bias` as a bool, or a tuple of the names of the parts with biases: attention
    projections (`"query"`, `"key"`, `"value"`, `"output"`, checked by `MultiHead`), `"ffn"`
    and (stacks) `"head"`."""
    if isinstance(use_bias, bool):
        return use_bias
    names = (use_bias,) if isinstance(use_bias, str) else use_bias
    if not isinstance(names, (tuple, list)) or not all(isinstance(n, str) for n in names):
        raise ValueError(
            "Received an invalid value for argument `use_bias`, expected a bool or the names "
            f"of the parts with a bias. Received: use_bias={use_bias!r}")
    return tuple(names)


def has_bias(use_bias, part: str) -> bool:
    """Whether `part` (`"ffn"`, `"head"`) has a bias under `use_bias`."""
    return use_bias is True or (not isinstance(use_bias, bool) and part in use_bias)


def attention_bias(use_bias):
    """`use_bias` as `MultiHead` takes it: a bool, or the attention projections' names."""
    if isinstance(use_bias, bool):
        return use_bias
    names = tuple(name for name in use_bias if name not in BIAS_PARTS)
    return names if names else False


def _position_config(position_encoding):
    """A position encoding as a block keeps it: a name, or a position layer's config (each
    block builds its own layer from it)."""
    if isinstance(position_encoding, keras.layers.Layer):
        return keras.layers.serialize(position_encoding)
    if isinstance(position_encoding, dict):
        return position_encoding
    check_one_of("position_encoding", position_encoding, ATTENTION_POSITIONS)
    return position_encoding


def _head_dim(embed_dim: int, num_heads: int) -> int:
    """`embed_dim // num_heads`, refusing to floor it silently."""
    if embed_dim % num_heads:
        raise ValueError(
            f"Received an invalid value for argument `num_heads`, expected a divisor of the "
            f"embedding size {embed_dim}. Received: num_heads={num_heads}"
        )
    return embed_dim // num_heads


def _check_embedded_shape(name: str, shape) -> None:
    if len(shape) != 3 or shape[-1] is None:
        raise ValueError(
            f"Argument `{name}` must have shape (batch_size, seq_len, embed_dim) with a known "
            f"embed_dim. Received: {name}.shape={tuple(shape)}"
        )


class _TransformerBlock(QuantizedSublayers, keras.layers.Layer):
    """What every Transformer block shares: arguments, sublayer wiring, config."""

    def __init__(
        self,
        num_heads: int,
        ffn_dim: int,
        dropout: float = 0.0,
        norm_first: bool = False,
        activation="relu",
        epsilon: float = 1e-5,
        kernel_initializer="glorot_uniform",
        seed: int | None = None,
        norm: str = "layer",
        num_key_value_heads: int | None = None,
        position_encoding=None,
        implementation: str = "dense",
        chunk_size: int | None = None,
        sliding_window: int | None = None,
        head_dim: int | None = None,
        use_bias: bool = True,
        gated_ffn: bool = False,
        **kwargs,
    ):
        sliding_window = deprecated_window(kwargs.pop("attention_window", None), sliding_window)
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        check_positive_int("ffn_dim", ffn_dim)
        check_one_of("norm", norm, NORMS)
        check_positive_int("num_key_value_heads", num_key_value_heads, allow_none=True)
        if num_key_value_heads is not None and num_heads % num_key_value_heads:
            raise ValueError(
                "Received an invalid value for argument `num_key_value_heads`, expected a "
                f"divisor of num_heads={num_heads}. Received: "
                f"num_key_value_heads={num_key_value_heads}"
            )
        check_rate("dropout", dropout)
        check_bool("norm_first", norm_first)
        check_number("epsilon", epsilon, 0, strict=True)
        check_positive_int("head_dim", head_dim, allow_none=True)
        use_bias = check_use_bias(use_bias)
        check_bool("gated_ffn", gated_ffn)
        check_kernel_choice(implementation, chunk_size, sliding_window, dropout)
        self.num_heads = num_heads
        self.ffn_dim = ffn_dim
        self.dropout = dropout
        self.norm_first = norm_first
        self.activation = _get_activation(activation)
        self.epsilon = epsilon
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.seed = seed
        self.norm = norm
        self.num_key_value_heads = num_key_value_heads
        self.position_encoding = _position_config(position_encoding)
        self.implementation = implementation
        self.chunk_size = chunk_size
        self.sliding_window = sliding_window
        self.head_dim = head_dim
        self.use_bias = use_bias
        self.gated_ffn = gated_ffn
        self.supports_masking = True

    def _attention(self, embed_dim: int, name: str, causal: bool | None = None) -> MultiHead:
        """Self-attention (`causal` True or False: the block's position encoding and sliding
        window) or cross-attention (`causal=None`: full, no positions); the block's kernel."""
        implementation = self.implementation
        kwargs = {}
        if causal is not None:
            kwargs["sliding_window"] = self.sliding_window
            kwargs["position_encoding"] = self.position_encoding
            if self.position_encoding == "relative":  # a causal query sees no later key
                kwargs["position_encoding"] = RelativePositionBias(
                    bidirectional=not causal, name="position_encoding", dtype=self.dtype_policy)
        elif implementation == "local":  # no window across sequences: the exact kernel
            implementation = "dense"
        attention = MultiHead(
            num_heads=self.num_heads,
            key_dim=self.head_dim or _head_dim(embed_dim, self.num_heads),
            output_dim=embed_dim,
            dropout=self.dropout,
            use_bias=attention_bias(self.use_bias),
            kernel_initializer=sublayer_initializer(self.kernel_initializer, name),
            seed=self.seed,
            num_key_value_heads=self.num_key_value_heads,
            implementation=implementation,
            chunk_size=self.chunk_size if implementation == "chunked" else None,
            name=name,
            dtype=self.dtype_policy,
            **kwargs,
        )
        return attention

    def _build_attention(self, attention: MultiHead, *shapes) -> None:
        attention.build(*shapes)
        # A position layer without weights is never called as a layer: build it, so that
        # `model.quantize` (which refuses unbuilt layers) passes over it.
        position = attention.position_encoding
        if position is not None and not position.built:
            position.build(None)

    def _ffn(self, embed_dim: int, input_shape) -> FFN:
        ffn = FFN(
            hidden_dim=self.ffn_dim,
            output_dim=embed_dim,
            activation=self.activation,
            dropout=self.dropout,
            kernel_initializer=sublayer_initializer(self.kernel_initializer, "ffn"),
            seed=self.seed,
            gated=self.gated_ffn,
            use_bias=has_bias(self.use_bias, "ffn"),
            name="ffn",
            dtype=self.dtype_policy,
        )
        ffn.build(input_shape)
        return ffn

    def _norm(self, name: str, input_shape):
        """Post-LN: an `AddNorm` applied after the sublayer. Pre-LN: a `LayerNormalization`
        applied before it (the residual add then uses `residual_dropout`)."""
        if self.norm_first:
            norm = make_norm(self.norm, self.epsilon, f"{name}_norm", self.dtype_policy)
            norm.build(input_shape)
        else:
            norm = AddNorm(
                dropout=self.dropout,
                epsilon=self.epsilon,
                seed=self.seed,
                norm=self.norm,
                name=f"{name}_add_norm",
                dtype=self.dtype_policy,
            )
            norm.build(input_shape, input_shape)
        return norm

    def _build_residual_dropout(self) -> None:
        self.residual_dropout = None
        if self.norm_first:
            self.residual_dropout = Dropout(
                self.dropout, seed=self.seed, name="residual_dropout", dtype=self.dtype_policy
            )

    def _before(self, norm, x):
        """The sublayer input: LayerNorm(x) in pre-LN, x in post-LN."""
        return norm(x) if self.norm_first else x

    def _after(self, norm, x, y, training):
        """The residual: x + Dropout(y) in pre-LN, LayerNorm(x + Dropout(y)) in post-LN."""
        if self.norm_first:
            return x + self.residual_dropout(y, training=training)
        return norm(x, y, training=training)

    def _ffn_sublayer(self, x, training):
        """The residual FFN sublayer."""
        h = self.ffn(self._before(self.ffn_norm, x), training=training)  # (B, T, d)
        return self._after(self.ffn_norm, x, h, training)

    def _weights_spec(self, inputs, key_length):
        return keras.KerasTensor((inputs.shape[0], self.num_heads, inputs.shape[1], key_length),
                                 dtype=self.compute_dtype)

    def compute_output_shape(self, inputs_shape, *args, **kwargs):
        return tuple(inputs_shape)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "ffn_dim": self.ffn_dim,
                "dropout": self.dropout,
                "norm_first": self.norm_first,
                "activation": serialize_activation(self.activation),
                "epsilon": self.epsilon,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "seed": self.seed,
                "norm": self.norm,
                "num_key_value_heads": self.num_key_value_heads,
                "position_encoding": self.position_encoding,
                "implementation": self.implementation,
                "chunk_size": self.chunk_size,
                "sliding_window": self.sliding_window,
                "head_dim": self.head_dim,
                "use_bias": self.use_bias if isinstance(self.use_bias, bool) else list(
                    self.use_bias),
                "gated_ffn": self.gated_ffn,
                "dtype": self.dtype_config(),
            }
        )
        return config


BLOCK_ARGS_DOC = """        num_heads: int, number of attention heads.
        ffn_dim: int, hidden size of the feed-forward network.
        dropout: float in [0, 1), dropout on the attention weights, the FFN hidden layer and
            each residual branch. Defaults to `0.0`.
        norm_first: bool, pre-LN instead of post-LN. Defaults to `{norm_first}`.
        activation: activation of the FFN hidden layer, `"gelu_tanh"`, or `"swiglu"` /
            `"geglu"` (a gated FFN). Defaults to `"relu"`.
        epsilon: float, the norms' epsilon. Defaults to `1e-5`.
        kernel_initializer: initializer of the dense kernels; each sublayer gets its own
            (`keras_attn.layers.initializers`). Defaults to `"glorot_uniform"`.
        seed: optional int seed for the dropouts. Defaults to `None`.
        norm: `"layer"` or `"rms"` (`keras.layers.RMSNormalization`). Defaults to `"layer"`.
        num_key_value_heads: optional int, grouped-query attention (see `MultiHead`).
            Defaults to `None`.
        position_encoding: optional `"rope"`, `"alibi"`, `"relative"`, or such a layer (e.g.
            `RotaryEmbedding(max_wavelength=500000)`) for the self-attention (see
            `MultiHead`; T5 buckets are one-directional when causal). Defaults to `None`.
        implementation: the attention kernel, `"dense"`, `"chunked"` (exact, memory linear
            in the keys; no dropout) or `"local"` (with `sliding_window`). Defaults to
            `"dense"`.
        chunk_size: optional int, keys per block of the chunked kernel. Defaults to `None`.
        sliding_window: optional int `w`: self-attention sees the keys at distance `< w`
            (Keras' and Hugging Face Mistral's meaning; causal: the `w` latest keys).
            `attention_window=d` is a deprecated alias of `sliding_window=d + 1`.
            Defaults to `None`.
        head_dim: optional int, the size of each head. Defaults to `embed_dim // num_heads`.
        use_bias: bool, biases in the attention projections and the FFN; or the names of the
            parts that have one: attention projections (`MultiHead`'s `use_bias`; Qwen2:
            `("query", "key", "value")`) and `"ffn"` (the FFN's projections). Defaults to
            `True`.
        gated_ffn: bool, a gated FFN with `activation` on the gate:
            `act(x W_g) ⊙ (x W_1)` (`"swiglu"` and `"geglu"` are gated anyway; a gated tanh
            GELU is `activation="gelu_tanh", gated_ffn=True`). Defaults to `False`."""


def document_block(norm_first: bool):
    """A class decorator: the block's docstring gets the shared `Args:` (its `{args}`)."""

    def decorate(cls):
        cls.__doc__ = cls.__doc__.format(args=BLOCK_ARGS_DOC.format(norm_first=norm_first))
        return cls

    return decorate
