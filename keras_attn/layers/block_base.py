"""What every Transformer block shares: the arguments (kernel choice, sliding window,
positions, biases), the sublayers built from them (`MultiHead`, `FFN`, norms), the pre- and
post-LN residual wiring, and the config. The blocks: `keras_attn.layers.transformer_blocks`
(encoder, decoder) and `keras_attn.layers.decoder_only`."""

from __future__ import annotations

import keras

from keras_attn._checks import check_int
from keras_attn.layers import legacy
from keras_attn.layers.activations import gated_name, gelu_tanh  # noqa: F401 - earlier home
from keras_attn.layers.add_norm import AddNorm, make_norm
from keras_attn.layers.config import AttentionConfig, BlockConfig
from keras_attn.layers.dropout import Dropout
from keras_attn.layers.ffn import FFN
from keras_attn.layers.initializers import sublayer_initializer
from keras_attn.layers.multi_head import MultiHead
from keras_attn.layers.position_bias import RelativePositionBias
from keras_attn.layers.quantization import QuantizedSublayers


def call_layer(layer, *args, **kwargs):
    """`layer(*args, **kwargs)`; under `torch.compile`, `layer.call(*args, **kwargs)`.

    Keras' `Layer.__call__` flattens a nested output (an attention's `(outputs, (k, v))`)
    to attach masks, and TorchDynamo cannot trace that flattening (an identity test on
    tuples), so each decoding step compiled on torch would break into one graph per block.
    A compiled decoding step runs built layers on inputs already in their compute dtype,
    where `__call__` adds nothing else: there the layer's `call` runs directly.
    """
    if keras.backend.backend() == "torch":
        import torch

        if torch.compiler.is_compiling():
            return layer.call(*args, **kwargs)
    return layer(*args, **kwargs)


def head_dim(hidden_dim: int, attention: AttentionConfig) -> int:
    """The size of each head: `attention.head_dim`, else `hidden_dim // num_heads`, refusing
    to floor it silently."""
    if attention.head_dim is not None:
        return attention.head_dim
    if hidden_dim % attention.num_heads:
        raise ValueError(
            f"Received an invalid value for argument `num_heads`, expected a divisor of the "
            f"hidden size {hidden_dim} (or give `head_dim`). Received: "
            f"num_heads={attention.num_heads}")
    return hidden_dim // attention.num_heads


def _check_embedded_shape(name: str, shape) -> None:
    if len(shape) != 3 or shape[-1] is None:
        raise ValueError(
            f"Argument `{name}` must have shape (batch_size, seq_len, hidden_dim) with a known "
            f"hidden_dim. Received: {name}.shape={tuple(shape)}"
        )


class _TransformerBlock(QuantizedSublayers, keras.layers.Layer):
    """What every Transformer block shares: arguments, sublayer wiring, config."""

    # The default of `normalize_first` (the decoder-only block's is True).
    normalize_first_default = False

    @legacy.records_given
    def __init__(
        self,
        attention=None,
        intermediate_dim: int | None = None,
        dropout: float = 0.0,
        normalize_first: bool | None = None,
        activation="relu",
        layer_norm_epsilon: float = 1e-5,
        norm: str = "layer",
        use_bias: bool = True,
        kernel_initializer="glorot_uniform",
        seed: int | None = None,
        **kwargs,
    ):
        config = kwargs.pop("config", None)  # a stack's `BlockConfig`, made and checked once
        renamed, fields = legacy.take(kwargs, type(self).__name__, said=legacy.said(
            _TransformerBlock.__init__, intermediate_dim=intermediate_dim,
            normalize_first=normalize_first, layer_norm_epsilon=layer_norm_epsilon))
        super().__init__(**kwargs)
        if config is None:
            if not isinstance(use_bias, bool):  # earlier releases: names of the parts
                fields["use_bias"], use_bias = legacy.split_use_bias(use_bias,
                                                                     type(self).__name__)
            if fields:
                attention = AttentionConfig.merge(attention, **fields)
            if normalize_first is None:
                normalize_first = self.normalize_first_default
            given = {"attention": attention, "intermediate_dim": intermediate_dim,
                     "dropout": dropout, "activation": activation,
                     "layer_norm_epsilon": layer_norm_epsilon, "norm": norm,
                     "use_bias": use_bias, "normalize_first": normalize_first}
            given.update({k: v for k, v in renamed.items() if k != "gated_ffn"})
            if renamed.get("gated_ffn"):
                given["activation"] = gated_name(given["activation"])
            if given["attention"] is None:
                raise ValueError("Argument `attention` is required: an AttentionConfig with "
                                 "`num_heads` (or the number of heads). Received: "
                                 "attention=None")
            if given["intermediate_dim"] is None:
                raise ValueError("Argument `intermediate_dim` is required: the FFN's hidden "
                                 "size. Received: intermediate_dim=None")
            config = BlockConfig(**given)
        self.config = config
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        check_int("seed", seed, 0, allow_none=True)
        self.seed = seed
        self.supports_masking = True

    # The configuration's fields, as attributes.
    attention = property(lambda self: self.config.attention)
    intermediate_dim = property(lambda self: self.config.intermediate_dim)
    dropout = property(lambda self: self.config.dropout)
    normalize_first = property(lambda self: self.config.normalize_first)
    activation = property(lambda self: self.config.activation)
    layer_norm_epsilon = property(lambda self: self.config.layer_norm_epsilon)
    norm = property(lambda self: self.config.norm)
    use_bias = property(lambda self: self.config.use_bias)
    num_heads = property(lambda self: self.config.attention.num_heads)

    def _attention(self, hidden_dim: int, name: str, causal: bool | None = None) -> MultiHead:
        """Self-attention (`causal` True or False: the configuration as it is; T5's relative
        buckets one-directional when causal) or cross-attention (`causal=None`:
        `AttentionConfig.for_cross_attention`)."""
        attention = self.attention
        position = None
        if causal is None:
            attention = attention.for_cross_attention()
        elif attention.position_encoding == "relative":  # a causal query sees no later key
            position = RelativePositionBias(bidirectional=not causal, name="position_encoding",
                                            dtype=self.dtype_policy)
        kwargs = {} if position is None else {"position_encoding": position}
        return MultiHead(
            num_heads=attention.num_heads,
            key_dim=head_dim(hidden_dim, attention),
            dropout=self.dropout,
            kernel_initializer=sublayer_initializer(self.kernel_initializer, name),
            seed=self.seed,
            attention=attention.replace(position_encoding=None) if position else attention,
            output_shape=hidden_dim,
            name=name,
            dtype=self.dtype_policy,
            **kwargs,
        )

    def _build_attention(self, attention: MultiHead, *shapes) -> None:
        attention.build(*shapes)
        # A position layer without weights is never called as a layer: build it, so that
        # `model.quantize` (which refuses unbuilt layers) passes over it.
        position = attention.position_encoding
        if position is not None and not position.built:
            position.build(None)

    def _ffn(self, hidden_dim: int, input_shape) -> FFN:
        ffn = FFN(
            intermediate_dim=self.intermediate_dim,
            output_dim=hidden_dim,
            activation=self.activation,
            dropout=self.dropout,
            kernel_initializer=sublayer_initializer(self.kernel_initializer, "ffn"),
            seed=self.seed,
            use_bias=self.use_bias,
            name="ffn",
            dtype=self.dtype_policy,
        )
        ffn.build(input_shape)
        return ffn

    def _norm(self, name: str, input_shape):
        """Post-norm: an `AddNorm` applied after the sublayer. Pre-norm: a norm applied before
        it (the residual add then uses `residual_dropout`)."""
        if self.normalize_first:
            norm = make_norm(self.norm, self.layer_norm_epsilon, f"{name}_norm",
                             self.dtype_policy)
            norm.build(input_shape)
        else:
            norm = AddNorm(
                dropout=self.dropout,
                epsilon=self.layer_norm_epsilon,
                seed=self.seed,
                norm=self.norm,
                name=f"{name}_add_norm",
                dtype=self.dtype_policy,
            )
            norm.build(input_shape, input_shape)
        return norm

    def _build_residual_dropout(self) -> None:
        self.residual_dropout = None
        if self.normalize_first:
            self.residual_dropout = Dropout(
                self.dropout, seed=self.seed, name="residual_dropout", dtype=self.dtype_policy
            )

    def _before(self, norm, x):
        """The sublayer input: norm(x) in pre-norm, x in post-norm."""
        return norm(x) if self.normalize_first else x

    def _after(self, norm, x, y, training):
        """The residual: x + Dropout(y) in pre-norm, norm(x + Dropout(y)) in post-norm."""
        if self.normalize_first:
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
        block = self.config.get_config()
        config.update(block)
        config.update({
            "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            "seed": self.seed,
            "dtype": self.dtype_config(),
        })
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        renamed, fields = legacy.take(config, cls.__name__, warn=False)  # earlier releases
        if not isinstance(config.get("use_bias", True), bool):  # names of the parts
            fields["use_bias"], config["use_bias"] = legacy.split_use_bias(config["use_bias"])
        if renamed.pop("gated_ffn", False):
            renamed["activation"] = gated_name(renamed.get("activation",
                                                           config.get("activation", "relu")))
        config.update(renamed)
        if fields:
            config["attention"] = AttentionConfig.merge(config.get("attention"), **fields)
        return cls(**config)


BLOCK_ARGS_DOC = """        attention: a `keras_attn.layers.AttentionConfig` (heads, key/value heads, head
            size,
            projection biases, positions, kernel, window, soft-cap), its config, or the number
            of heads (an int). The self-attention takes it as it is; a decoder's
            cross-attention without positions or window (`for_cross_attention`); T5's
            `"relative"` buckets are one-directional when causal.
        intermediate_dim: int, hidden size of the feed-forward network.
        dropout: float in [0, 1), dropout on the attention weights, the FFN hidden layer and
            each residual branch. Defaults to `0.0`.
        normalize_first: bool, pre-norm instead of post-norm. Defaults to `{normalize_first}`.
        activation: activation of the FFN hidden layer: a Keras one, `"gelu_tanh"`, or a
            gated one, `act(x W_g) ⊙ (x W_1)`: `"swiglu"`, `"geglu"`, `"geglu_tanh"`,
            `"reglu"`. Defaults to `"relu"`.
        layer_norm_epsilon: float, the norms' epsilon. Defaults to `1e-5`.
        norm: `"layer"` or `"rms"` (`keras.layers.RMSNormalization`). Defaults to `"layer"`.
        use_bias: bool, biases in the FFN's projections (the attention's are
            `attention.use_bias`). Defaults to `True`.
        kernel_initializer: initializer of the dense kernels; each sublayer gets its own
            (`keras_attn.layers.initializers`). Defaults to `"glorot_uniform"`.
        seed: optional int seed for the dropouts. Defaults to `None`.

        The names of keras_attn 0.2 (`num_heads`, `ffn_dim`, `norm_first`, `epsilon`,
        `gated_ffn` and the attention's fields as arguments) still work, with a DeprecationWarning
        (`keras_attn.layers.legacy`)."""


def document_block(normalize_first: bool):
    """A class decorator: the block's docstring gets the shared `Args:` (its `{args}`)."""

    def decorate(cls):
        cls.__doc__ = cls.__doc__.format(args=BLOCK_ARGS_DOC.format(
            normalize_first=normalize_first))
        return cls

    return decorate
