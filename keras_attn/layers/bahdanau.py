"""The step of the Bahdanau attention decoder: additive attention with the previous decoder
state as the query, then stacked GRU cells (`BahdanauCell`). The encoder and decoder stacks are
`keras_attn.models.BahdanauEncoder` / `BahdanauDecoder`.

The fixed context variable c of the plain encoder-decoder is replaced, at every decoding step
t', by c_{t'} = Σ_t α(s_{t'-1}, h_t) h_t: additive attention with the previous decoder state
s_{t'-1} as the query and the encoder states h_t as keys and values.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_attn import ops as attn_ops
from keras_attn.layers.additive_attention import AdditiveAttention
from keras_attn.layers.base import check_positive_int, check_rate
from keras_attn.layers.dropout import Dropout


class GRUFields:
    """The constructor fields every Bahdanau piece keeps (the cell here, the encoder and decoder
    in `keras_attn.models.bahdanau`): `units` of the GRU states, `num_layers` stacked GRUs,
    `dropout` between them and its `seed`, and any further sizes (`vocabulary_size`,
    `embedding_dim`),
    each checked, set as an attribute of that name, and written back by `gru_fields()`."""

    def set_gru_fields(self, units: int, num_layers: int, dropout: float, seed: int | None,
                       **sizes: int) -> None:
        for name, value in (*sizes.items(), ("units", units), ("num_layers", num_layers)):
            check_positive_int(name, value)
        check_rate("dropout", dropout)
        fields = {**sizes, "units": units, "num_layers": num_layers, "dropout": dropout,
                  "seed": seed}
        for name, value in fields.items():
            setattr(self, name, value)
        self.gru_field_names = tuple(fields)

    def gru_fields(self) -> dict:
        """The fields by name, for `get_config`."""
        return {name: getattr(self, name) for name in self.gru_field_names}


@keras.saving.register_keras_serializable(package="keras_attn")
class BahdanauCell(GRUFields, keras.layers.Layer):
    """One step of the Bahdanau decoder, as a cell for `keras.layers.RNN`.

    With y_{t'-1} the embedded previous token, s_{t'-1} the previous state of the last GRU
    layer and h_t the encoder states:

        α_{t'} = softmax_t(w_vᵀ tanh(W_q s_{t'-1} + W_k h_t))   (source padding masked)
        c_{t'} = Σ_t α_{t', t} h_t
        s_{t'} = GRU([c_{t'}; y_{t'-1}], s_{t'-1})   (stacked GRU cells)

    `AdditiveAttention` (sublayer `attention`) holds W_q, W_k and w_v. The encoder memory rides
    along as constant extra states, so the cell holds no tensors and serializes by config: the
    state list is `[s^(1), ..., s^(num_layers), h, W_k h, source_mask]` (see `initial_state`);
    W_k h is computed once per sequence, not once per step.

    Args:
        units: int, size of the GRU states, of the encoder states and of the attention.
        num_layers: int, number of stacked GRU cells. Defaults to `1`.
        dropout: float in [0, 1), dropout between GRU cells; the decoder draws one mask per
            sequence (see `draw_dropout_masks`). Defaults to `0.0`.
        seed: optional int seed for the dropout. Defaults to `None`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Call arguments:
        inputs: `(B, input_dim)`, the embedded previous token y_{t'-1}.
        states: the state list above.
        training: bool, whether dropout is active.

    Returns:
        `(output, states)`: s_{t'} of the last layer `(B, units)` and the next state list.

    Example:
    >>> source = keras.ops.array([[4, 5, 0]])
    >>> encoder_outputs = BahdanauEncoder(vocabulary_size=10, embedding_dim=8, units=16)(source)
    >>> cell = BahdanauCell(units=16)
    >>> cell.build((None, 8))  # inputs: 8-dim embedded target tokens
    >>> states = cell.initial_state(encoder_outputs, source_mask=source != 0)
    >>> rnn = keras.layers.RNN(cell, return_sequences=True)
    >>> outputs = rnn(keras.ops.ones((1, 2, 8)), initial_state=states)  # (1, 2, 16)

    References:
        Bahdanau et al., 2015, "Neural Machine Translation by Jointly Learning to Align and
        Translate", https://arxiv.org/abs/1409.0473
    """

    def __init__(
        self,
        units: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        seed: int | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.set_gru_fields(units, num_layers, dropout, seed)
        # For keras.layers.RNN: the GRU states, then the memory (h, W_k h, mask) per sequence.
        self.state_size = [units] * num_layers + [(None, units), (None, units), (None,)]
        self.output_size = units
        policy = self.dtype_policy
        self.attention = AdditiveAttention(units, name="attention", dtype=policy)
        self.grus = [
            keras.layers.GRUCell(units, name=f"gru_cell_{i}", dtype=policy)
            for i in range(num_layers)
        ]
        self.dropout_layer = Dropout(dropout, seed=seed, name="dropout", dtype=policy)
        self._dropout_masks = None

    def draw_dropout_masks(self, batch_size) -> None:
        """Draw the masks between GRU cells for the next sequence (`reset_dropout_masks` ends it).

        Inside a loop a backend compiles (`keras.layers.RNN` on JAX runs a `lax.scan`), a
        random draw per step would change the seed generator's state from inside the loop, which
        JAX forbids; like Keras' own GRU dropout, the decoder therefore draws one mask per
        sequence before the loop (variational dropout, Gal and Ghahramani, 2016). Without drawn
        masks each step draws its own, which works on TensorFlow and torch only.
        """
        if self.dropout > 0 and self.num_layers > 1:
            ones = ops.ones((batch_size, self.units), self.compute_dtype)
            self._dropout_masks = [
                self.dropout_layer(ones, training=True) for _ in range(self.num_layers - 1)
            ]

    def reset_dropout_masks(self) -> None:
        self._dropout_masks = None

    def build(self, inputs_shape):
        batch_size = inputs_shape[0]
        memory_shape = (batch_size, None, self.units)
        self.attention.build((batch_size, 1, self.units), memory_shape, memory_shape)
        for i, gru in enumerate(self.grus):
            gru.build((batch_size, self.units + inputs_shape[-1] if i == 0 else self.units))

    def initial_state(self, encoder_outputs, source_mask=None) -> list:
        """`[s^(1), ..., s^(L), h, W_k h, source_mask]` from the encoder's `(outputs, states)`."""
        values, states = encoder_outputs  # (B, S, units), L x (B, units)
        values = ops.cast(values, self.compute_dtype)
        if source_mask is None:
            source_mask = ops.ones(ops.shape(values)[:2], dtype="bool")  # (B, S)
        states = [ops.cast(s, self.compute_dtype) for s in states]
        return [*states, values, self.attention.key_dense(values), source_mask]

    def step(self, y_prev, states, training=None):
        """One step t'; returns `(s_{t'}, next states, α_{t'} (B, S))`."""
        *states, values, keys, source_mask = states
        # α(s_{t'-1}, h_t): AdditiveAttention's scoring, with W_k h_t computed beforehand.
        scores = self.attention.scores(ops.expand_dims(states[-1], 1), keys)[:, 0]  # (B, S)
        mask = ops.cast(source_mask, "bool")  # keras.layers.RNN casts states to floats
        alpha = ops.cast(attn_ops.masked_softmax(scores, mask=mask), values.dtype)  # (B, S)
        context = ops.einsum("bs,bsu->bu", alpha, values)  # c_{t'} = Σ_t α_t h_t: (B, units)
        x = ops.concatenate([context, y_prev], axis=-1)  # [c_{t'}; y_{t'-1}]
        new_states = []
        for i, gru in enumerate(self.grus):
            if i > 0 and training and self.dropout > 0:
                masks = self._dropout_masks
                x = self.dropout_layer(x, training=True) if masks is None else x * masks[i - 1]
            x, _ = gru(x, states[i], training=training)  # s_{t'} of layer i: (B, units)
            new_states.append(x)
        return x, [*new_states, values, keys, source_mask], alpha

    def call(self, inputs, states, training=None):
        output, states, _ = self.step(inputs, list(states), training=training)
        return output, states

    def get_config(self):
        config = super().get_config()
        config.update(self.gru_fields())
        return config
