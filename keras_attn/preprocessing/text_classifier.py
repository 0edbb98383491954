"""Strings to what a text classifier's encoder takes (keras-hub's `TextClassifierPreprocessor`).

`TextClassifierPreprocessor` packs each text with its tokenizer's template (BERT's
`[CLS] text [SEP]`), cuts it to `sequence_length` ids as the `tokenizers` library truncates (the
template kept whole: `[CLS]`, the first tokens of the text, `[SEP]`), pads it and passes labels
through, so that `keras_attn.tasks.TextClassifier` trains, evaluates and predicts on raw text.
"""

from __future__ import annotations

import keras

from keras_attn._checks import check_int
from keras_attn.preprocessing.tokenizers import (
    Tokenizer,
    as_string_tensor,
    as_tokenizer,
)


@keras.saving.register_keras_serializable(package="keras_attn")
class TextClassifierPreprocessor(keras.layers.Layer):
    """A tokenizer and the layout of an encoder's input: one text per row, the tokenizer's
    template around it, cut and padded to `sequence_length` ids.

    A text longer than the room the template leaves (`sequence_length - len(prefix_ids) -
    len(suffix_ids)` tokens) keeps its first tokens and the template's end, as the `tokenizers`
    library's truncation does: `[CLS] t1 ... tn [SEP]`. Single texts only: a pair of texts
    (keras-hub's tuple of segments) is refused, not packed.

    Args:
        tokenizer: a `keras_attn.preprocessing.Tokenizer` (`PretrainedTokenizer` of a BERT
            checkpoint: template `[CLS] text [SEP]`, padding id `[PAD]`; a tokenizer without a
            padding id pads with 0, which `padding_mask` hides).
        sequence_length: int, ids per row, the template included; at least the template and
            one token. Defaults to `512`.

    Call arguments:
        x: strings `(B,)` (a str, a list of str, a NumPy or TensorFlow string array).
        y: optional labels `(B,)`, returned unchanged. Defaults to `None`.
        sample_weight: optional weights `(B,)`, returned unchanged. Defaults to `None`.

    Returns:
        `x` alone when `y` and `sample_weight` are None, else `(x, y)` or
        `(x, y, sample_weight)` (`keras.utils.pack_x_y_sample_weight`), where `x` is
        `{"token_ids": int32 (B, L), "padding_mask": bool (B, L), "segment_ids": int32 (B, L)}`
        with `L = sequence_length` (segment ids all 0: one segment).

    Example:
    >>> tokenizer = PretrainedTokenizer("path/to/bert-base-uncased")
    >>> preprocessor = TextClassifierPreprocessor(tokenizer, sequence_length=8)
    >>> x = preprocessor(["The quick brown fox jumps over the lazy dog."])
    >>> x["token_ids"].shape  # (1, 8): [CLS], the first six tokens, [SEP]
    """

    def __init__(self, tokenizer: Tokenizer, sequence_length: int = 512, **kwargs):
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        check_int("sequence_length", sequence_length, 2)
        self.tokenizer = as_tokenizer(tokenizer)
        self.sequence_length = int(sequence_length)
        self._check_room()
        self.built = True

    def _check_room(self) -> None:
        # A tokenizer restored from a `.keras` file knows its template once its assets are
        # read: checked here and again when the layer first runs.
        template = len(self.tokenizer.prefix_ids) + len(self.tokenizer.suffix_ids)
        if self.sequence_length < template + 1:
            raise ValueError(
                f"Argument `sequence_length` must leave room for the template's {template} ids "
                f"and a token. Received: sequence_length={self.sequence_length}")

    @property
    def pad_token_id(self) -> int:
        """The id of the padding positions: the tokenizer's, else 0."""
        pad = self.tokenizer.pad_token_id
        return 0 if pad is None else int(pad)

    def call(self, x, y=None, sample_weight=None):
        import tensorflow as tf

        if isinstance(x, tuple):
            raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
                "Argument `x` must be single texts (a list or array of strings): pairs of "
                "texts (a tuple of segments) are not supported. Received: "
                f"x=tuple of {len(x)}")
        self._check_room()
        texts = as_string_tensor("x", x)
        length = self.sequence_length
        ids = self.tokenizer.tokenize(texts)  # ragged (B, None), the template included
        # Keep the first `length - len(suffix)` ids and the template's end (the last
        # len(suffix) ids): [CLS] t1 ... tn [SEP].
        suffix = len(self.tokenizer.suffix_ids)
        lengths = ids.row_lengths()  # (B,)
        positions = tf.ragged.range(lengths)  # ragged (B, None): 0 ... n - 1
        kept = (positions < length - suffix) | (positions >= lengths[:, None] - suffix)
        ids = tf.ragged.boolean_mask(ids, kept)  # at most `length` ids per row
        token_ids = ids.to_tensor(default_value=self.pad_token_id, shape=[None, length])
        inputs = {"token_ids": token_ids,
                  "padding_mask": tf.sequence_mask(ids.row_lengths(), length),  # (B, L)
                  "segment_ids": tf.zeros_like(token_ids)}
        return keras.utils.pack_x_y_sample_weight(inputs, y, sample_weight)

    def __call__(self, x, y=None, sample_weight=None):
        # Strings are TensorFlow tensors whatever the backend: no conversion to the backend's.
        return self.call(x, y, sample_weight)

    def get_config(self):
        config = super().get_config()
        config.update({"tokenizer": keras.layers.serialize(self.tokenizer),
                       "sequence_length": self.sequence_length})
        return config
