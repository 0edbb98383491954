"""Dropout with the cheaper 16-bit mask of `keras_attn.ops.dropout`."""

from __future__ import annotations

import keras

from keras_attn import ops as attn_ops


@keras.saving.register_keras_serializable(package="keras_attn")
class Dropout(keras.layers.Dropout):
    """`keras.layers.Dropout` drawing its mask with `keras_attn.ops.dropout`.

    Same arguments, config and behaviour as the Keras layer; with TensorFlow as the backend the
    mask costs half the random numbers (16 bits per element), and the drop probability is
    `rate` rounded to a multiple of 2**-16. With a `noise_shape`, or `rate=1`, it defers to the
    Keras layer.

    Call arguments:
        inputs: tensor of any shape.
        training: bool, whether to drop. Defaults to `False`.

    Returns:
        Tensor with the shape and dtype of `inputs`.
    """

    def call(self, inputs, training=False):
        if training and 0 < self.rate < 1 and self.noise_shape is None:
            return attn_ops.dropout(inputs, self.rate, seed=self.seed_generator)
        return super().call(inputs, training=training)
