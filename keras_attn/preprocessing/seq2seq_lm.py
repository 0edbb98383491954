"""Strings to what a sequence-to-sequence model takes, and its tokens back to strings.

`Seq2SeqLMPreprocessor` holds a translation task's two vocabularies and its text
normalization: the one place `keras_attn.tasks.Seq2SeqLM` turns sources and `(source, target)`
pairs into ids and target ids into text, the same layout `keras_attn.data.TranslationData`
trains with (`<bos> y` in, `y <eos>` out) and the exported `translate` signature reads.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_attn.preprocessing.tokenizers import as_string_tensor
from keras_attn.tokens import BOS_ID, EOS_ID, PAD_ID


def _vectorizer_config(vectorizer) -> dict:
    from keras_attn.data.subwords import SentencePieceVectorizer

    if isinstance(vectorizer, SentencePieceVectorizer):
        return {"sentencepiece": vectorizer.get_config()}
    return keras.layers.serialize(vectorizer)


def _vectorizer(config):
    from keras_attn.data.subwords import SentencePieceVectorizer

    if not isinstance(config, dict):
        return config
    if "sentencepiece" in config:
        return SentencePieceVectorizer.from_config(config["sentencepiece"])
    return keras.layers.deserialize(config)


def _check_vectorizer(name: str, vectorizer) -> int:
    """The output length of a `TextVectorization` / `SentencePieceVectorizer` made for
    translation (int ids, a fixed length, keras_attn's reserved ids first)."""
    from keras_attn.data.subwords import SentencePieceVectorizer

    if not isinstance(vectorizer, (keras.layers.TextVectorization, SentencePieceVectorizer)):
        raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
            f"Argument `{name}` must be a keras.layers.TextVectorization or a "
            "keras_attn.data.subwords.SentencePieceVectorizer (e.g. TranslationData's). "
            f"Received: {name}={vectorizer!r:.200}")
    config = vectorizer.get_config()
    length = config.get("output_sequence_length")
    if config.get("output_mode", "int") != "int" or not length:
        raise ValueError(
            f"Argument `{name}` must give int ids of a fixed length (output_mode='int', "
            f"output_sequence_length set). Received: output_mode={config.get('output_mode')!r}, "
            f"output_sequence_length={length!r}")
    vocabulary = vectorizer.get_vocabulary()
    if [str(t) for t in vocabulary[2:4]] != ["<bos>", "<eos>"]:
        raise ValueError(
            f"Argument `{name}` must start its vocabulary with keras_attn's reserved tokens "
            "('', '[UNK]', '<bos>', '<eos>'; keras_attn.data.translation.build_vectorizer). "
            f"Received: {[str(t) for t in vocabulary[:4]]}")
    return int(length)


@keras.saving.register_keras_serializable(package="keras_attn")
class Seq2SeqLMPreprocessor(keras.layers.Layer):
    """A translation task's vocabularies and text normalization (keras-hub's
    `Seq2SeqLMPreprocessor`).

    Training (`__call__` on `(sources, targets)` strings): both sides normalized by
    `standardize`, looked up in their vocabularies and padded to their lengths; `x =
    (source_ids, target_in)` with `target_in = <bos> y` and `y = target_out = y <eos>` (the
    end id dropped where the target fills every position), as `TranslationData.make_dataset`.
    Generation: `encode_source(texts)` gives the encoder's ids, `decode(ids)` the text of
    target ids (up to the first `<eos>`).

    Args:
        source_vectorizer: `keras.layers.TextVectorization` (or a
            `keras_attn.data.subwords.SentencePieceVectorizer`) of the source side: int ids,
            `output_sequence_length` set, keras_attn's reserved tokens first.
        target_vectorizer: the same for the target side.
        standardize: optional function of a `(B,)` string tensor written with `tf.strings`,
            applied to both sides before the lookup (`TranslationData.standardize_tf`); a
            registered Keras-serializable function saves with the layer. Defaults to `None`.
        joiner: str between target tokens in `decode` (`""` for characters). Defaults to
            `" "`.
        word_start: optional str, the SentencePiece word-start marker: `decode` concatenates
            the pieces and turns markers into spaces. Defaults to `None`.

    Example:
    >>> preprocessor = Seq2SeqLMPreprocessor.from_data(load_dates_translation())
    >>> (source, target_in), target_out = preprocessor(["march 3rd, 2021"], ["2021-03-03"])
    """

    def __init__(self, source_vectorizer, target_vectorizer, standardize=None,
                 joiner: str = " ", word_start: str | None = None, **kwargs):
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        source_vectorizer, target_vectorizer = (_vectorizer(source_vectorizer),
                                                _vectorizer(target_vectorizer))
        self.source_length = _check_vectorizer("source_vectorizer", source_vectorizer)
        self.target_length = _check_vectorizer("target_vectorizer", target_vectorizer)
        if isinstance(standardize, dict):
            standardize = keras.saving.deserialize_keras_object(standardize)
        if standardize is not None and not callable(standardize):
            raise ValueError("Argument `standardize` must be None or a function of a string "
                             f"tensor. Received: standardize={standardize!r}")
        for name, value in (("joiner", joiner), ("word_start", word_start)):
            if not (isinstance(value, str) or (name == "word_start" and value is None)):
                raise ValueError(f"Argument `{name}` must be a str. Received: {name}={value!r}")
        self.source_vectorizer, self.target_vectorizer = source_vectorizer, target_vectorizer
        self.standardize, self.joiner, self.word_start = standardize, joiner, word_start
        self._target_vocabulary = [str(t) for t in target_vectorizer.get_vocabulary()]

    @classmethod
    def from_data(cls, data) -> Seq2SeqLMPreprocessor:
        """The preprocessor of a `keras_attn.data.TranslationData` (its vectorizers and
        `text_options`)."""
        options = data.text_options
        return cls(data.source_vectorizer, data.target_vectorizer, options["standardize"],
                   options["joiner"], options["word_start"])

    @property
    def source_vocabulary_size(self) -> int:
        return self.source_vectorizer.vocabulary_size()

    @property
    def target_vocabulary_size(self) -> int:
        return len(self._target_vocabulary)

    def _normalized(self, texts, name: str = "texts"):
        texts = as_string_tensor(name, texts)
        return texts if self.standardize is None else self.standardize(texts)

    def encode_source(self, texts):
        """Source strings `(B,)` → int32 ids `(B, source_length)`, 0-padded."""
        import tensorflow as tf

        return tf.cast(self.source_vectorizer(self._normalized(texts)), tf.int32)

    def call(self, sources, targets):
        import tensorflow as tf

        source = tf.cast(self.source_vectorizer(self._normalized(sources, "sources")),
                         tf.int32)  # (B, Ls)
        target = tf.cast(self.target_vectorizer(self._normalized(targets, "targets")),
                         tf.int32)  # (B, Lt)
        if source.shape[0] is not None and target.shape[0] is not None and (
                source.shape[0] != target.shape[0]):
            raise ValueError("Arguments `sources` and `targets` must have one target per "
                             f"source. Received: {source.shape[0]} sources, "
                             f"{target.shape[0]} targets")
        batch = tf.shape(target)[0]
        target_in = tf.concat([tf.fill([batch, 1], BOS_ID), target[:, :-1]], axis=1)  # (B, Lt)
        lengths = tf.math.count_nonzero(target != PAD_ID, axis=1, dtype=tf.int32)  # (B,)
        positions = tf.range(self.target_length)[None, :]  # (1, Lt)
        target_out = tf.where(positions == lengths[:, None], EOS_ID, target)  # (B, Lt)
        return (source, target_in), target_out

    def __call__(self, sources, targets):
        # Strings are TensorFlow tensors whatever the backend: no conversion to the backend's.
        return self.call(sources, targets)

    def decode(self, ids) -> list[str]:
        """Target ids `(B, T)` → `B` strings: each row up to its first `<eos>`, padding and
        `<bos>` skipped, tokens joined (pieces detokenized with `word_start`)."""
        from keras_attn.data.translation import decode_ids

        ids = np.asarray(keras.ops.convert_to_numpy(ids))
        if ids.ndim != 2:
            raise ValueError("Argument `ids` must have shape (batch_size, length). "
                             f"Received: ids.shape={ids.shape}")
        return decode_ids(ids, self._target_vocabulary, self.joiner, self.word_start)

    def get_config(self):
        config = super().get_config()
        config.update({
            "source_vectorizer": _vectorizer_config(self.source_vectorizer),
            "target_vectorizer": _vectorizer_config(self.target_vectorizer),
            "standardize": None if self.standardize is None else
            keras.saving.serialize_keras_object(self.standardize),
            "joiner": self.joiner, "word_start": self.word_start})
        return config
