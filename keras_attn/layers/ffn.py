"""Position-wise feed-forward networks: plain, or gated (SwiGLU, GEGLU)."""

from __future__ import annotations

import keras

from keras_attn._checks import as_int, check_bool, check_rate, warn_deprecated
from keras_attn.layers.activations import GATED, get_activation, serialize_activation
from keras_attn.layers.dropout import Dropout
from keras_attn.layers.initializers import sublayer_initializer
from keras_attn.layers.quantization import QuantizedSublayers


@keras.saving.register_keras_serializable(package="keras_attn")
class FFN(QuantizedSublayers, keras.layers.Layer):
    """Position-wise feed-forward network: `act(x W₁) W₂`, or gated: `(act(x W_g) ⊙ x W₁) W₂`.

    The same MLP is applied to every position independently, with dropout on the hidden layer.
    The gated form (Shazeer, 2020) is SwiGLU with `activation="swiglu"` (Swish/SiLU gate),
    GEGLU with `"geglu"` (GELU gate), `"geglu_tanh"` (tanh GELU gate), `"reglu"` (ReLU gate), or
    any activation with `gated=True`.

    Args:
        intermediate_dim: int, size of the hidden layer (`hidden_dim` in keras_attn 0.2).
        output_dim: int, size of the output. Defaults to the input's last dimension.
        activation: activation of the hidden layer (of the gate when gated), `"gelu_tanh"`, or
            a gated name (`keras_attn.layers.activations.GATED`). Defaults to `"relu"`.
        dropout: float in [0, 1), dropout on the hidden activations. Defaults to `0.0`.
        kernel_initializer: initializer of the kernels, each drawing from its own copy
            (`sublayer_initializer`). Defaults to `"glorot_uniform"`.
        seed: optional int seed for the dropout. Defaults to `None`.
        gated: bool, the gated form (`gate_dense`, `hidden_dense`, `output_dense`).
            Defaults to `False` (`True` with `"swiglu"` / `"geglu"`).
        use_bias: bool, whether the dense layers have biases. Defaults to `True`.

    Call arguments:
        inputs: `(B, T, d)`.
        training: bool, whether dropout is active.

    Returns:
        `(B, T, output_dim)`. A Keras implicit mask passes through.

    Example:
    >>> FFN(intermediate_dim=4, output_dim=8)(keras.ops.ones((2, 3, 4))).shape  # (2, 3, 8)
    >>> FFN(16, activation="swiglu")(keras.ops.ones((2, 3, 4))).shape  # (2, 3, 4)

    References:
        Shazeer, 2020, "GLU Variants Improve Transformer", https://arxiv.org/abs/2002.05202
    """

    def __init__(
        self,
        intermediate_dim: int | None = None,
        output_dim: int | None = None,
        activation="relu",
        dropout: float = 0.0,
        kernel_initializer="glorot_uniform",
        seed: int | None = None,
        gated: bool = False,
        use_bias: bool = True,
        **kwargs,
    ):
        if "hidden_dim" in kwargs:  # keras_attn 0.2's name
            if intermediate_dim is not None:
                raise ValueError("Arguments `hidden_dim` (deprecated) and `intermediate_dim` say "
                                 "the same thing; give `intermediate_dim` only.")
            intermediate_dim = kwargs.pop("hidden_dim")
            warn_deprecated("FFN: `hidden_dim` is `intermediate_dim` (hidden_dim is the "
                            "model's width everywhere else) (keras_attn 0.3 names, see "
                            "CHANGELOG.md).")
        super().__init__(**kwargs)
        intermediate_dim = as_int("intermediate_dim", intermediate_dim)
        output_dim = as_int("output_dim", output_dim, allow_none=True)
        check_rate("dropout", dropout)
        check_bool("gated", gated)
        check_bool("use_bias", use_bias)
        if isinstance(activation, str) and activation in GATED:
            activation, gated = GATED[activation], True
        self.activation = get_activation(activation, gated_names=False)
        self.gated = gated
        self.use_bias = use_bias
        self.intermediate_dim = intermediate_dim
        self.output_dim = output_dim
        self.dropout = dropout
        self.seed = seed
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.supports_masking = True
        self.dropout_layer = Dropout(dropout, seed=seed, name="dropout", dtype=self.dtype_policy)

    def build(self, input_shape):
        if input_shape[-1] is None:
            raise ValueError(
                "Argument `inputs` must have a known last dimension. "
                f"Received: inputs.shape={tuple(input_shape)}"
            )

        def dense(units, name, activation=None):
            return keras.layers.Dense(
                units, activation=activation, use_bias=self.use_bias, name=name,
                kernel_initializer=sublayer_initializer(self.kernel_initializer, name),
                dtype=self.dtype_policy)

        if self.gated:
            self.gate_dense = dense(self.intermediate_dim, "gate_dense", self.activation)
            self.gate_dense.build(input_shape)
        self.hidden_dense = dense(self.intermediate_dim, "hidden_dense",
                                  None if self.gated else self.activation)
        self.output_dense = dense(self.output_dim or input_shape[-1], "output_dense")
        self.hidden_dense.build(input_shape)
        self.output_dense.build(tuple(input_shape[:-1]) + (self.intermediate_dim,))

    def call(self, inputs, training=None):
        hidden = self.hidden_dense(inputs)  # (B, T, h)
        if self.gated:
            hidden = self.gate_dense(inputs) * hidden  # act(x W_g) ⊙ x W₁
        hidden = self.dropout_layer(hidden, training=training)
        return self.output_dense(hidden)  # (B, T, output_dim)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim or input_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "intermediate_dim": self.intermediate_dim,
                "output_dim": self.output_dim,
                "activation": serialize_activation(self.activation),
                "dropout": self.dropout,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "seed": self.seed,
                "gated": self.gated,
                "use_bias": self.use_bias,
                "dtype": self.dtype_config(),
            }
        )
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        if "hidden_dim" in config:  # saved by keras_attn 0.2
            config["intermediate_dim"] = config.pop("hidden_dim")
        return cls(**config)
