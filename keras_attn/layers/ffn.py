"""Position-wise feed-forward network."""

from __future__ import annotations

import keras

from keras_attn.layers.base import check_positive_int, check_rate
from keras_attn.layers.dropout import Dropout


@keras.saving.register_keras_serializable(package="keras_attn")
class FFN(keras.layers.Layer):
    """Position-wise feed-forward network: dense → activation → dropout → dense.

    The same two-layer MLP is applied to every position independently.

    Args:
        hidden_dim: int, size of the hidden layer.
        output_dim: int, size of the output. Defaults to the input's last dimension.
        activation: activation of the hidden layer. Defaults to `"relu"`.
        dropout: float in [0, 1), dropout on the hidden activations. Defaults to `0.0`.
        kernel_initializer: initializer of both kernels. Defaults to `"glorot_uniform"`.
        seed: optional int seed for the dropout. Defaults to `None`.

    Call arguments:
        inputs: `(B, T, d)`.
        training: bool, whether dropout is active.

    Returns:
        `(B, T, output_dim)`. A Keras implicit mask passes through.

    Example:
    >>> FFN(hidden_dim=4, output_dim=8)(keras.ops.ones((2, 3, 4))).shape  # (2, 3, 8)
    """

    def __init__(
        self,
        hidden_dim: int,
        output_dim: int | None = None,
        activation="relu",
        dropout: float = 0.0,
        kernel_initializer="glorot_uniform",
        seed: int | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("hidden_dim", hidden_dim)
        check_positive_int("output_dim", output_dim, allow_none=True)
        check_rate("dropout", dropout)
        try:
            self.activation = keras.activations.get(activation)
        except ValueError as error:
            raise ValueError(
                f"Received an invalid value for argument `activation`. "
                f"Received: activation={activation!r}"
            ) from error
        self.hidden_dim = hidden_dim
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
        self.hidden_dense = keras.layers.Dense(
            self.hidden_dim,
            activation=self.activation,
            kernel_initializer=self.kernel_initializer,
            name="hidden_dense",
            dtype=self.dtype_policy,
        )
        self.output_dense = keras.layers.Dense(
            self.output_dim or input_shape[-1],
            kernel_initializer=self.kernel_initializer,
            name="output_dense",
            dtype=self.dtype_policy,
        )
        self.hidden_dense.build(input_shape)
        self.output_dense.build(tuple(input_shape[:-1]) + (self.hidden_dim,))

    def call(self, inputs, training=None):
        hidden = self.dropout_layer(self.hidden_dense(inputs), training=training)  # (B, T, h)
        return self.output_dense(hidden)  # (B, T, output_dim)

    def compute_output_shape(self, input_shape):
        return tuple(input_shape[:-1]) + (self.output_dim or input_shape[-1],)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "hidden_dim": self.hidden_dim,
                "output_dim": self.output_dim,
                "activation": keras.activations.serialize(self.activation),
                "dropout": self.dropout,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
                "seed": self.seed,
            }
        )
        return config
