"""Bahdanau attention seq2seq: a GRU encoder and a GRU decoder that attends at every step
(`keras_attn.layers.BahdanauCell`), and the functional model builder.

The fixed context variable c of the plain encoder-decoder is replaced, at every decoding step
t', by c_{t'} = Σ_t α(s_{t'-1}, h_t) h_t: additive attention with the previous decoder state
s_{t'-1} as the query and the encoder states h_t as keys and values.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_attn._checks import renamed_argument
from keras_attn.layers import legacy
from keras_attn.layers.bahdanau import BahdanauCell, GRUFields
from keras_attn.layers.base import check_positive_int
from keras_attn.layers.dropout import Dropout
from keras_attn.layers.quantization import QuantizedSublayers
from keras_attn.tokens import PAD_ID

# keras_attn 0.2's names.
_RENAMED = {"vocab_size": "vocabulary_size", "embed_dim": "embedding_dim"}


class _BahdanauStack(GRUFields, QuantizedSublayers, keras.layers.Layer):
    """The constructor and config the encoder and the decoder share (their class docstrings
    give the arguments); each makes its sublayers in `make_sublayers`."""

    @legacy.records_given
    def __init__(
        self,
        vocabulary_size: int | None = None,
        embedding_dim: int | None = None,
        units: int | None = None,
        num_layers: int = 1,
        dropout: float = 0.0,
        seed: int | None = None,
        **kwargs,
    ):
        renamed = legacy.rename(kwargs, type(self).__name__, _RENAMED,
                                warn=not kwargs.pop("_loading", False), said=legacy.said(
                                    _BahdanauStack.__init__, vocabulary_size=vocabulary_size,
                                    embedding_dim=embedding_dim))
        vocabulary_size = renamed.get("vocabulary_size", vocabulary_size)
        embedding_dim = renamed.get("embedding_dim", embedding_dim)
        super().__init__(**kwargs)
        self.set_gru_fields(units, num_layers, dropout, seed, vocabulary_size=vocabulary_size,
                            embedding_dim=embedding_dim)
        self.make_sublayers()

    @classmethod
    def from_config(cls, config):
        return cls(**config, _loading=True)  # keras_attn 0.2's names load without a warning

    def make_sublayers(self) -> None:
        raise NotImplementedError

    def get_config(self):
        config = super().get_config()
        config.update({**self.gru_fields(), "dtype": self.dtype_config()})
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
class BahdanauEncoder(_BahdanauStack):
    """GRU encoder: embedding (id 0 = padding, masked) → a stack of GRU layers.

    Padding is skipped by the GRUs, so the final state of a sequence is its state after its
    last real token.

    Args:
        vocabulary_size: int, size of the source vocabulary.
        embedding_dim: int, size of the token embeddings.
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
    >>> encoder = BahdanauEncoder(vocabulary_size=10, embedding_dim=8, units=16, num_layers=2)
    >>> outputs, states = encoder(keras.ops.array([[4, 5, 6, 0]]))  # (1, 4, 16), 2 x (1, 16)

    References:
        Bahdanau et al., 2015, "Neural Machine Translation by Jointly Learning to Align and
        Translate", https://arxiv.org/abs/1409.0473
    """

    def make_sublayers(self) -> None:
        self.embedding = keras.layers.Embedding(
            self.vocabulary_size, self.embedding_dim, mask_zero=True, name="embedding",
            dtype=self.dtype_policy)
        self.grus = [
            keras.layers.GRU(
                self.units, return_sequences=True, return_state=True, name=f"gru_{i}",
                dtype=self.dtype_policy,
            )
            for i in range(self.num_layers)
        ]
        self.dropout_layer = Dropout(self.dropout, seed=self.seed, name="dropout",
                                     dtype=self.dtype_policy)

    def build(self, source_ids_shape):
        if len(source_ids_shape) != 2:
            raise ValueError(
                "Argument `source_ids` must have shape (batch_size, source_len). "
                f"Received: source_ids.shape={tuple(source_ids_shape)}"
            )
        self.embedding.build(source_ids_shape)
        for i, gru in enumerate(self.grus):
            gru.build(tuple(source_ids_shape) + (self.embedding_dim if i == 0 else self.units,))

    def call(self, source_ids, training=None):
        mask = ops.not_equal(source_ids, PAD_ID)  # (B, S)
        x = self.embedding(source_ids)  # (B, S, embedding_dim)
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


@keras.saving.register_keras_serializable(package="keras_attn")
class BahdanauDecoder(_BahdanauStack):
    """GRU decoder with additive attention over the encoder states at every step.

    embedding → `keras.layers.RNN(BahdanauCell)` → dense. The decoder's initial states are the
    encoder's final states; at step t' the query is s_{t'-1} (last GRU layer), keys and values
    are the encoder states, and [c_{t'}; embedding(y_{t'-1})] feeds the GRU cells (see
    `BahdanauCell`). Training runs every step with teacher forcing in one graph loop.
    `init_decode_state` and `decode_step` run one step at a time for `keras_attn.decoding`.

    Args:
        vocabulary_size: int, size of the target vocabulary.
        embedding_dim: int, size of the token embeddings.
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
        float32 logits `(B, T, vocabulary_size)`; with `return_attention_scores=True`, also the
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

    def make_sublayers(self) -> None:
        policy = self.dtype_policy
        self.embedding = keras.layers.Embedding(
            self.vocabulary_size, self.embedding_dim, name="embedding", dtype=policy
        )
        cell = BahdanauCell(self.units, self.num_layers, self.dropout, self.seed, name="cell",
                            dtype=policy)
        self.rnn = keras.layers.RNN(cell, return_sequences=True, name="rnn", dtype=policy)
        # The vocabulary projection runs in the compute dtype and its logits are cast to
        # float32 (the Keras mixed-precision guide's advice: a mixed Dense, a float32 softmax).
        self.output_dense = keras.layers.Dense(self.vocabulary_size, name="output_dense",
                                               dtype=policy)

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
        self.rnn.build(tuple(target_ids_shape) + (self.embedding_dim,))
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
        embedded = self.embedding(target_ids)  # (B, T, embedding_dim)
        if training:
            self.cell.draw_dropout_masks(ops.shape(target_ids)[0])
        try:
            outputs = self.rnn(embedded, initial_state=initial_state, training=training)  # (B,T,u)
        finally:
            self.cell.reset_dropout_masks()
        logits = ops.cast(self.output_dense(outputs), "float32")  # (B, T, vocabulary_size)
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

    def decode_step(self, token_ids, index, state, return_attention_scores: bool = False,
                    **kwargs):
        """One step of greedy or beam search.

        Args:
            token_ids: int `(B,)`, the previous token.
            index: scalar int, its position in the target (unused: the GRU state knows it).
            state: dict from `init_decode_state` or the previous step.
            return_attention_scores: bool, also return this step's weights (for heatmaps;
                keras_attn 0.2's `return_attention` still works, deprecated). Defaults to
                `False`.

        Returns:
            `(logits, state, weights)`: float32 logits `(B, vocabulary_size)`, the next state, and
            this step's attention weights `(B, S)` (None unless asked).
        """
        return_attention = renamed_argument("BahdanauDecoder.decode_step", kwargs,
                                            "return_attention", "return_attention_scores",
                                            return_attention_scores, False)
        y_prev = self.embedding(token_ids)  # (B, embedding_dim)
        output, states, weights = self.cell.step(y_prev, list(state["cell_states"]))
        logits = ops.cast(self.output_dense(output), "float32")  # (B, vocabulary_size)
        return logits, {"cell_states": tuple(states)}, weights if return_attention else None

    def compute_output_shape(self, target_ids_shape, encoder_outputs_shape, source_mask_shape=None):
        return tuple(target_ids_shape) + (self.vocabulary_size,)

    def compute_output_spec(
        self,
        target_ids,
        encoder_outputs,
        source_mask=None,
        return_attention_scores=False,
        training=None,
    ):
        logits = keras.KerasTensor(tuple(target_ids.shape) + (self.vocabulary_size,),
                                   dtype="float32")
        if not return_attention_scores:
            return logits
        weights_shape = tuple(target_ids.shape) + (encoder_outputs[0].shape[1],)
        return logits, keras.KerasTensor(weights_shape, dtype=self.compute_dtype)




@legacy.records_given
def bahdanau_seq2seq(
    source_vocabulary_size: int | None = None,
    target_vocabulary_size: int | None = None,
    embedding_dim: int = 256,
    units: int = 256,
    num_layers: int = 2,
    dropout: float = 0.2,
    seed: int | None = None,
    name: str = "bahdanau_seq2seq",
    **kwargs,
) -> keras.Model:
    """GRU encoder-decoder with Bahdanau (additive) attention, trained with teacher forcing.

    The defaults are d2l's (section 11.4). Greedy and beam search: `keras_attn.decoding`.

    Args:
        source_vocabulary_size: int, size of the source vocabulary (id 0 = padding).
        target_vocabulary_size: int, size of the target vocabulary (id 0 = padding).
        embedding_dim: int, size of the token embeddings. Defaults to `256`.
        units: int, size of the GRU states and of the attention. Defaults to `256`.
        num_layers: int, GRU layers in the encoder and in the decoder. Defaults to `2`.
        dropout: float in [0, 1), dropout between GRU layers. Defaults to `0.2`.
        seed: optional int seed for the dropout. Defaults to `None`.
        name: str, the model's name. Defaults to `"bahdanau_seq2seq"`.

    Returns:
        `keras.Model([source_ids (B, S), target_in_ids (B, T)], logits (B, T,
        target_vocabulary_size))` (float32 logits) with layers named `"encoder"`
        (`BahdanauEncoder`) and `"decoder"` (`BahdanauDecoder`).

    Example:
    >>> model = bahdanau_seq2seq(100, 120, embedding_dim=32, units=32, num_layers=1)
    >>> model.compile("adam", loss=keras_attn.metrics.masked_sparse_categorical_crossentropy)
    >>> model.fit((source_ids, target_in_ids), target_out_ids)

    References:
        Bahdanau et al., 2015, "Neural Machine Translation by Jointly Learning to Align and
        Translate", https://arxiv.org/abs/1409.0473
    """
    renamed = legacy.rename(kwargs, "bahdanau_seq2seq", {
        "source_vocab_size": "source_vocabulary_size",
        "target_vocab_size": "target_vocabulary_size", "embed_dim": "embedding_dim"},
        said=legacy.said(bahdanau_seq2seq, source_vocabulary_size=source_vocabulary_size,
                         target_vocabulary_size=target_vocabulary_size,
                         embedding_dim=embedding_dim))
    if kwargs:
        raise TypeError(f"bahdanau_seq2seq() got unexpected keyword arguments {sorted(kwargs)}")
    source_vocabulary_size = renamed.get("source_vocabulary_size", source_vocabulary_size)
    target_vocabulary_size = renamed.get("target_vocabulary_size", target_vocabulary_size)
    embedding_dim = renamed.get("embedding_dim", embedding_dim)
    check_positive_int("source_vocabulary_size", source_vocabulary_size)
    check_positive_int("target_vocabulary_size", target_vocabulary_size)
    sizes = {"embedding_dim": embedding_dim, "units": units, "num_layers": num_layers,
             "dropout": dropout, "seed": seed}
    encoder = BahdanauEncoder(source_vocabulary_size, **sizes, name="encoder")
    decoder = BahdanauDecoder(target_vocabulary_size, **sizes, name="decoder")
    source_ids = keras.Input(shape=(None,), dtype="int32", name="source_ids")
    target_in_ids = keras.Input(shape=(None,), dtype="int32", name="target_in_ids")
    source_mask = keras.ops.not_equal(source_ids, PAD_ID)  # (B, S), True = real token
    logits = decoder(target_in_ids, encoder(source_ids), source_mask=source_mask)
    return keras.Model([source_ids, target_in_ids], logits, name=name)
