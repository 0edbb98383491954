"""Bahdanau attention seq2seq: a GRU encoder and a GRU decoder that attends at every step.

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
from keras_attn.tokens import PAD_ID


def _check_sizes(vocab_size, embed_dim, units, num_layers, dropout) -> None:
    for name, value in (
        ("vocab_size", vocab_size),
        ("embed_dim", embed_dim),
        ("units", units),
        ("num_layers", num_layers),
    ):
        check_positive_int(name, value)
    check_rate("dropout", dropout)


@keras.saving.register_keras_serializable(package="keras_attn")
class BahdanauEncoder(keras.layers.Layer):
    """GRU encoder: embedding (id 0 = padding, masked) → a stack of GRU layers.

    Padding is skipped by the GRUs, so the final state of a sequence is its state after its
    last real token.

    Args:
        vocab_size: int, size of the source vocabulary.
        embed_dim: int, size of the token embeddings.
        units: int, size of the GRU states.
        num_layers: int, number of stacked GRU layers. Defaults to `1`.
        dropout: float in [0, 1), dropout between GRU layers (as in `torch.nn.GRU`), so it has no
            effect with one layer. Defaults to `0.0`.
        seed: optional int seed for the dropout. Defaults to `None`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Call arguments:
        source_ids: int tensor `(B, S)`, 0 = padding.
        training: bool, whether dropout is active.

    Returns:
        `(outputs, states)`: `outputs` `(B, S, units)`, every state of the last layer; `states` a
        list of `num_layers` tensors `(B, units)`, the final state of every layer.

    Example:
    >>> encoder = BahdanauEncoder(vocab_size=10, embed_dim=8, units=16, num_layers=2)
    >>> outputs, states = encoder(keras.ops.array([[4, 5, 6, 0]]))  # (1, 4, 16), 2 x (1, 16)

    References:
        Bahdanau et al., 2015, "Neural Machine Translation by Jointly Learning to Align and
        Translate", https://arxiv.org/abs/1409.0473
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        units: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        seed: int | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        _check_sizes(vocab_size, embed_dim, units, num_layers, dropout)
        self.vocab_size = vocab_size
        self.embed_dim = embed_dim
        self.units = units
        self.num_layers = num_layers
        self.dropout = dropout
        self.seed = seed
        self.embedding = keras.layers.Embedding(
            vocab_size, embed_dim, mask_zero=True, name="embedding", dtype=self.dtype_policy
        )
        self.grus = [
            keras.layers.GRU(
                units, return_sequences=True, return_state=True, name=f"gru_{i}",
                dtype=self.dtype_policy,
            )
            for i in range(num_layers)
        ]
        self.dropout_layer = Dropout(dropout, seed=seed, name="dropout", dtype=self.dtype_policy)

    def build(self, source_ids_shape):
        if len(source_ids_shape) != 2:
            raise ValueError(
                "Argument `source_ids` must have shape (batch_size, source_len). "
                f"Received: source_ids.shape={tuple(source_ids_shape)}"
            )
        self.embedding.build(source_ids_shape)
        for i, gru in enumerate(self.grus):
            gru.build(tuple(source_ids_shape) + (self.embed_dim if i == 0 else self.units,))

    def call(self, source_ids, training=None):
        mask = ops.not_equal(source_ids, PAD_ID)  # (B, S)
        x = self.embedding(source_ids)  # (B, S, embed_dim)
        states = []
        for i, gru in enumerate(self.grus):
            if i > 0:
                x = self.dropout_layer(x, training=training)
            x, state = gru(x, mask=mask, training=training)  # (B, S, units), (B, units)
            states.append(state)
        return x, states

    def compute_output_shape(self, source_ids_shape):
        batch_size = source_ids_shape[0]
        outputs_shape = (batch_size, source_ids_shape[1], self.units)
        return outputs_shape, [(batch_size, self.units)] * self.num_layers

    def compute_mask(self, source_ids, mask=None):
        return None

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocab_size": self.vocab_size,
                "embed_dim": self.embed_dim,
                "units": self.units,
                "num_layers": self.num_layers,
                "dropout": self.dropout,
                "seed": self.seed,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
class BahdanauCell(keras.layers.Layer):
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
    >>> encoder_outputs = BahdanauEncoder(vocab_size=10, embed_dim=8, units=16)(source)
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
        check_positive_int("units", units)
        check_positive_int("num_layers", num_layers)
        check_rate("dropout", dropout)
        self.units = units
        self.num_layers = num_layers
        self.dropout = dropout
        self.seed = seed
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
        config.update(
            {
                "units": self.units,
                "num_layers": self.num_layers,
                "dropout": self.dropout,
                "seed": self.seed,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
class BahdanauDecoder(keras.layers.Layer):
    """GRU decoder with additive attention over the encoder states at every step.

    embedding → `keras.layers.RNN(BahdanauCell)` → dense. The decoder's initial states are the
    encoder's final states; at step t' the query is s_{t'-1} (last GRU layer), keys and values
    are the encoder states, and [c_{t'}; embedding(y_{t'-1})] feeds the GRU cells (see
    `BahdanauCell`). Training runs every step with teacher forcing in one graph loop.
    `init_decode_state` and `decode_step` run one step at a time for `keras_attn.decoding`.

    Args:
        vocab_size: int, size of the target vocabulary.
        embed_dim: int, size of the token embeddings.
        units: int, size of the GRU states and of the attention; must equal the encoder's.
        num_layers: int, number of stacked GRU cells; must equal the encoder's. Defaults to `1`.
        dropout: float in [0, 1), dropout between GRU cells, one mask per sequence (variational,
            as Keras' GRU `dropout`). Defaults to `0.0`.
        seed: optional int seed for the dropout. Defaults to `None`.
        **kwargs: base layer keyword arguments (`name`, `dtype`, ...).

    Call arguments:
        target_ids: int tensor `(B, T)`, the decoder inputs (`<bos>` then the target shifted).
        encoder_outputs: `(outputs, states)` from `BahdanauEncoder`: `(B, S, units)` and a list
            of `num_layers` tensors `(B, units)`.
        source_mask: optional boolean `(B, S)`, True = real source token. Defaults to `None`
            (attend everywhere).
        return_attention_scores: bool, also return the attention weights. Defaults to `False`.
        training: bool, whether dropout is active.

    Returns:
        float32 logits `(B, T, vocab_size)`; with `return_attention_scores=True`, also the
        weights `(B, T, S)` (row t' is α_{t'}; zero on masked source positions).

    Example:
    >>> encoder, decoder = BahdanauEncoder(10, 8, 16), BahdanauDecoder(12, 8, 16)
    >>> source = keras.ops.array([[4, 5, 0]])
    >>> logits, weights = decoder(keras.ops.array([[2, 7]]), encoder(source),
    ...                           source_mask=source != 0, return_attention_scores=True)
    >>> # logits (1, 2, 12), weights (1, 2, 3)

    References:
        Bahdanau et al., 2015, "Neural Machine Translation by Jointly Learning to Align and
        Translate", https://arxiv.org/abs/1409.0473
    """

    def __init__(
        self,
        vocab_size: int,
        embed_dim: int,
        units: int,
        num_layers: int = 1,
        dropout: float = 0.0,
        seed: int | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        _check_sizes(vocab_size, embed_dim, units, num_layers, dropout)
        self.vocab_size = vocab_size
        self.embed_dim = embed_dim
        self.units = units
        self.num_layers = num_layers
        self.dropout = dropout
        self.seed = seed
        policy = self.dtype_policy
        self.embedding = keras.layers.Embedding(
            vocab_size, embed_dim, name="embedding", dtype=policy
        )
        cell = BahdanauCell(units, num_layers, dropout, seed, name="cell", dtype=policy)
        self.rnn = keras.layers.RNN(cell, return_sequences=True, name="rnn", dtype=policy)
        # The vocabulary projection runs in the compute dtype and its logits are cast to
        # float32 (the Keras mixed-precision guide's advice: a mixed Dense, a float32 softmax).
        self.output_dense = keras.layers.Dense(vocab_size, name="output_dense", dtype=policy)

    @property
    def cell(self) -> BahdanauCell:
        return self.rnn.cell

    def build(self, target_ids_shape, encoder_outputs_shape, source_mask_shape=None):
        outputs_shape, states_shape = encoder_outputs_shape
        if len(outputs_shape) != 3 or outputs_shape[-1] != self.units:
            raise ValueError(
                f"Argument `encoder_outputs` must hold outputs of shape (batch_size, source_len, "
                f"units={self.units}). Received: encoder_outputs[0].shape={tuple(outputs_shape)}"
            )
        states_shape = [tuple(s) for s in states_shape]
        if len(states_shape) != self.num_layers or any(s[-1] != self.units for s in states_shape):
            raise ValueError(
                f"Argument `encoder_outputs` must hold {self.num_layers} final state(s) of shape "
                f"(batch_size, units={self.units}), one per decoder layer. Received: "
                f"encoder_outputs[1] shapes={states_shape}"
            )
        self.embedding.build(target_ids_shape)
        self.rnn.build(tuple(target_ids_shape) + (self.embed_dim,))
        self.output_dense.build((target_ids_shape[0], self.units))

    def call(
        self,
        target_ids,
        encoder_outputs,
        source_mask=None,
        return_attention_scores=False,
        training=None,
    ):
        initial_state = self.cell.initial_state(encoder_outputs, source_mask)
        embedded = self.embedding(target_ids)  # (B, T, embed_dim)
        if training:
            self.cell.draw_dropout_masks(ops.shape(target_ids)[0])
        try:
            outputs = self.rnn(embedded, initial_state=initial_state, training=training)  # (B,T,u)
        finally:
            self.cell.reset_dropout_masks()
        logits = ops.cast(self.output_dense(outputs), "float32")  # (B, T, vocab_size)
        if not return_attention_scores:
            return logits
        # α_{t'} depends on s_{t'-1} only: score the states s_0..s_{T-1} in one batched call.
        queries = ops.concatenate(
            [ops.expand_dims(initial_state[self.num_layers - 1], 1), outputs[:, :-1]], axis=1
        )  # (B, T, units)
        values, mask = initial_state[-3], ops.cast(initial_state[-1], "bool")
        _, weights = self.cell.attention(
            queries, values, values, key_mask=mask, return_attention_scores=True
        )  # (B, T, S)
        return logits, weights

    def init_decode_state(self, encoder_outputs, source_ids, max_length=None) -> dict:
        """The decoding state of `keras_attn.decoding`: every tensor has batch on axis 0.

        Args:
            encoder_outputs: `(outputs, states)` from `BahdanauEncoder`.
            source_ids: int tensor `(B, S)`, 0 = padding.
            max_length: unused (the state does not grow with the output). Defaults to `None`.

        Returns:
            `{"cell_states": (s^(1), ..., s^(L), h, W_k h, source_mask)}`, see `BahdanauCell`.
        """
        source_mask = ops.not_equal(source_ids, PAD_ID)  # (B, S)
        return {"cell_states": tuple(self.cell.initial_state(encoder_outputs, source_mask))}

    def decode_step(self, token_ids, index, state):
        """One step of greedy or beam search.

        Args:
            token_ids: int `(B,)`, the previous token.
            index: scalar int, its position in the target (unused: the GRU state knows it).
            state: dict from `init_decode_state` or the previous step.

        Returns:
            `(logits, state, weights)`: float32 logits `(B, vocab_size)`, the next state, and
            this step's attention weights `(B, S)`.
        """
        y_prev = self.embedding(token_ids)  # (B, embed_dim)
        output, states, weights = self.cell.step(y_prev, list(state["cell_states"]))
        logits = ops.cast(self.output_dense(output), "float32")  # (B, vocab_size)
        return logits, {"cell_states": tuple(states)}, weights

    def compute_output_shape(self, target_ids_shape, encoder_outputs_shape, source_mask_shape=None):
        return tuple(target_ids_shape) + (self.vocab_size,)

    def compute_output_spec(
        self,
        target_ids,
        encoder_outputs,
        source_mask=None,
        return_attention_scores=False,
        training=None,
    ):
        logits = keras.KerasTensor(tuple(target_ids.shape) + (self.vocab_size,), dtype="float32")
        if not return_attention_scores:
            return logits
        weights_shape = tuple(target_ids.shape) + (encoder_outputs[0].shape[1],)
        return logits, keras.KerasTensor(weights_shape, dtype=self.compute_dtype)

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "vocab_size": self.vocab_size,
                "embed_dim": self.embed_dim,
                "units": self.units,
                "num_layers": self.num_layers,
                "dropout": self.dropout,
                "seed": self.seed,
            }
        )
        return config
