"""Vocabularies and tf.data pipelines shared by every translation data set.

A data set here is a list of `(source, target)` pairs of *token strings*: text already
standardized so that tokens are separated by single spaces. Vocabularies are
`keras.layers.TextVectorization` layers (no standardization of their own, whitespace split) whose
first four ids are reserved, the same in the source and the target vocabulary (defined once in
`keras_attn.tokens`, re-exported here):

| id | token     | meaning                                                 |
|----|-----------|---------------------------------------------------------|
| 0  | `""`      | padding (models mask id 0)                              |
| 1  | `"[UNK]"` | out of vocabulary (and words rarer than `min_freq`)     |
| 2  | `"<bos>"` | begin of sequence, first decoder input                  |
| 3  | `"<eos>"` | end of sequence, last decoder target                    |

Sources are encoded without `<bos>`/`<eos>`; targets give the teacher-forcing pair
`target_in = "<bos> y"` and `target_out = "y <eos>"`. Everything is padded with 0 and truncated to
a fixed length.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Iterable, Sequence

import keras
import numpy as np
import tensorflow as tf

from keras_attn._checks import check_bool, check_positive_int
from keras_attn.data.subwords import detokenize
from keras_attn.tokens import (
    BOS,
    BOS_ID,
    EOS,
    EOS_ID,
    PAD_ID,
    RESERVED_TOKENS,
    UNK,
    UNK_ID,
)

__all__ = [
    "BOS",
    "BOS_ID",
    "EOS",
    "EOS_ID",
    "PAD_ID",
    "RESERVED_TOKENS",
    "UNK",
    "UNK_ID",
    "WHITESPACE",
    "Pair",
    "TranslationData",
    "build_vectorizer",
    "max_tokens",
]

Pair = tuple[str, str]

# Every character Python's `str.isspace` counts as whitespace: Unicode's White_Space property
# (U+0009-000D, U+0020, U+0085, U+00A0, U+1680, U+2000-200A, U+2028, U+2029, U+202F, U+205F,
# U+3000) and U+001C-001F. Literal characters, none special inside a regular-expression class,
# so `f"[{WHITESPACE}]"` means the same to Python's `re` and to TensorFlow's RE2 (whose `\s` is
# ASCII only). A test checks the list against `str.isspace` over all of Unicode.
WHITESPACE = ("\t\n\x0b\x0c\r\x1c\x1d\x1e\x1f \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004"
              "\u2005\u2006\u2007\u2008\u2009\u200a\u2028\u2029\u202f\u205f\u3000")


def build_vectorizer(
    texts: Iterable[str],
    max_length: int,
    min_freq: int = 1,
    name: str | None = None,
) -> keras.layers.TextVectorization:
    """Builds a word vocabulary as a `TextVectorization` layer with the reserved ids above.

    Tokens are counted with `str.split(" ")`; those seen at least `min_freq` times are kept, most
    frequent first (ties broken alphabetically, so the vocabulary is deterministic).

    Args:
        texts: iterable of token strings (tokens separated by single spaces).
        max_length: int, `output_sequence_length` of the layer: outputs are padded with 0 or
            truncated to this length.
        min_freq: int, minimum count of a token to enter the vocabulary; rarer tokens map to
            `UNK_ID`. Defaults to `1`.
        name: str, name of the layer. Defaults to `None` (automatic name).

    Returns:
        A `keras.layers.TextVectorization(standardize=None, split="whitespace")` whose vocabulary
        starts with `"", "[UNK]", "<bos>", "<eos>"` (ids 0 to 3) and which maps a batch of
        strings `(B,)` to int64 ids `(B, max_length)`.
    """
    check_positive_int("max_length", max_length)
    check_positive_int("min_freq", min_freq)
    counts = collections.Counter()
    for text in texts:
        counts.update(token for token in text.split(" ") if token)
    kept = sorted(
        (
            token
            for token, count in counts.items()
            if count >= min_freq and token not in RESERVED_TOKENS
        ),
        key=lambda token: (-counts[token], token),
    )
    return keras.layers.TextVectorization(
        standardize=None,
        split="whitespace",
        output_mode="int",
        output_sequence_length=max_length,
        vocabulary=list(RESERVED_TOKENS) + kept,
        name=name,
    )


@dataclasses.dataclass
class TranslationData:
    """A translation task: token-string pairs, vocabularies and tf.data pipelines.

    Attributes:
        source_vectorizer: `TextVectorization` (words, characters) or
            `keras_attn.data.subwords.SentencePieceVectorizer` (subword pieces) of the source
            side, output length `source_length`.
        target_vectorizer: the same for the target side, output length `target_length`.
        train: list of `(source, target)` token-string pairs.
        validation: list of pairs (may be empty).
        test: list of pairs; no test source string appears in `train`.
        source_length: int, length `Ls` of encoded sources.
        target_length: int, length `Lt` of encoded decoder inputs and targets.
        standardize: callable turning a raw source string into a token string, the same
            preprocessing the pairs went through (e.g. `dates.to_tokens`).
        standardize_tf: the same preprocessing written with `tf.strings`, for a batch of strings
            inside a graph (e.g. an exported SavedModel).
        target_joiner: str placed between target tokens by `decode`: `" "` for words, `""` for
            characters. Defaults to `" "`.
        num_skipped: int, malformed input lines that were skipped. Defaults to `0`.
        num_too_long: int, pairs dropped because they did not fit `source_length` /
            `target_length` (with `<eos>`) and would have been truncated. Defaults to `0`.
        word_start: str or None: the marker that starts a word in the target pieces
            (`subwords.WORD_START` for SentencePiece vocabularies); `decode` then concatenates
            the pieces and turns the markers into the spaces between words
            (`subwords.detokenize`), and `target_joiner` is `" "`. Defaults to `None` (every
            target token is a word or a character).
    """

    source_vectorizer: keras.layers.TextVectorization
    target_vectorizer: keras.layers.TextVectorization
    train: list[Pair]
    validation: list[Pair]
    test: list[Pair]
    source_length: int
    target_length: int
    standardize: Callable[[str], str]
    standardize_tf: Callable[[tf.Tensor], tf.Tensor]
    target_joiner: str = " "
    num_skipped: int = 0
    num_too_long: int = 0
    word_start: str | None = None

    @property
    def source_vocab_size(self) -> int:
        """Number of source ids, reserved ones included."""
        return self.source_vectorizer.vocabulary_size()

    @property
    def target_vocab_size(self) -> int:
        """Number of target ids, reserved ones included."""
        return self.target_vectorizer.vocabulary_size()

    @property
    def text_options(self) -> dict:
        """The keyword arguments of `keras_attn.export`'s translators that turn raw text into
        this task's tokens and output tokens back into text: `standardize`, `joiner` and
        `word_start`."""
        return {"standardize": self.standardize_tf, "joiner": self.target_joiner,
                "word_start": self.word_start}

    def unknown_rate(self, sources: Sequence[str]) -> float:
        """The share of the source tokens of `sources` (token strings, as in the pairs) that
        the source vocabulary does not know (`[UNK]`), over the tokens kept by the source
        length; 0.0 when there are no tokens.

        Args:
            sources: list of source token strings.

        Returns:
            float in [0, 1].
        """
        ids = self.encode_source(sources, standardize=False)
        real = np.count_nonzero(ids != PAD_ID)
        return float(np.count_nonzero(ids == UNK_ID) / real) if real else 0.0

    def encode_source(
        self, texts: Sequence[str], standardize: bool = True
    ) -> np.ndarray:
        """Encodes source sentences to padded ids.

        Args:
            texts: list of source strings.
            standardize: bool, whether `texts` are raw and need `self.standardize` first (False
                when they are token strings already). Defaults to `True`.

        Returns:
            int32 array of shape `(len(texts), source_length)`.
        """
        if standardize:
            texts = [self.standardize(text) for text in texts]
        return self._vectorize(self.source_vectorizer, texts)

    def encode_targets(self, texts: Sequence[str]) -> np.ndarray:
        """Encodes target token strings as they are, without `<bos>` or `<eos>`.

        Args:
            texts: list of target token strings.

        Returns:
            int32 array of shape `(len(texts), target_length)`, padded with 0.
        """
        return self._vectorize(self.target_vectorizer, texts)

    def pairs_of(self, pairs: Sequence[Pair] | str, name: str = "pairs") -> Sequence[Pair]:
        """`pairs` itself, or the split it names (`"train"`, `"validation"` or `"test"`).

        Args:
            pairs: a list of `(source, target)` token strings or the name of a split.
            name: str, the caller's name of the argument, for the error message. Defaults to
                `"pairs"`.

        Returns:
            The list of pairs.
        """
        if isinstance(pairs, str):
            if pairs not in ("train", "validation", "test"):
                raise ValueError(
                    f"Received an invalid value for argument `{name}`, expected a list of "
                    f"pairs or one of 'train', 'validation', 'test'. Received: {name}={pairs!r}"
                )
            pairs = getattr(self, pairs)
        return pairs

    def encode_pairs(
        self, pairs: Sequence[Pair]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Encodes token-string pairs for teacher forcing.

        Args:
            pairs: list of `(source, target)` token strings.

        Returns:
            `(source_ids, target_in_ids, target_out_ids)`, int32 arrays of shapes `(N, Ls)`,
            `(N, Lt)`, `(N, Lt)`; `target_in` is `<bos> y`, `target_out` is `y <eos>`, both padded
            with 0 and truncated to `Lt` (so they stay aligned).
        """
        sources = self._vectorize(self.source_vectorizer, [source for source, _ in pairs])
        targets = self.encode_targets([target for _, target in pairs])  # (N, Lt)
        target_in = np.concatenate([np.full((len(targets), 1), BOS_ID, np.int32),
                                    targets[:, :-1]], axis=1)  # (N, Lt)
        target_out = targets.copy()  # (N, Lt)
        lengths = np.count_nonzero(targets != PAD_ID, axis=1)  # (N,)
        rows = np.flatnonzero(lengths < targets.shape[1])
        target_out[rows, lengths[rows]] = EOS_ID
        return sources, target_in, target_out

    def make_dataset(
        self,
        pairs: Sequence[Pair] | str,
        batch_size: int = 64,
        shuffle: bool = False,
        seed: int | None = 0,
        drop_remainder: bool = False,
        group_by_length: bool = False,
    ) -> tf.data.Dataset:
        """A batched `tf.data.Dataset` for `model.fit` / `model.evaluate`.

        With `group_by_length`, pairs of the same length (the longer of their source and
        target, in tokens) are batched together and every batch is cut to its longest source and
        its longest target, so a batch costs what its sentences cost rather than `Ls`/`Lt`
        positions each (short sentences are mostly padding otherwise). Batches then have
        varying lengths: the `(B, Ls)` shapes below become `(B, S_batch)` with
        `S_batch <= Ls`, and likewise for the targets. The last batch of each length may be
        smaller than `batch_size` (dropped with `drop_remainder`).

        Args:
            pairs: list of `(source, target)` token strings, or the name of a split:
                `"train"`, `"validation"` or `"test"`.
            batch_size: int, batch size. Defaults to `64`.
            shuffle: bool, whether to shuffle (over the whole split, reshuffled each epoch;
                with `group_by_length` the batches are drawn from the shuffled stream, so they
                differ every epoch too). Defaults to `False`.
            seed: int, shuffle seed. Defaults to `0`.
            drop_remainder: bool, drop incomplete batches (gives a static batch size).
                Defaults to `False`.
            group_by_length: bool, batch pairs of equal length and cut the padding, as above.
                Defaults to `False`.

        Returns:
            A dataset of `((source_ids, target_in_ids), target_out_ids)`, int32 tensors of shapes
            `(B, Ls)`, `(B, Lt)`, `(B, Lt)` (shorter with `group_by_length`).
        """
        pairs = self.pairs_of(pairs)
        check_positive_int("batch_size", batch_size)
        for name, value in (("shuffle", shuffle), ("drop_remainder", drop_remainder),
                            ("group_by_length", group_by_length)):
            check_bool(name, value)
        source, target_in, target_out = self.encode_pairs(pairs)
        dataset = tf.data.Dataset.from_tensor_slices(((source, target_in), target_out))
        if shuffle and len(source) > 0:
            dataset = dataset.shuffle(
                len(source), seed=seed, reshuffle_each_iteration=True
            )
        if not group_by_length:
            dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
            return dataset.prefetch(tf.data.AUTOTUNE)

        def length(inputs, target_out):
            source, target_in = inputs
            return tf.maximum(tf.math.count_nonzero(source), tf.math.count_nonzero(target_in))

        def cut(inputs, target_out):
            source, target_in = inputs
            source_length, target_length = batch_length(source), batch_length(target_in)
            return ((source[:, :source_length], target_in[:, :target_length]),
                    target_out[:, :target_length])

        lengths = np.maximum(np.count_nonzero(source, axis=1), np.count_nonzero(target_in, axis=1))
        dataset = batch_by_length(dataset, length, lengths, batch_size, drop_remainder)
        return dataset.map(cut, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE)

    def decode(self, ids) -> list[str]:
        """Turns target ids back into strings.

        Each row is read up to its first `<eos>`; padding and `<bos>` are skipped and the
        remaining tokens are joined with `target_joiner` (subword pieces: detokenized into words,
        see `word_start`).

        Args:
            ids: integer array-like or tensor of shape `(B, T)`, or `(T,)` for one sequence.

        Returns:
            list of `B` strings (one string for a `(T,)` input, still in a list).
        """
        ids = np.asarray(keras.ops.convert_to_numpy(ids))
        if ids.ndim == 1:
            ids = ids[None]
        if ids.ndim != 2:
            raise ValueError(
                "Argument `ids` must have shape (batch_size, length) or (length,). "
                f"Received: ids.shape={ids.shape}"
            )
        return decode_ids(ids, self.target_vectorizer.get_vocabulary(), self.target_joiner,
                          self.word_start)

    @staticmethod
    def _vectorize(vectorizer, texts: Sequence[str]) -> np.ndarray:
        length = vectorizer.get_config()["output_sequence_length"]
        if len(texts) == 0:
            return np.zeros((0, length), np.int32)
        ids = vectorizer(tf.constant(list(texts), dtype=tf.string))
        return keras.ops.convert_to_numpy(ids).astype(np.int32)


def decode_ids(ids: np.ndarray, vocabulary: Sequence[str], joiner: str = " ",
               word_start: str | None = None) -> list[str]:
    """Target ids `(B, T)` as `B` strings: each row up to its first `<eos>`, padding and
    `<bos>` skipped, ids outside `vocabulary` as `[UNK]`, the tokens joined with `joiner` (or,
    with `word_start`, subword pieces detokenized into words)."""
    texts = []
    for row in np.asarray(ids).tolist():
        tokens = []
        for index in row:
            if index == EOS_ID:
                break
            if index not in (PAD_ID, BOS_ID):
                tokens.append(str(vocabulary[index]) if 0 <= index < len(vocabulary) else UNK)
        texts.append(detokenize(tokens, word_start) if word_start is not None
                     else joiner.join(tokens))
    return texts


def batch_by_length(dataset: tf.data.Dataset, length_of: Callable, lengths: np.ndarray,
                    batch_size: int, drop_remainder: bool) -> tf.data.Dataset:
    """Batches of the elements of `dataset` that have the same length.

    Args:
        dataset: unbatched `tf.data.Dataset`.
        length_of: function of an element (its components as arguments) returning its length,
            an int64 scalar tensor.
        lengths: int array `(N,)`, the same lengths for the `N` elements, to count the batches.
        batch_size: int.
        drop_remainder: bool, drop each length's last incomplete batch.

    Returns:
        The batched dataset, its cardinality declared (the number of batches does not depend on
        the order: per length, the elements of that length in batches of `batch_size`), so that
        Keras' progress bar and schedules know it.
    """
    dataset = dataset.group_by_window(
        key_func=lambda *element: tf.cast(length_of(*element), tf.int64),
        reduce_func=lambda _, window: window.batch(batch_size, drop_remainder=drop_remainder),
        window_size=batch_size,
    )
    counts = np.bincount(np.asarray(lengths, np.int64), minlength=1)
    per_length = counts // batch_size if drop_remainder else -(-counts // batch_size)
    return dataset.apply(tf.data.experimental.assert_cardinality(int(per_length.sum())))


def batch_length(ids: tf.Tensor) -> tf.Tensor:
    """The length a batch of padded ids `(B, L)` can be cut to: the position after its last
    non-padding id, at least 1 (so that a batch of empty rows keeps a shape models take)."""
    positions = tf.range(1, tf.shape(ids)[1] + 1)
    return tf.maximum(tf.reduce_max(tf.where(ids != PAD_ID, positions, 0)), 1)


def max_tokens(texts: Iterable[str]) -> int:
    """Number of tokens of the longest token string (0 for none)."""
    return max((len(text.split(" ")) for text in texts if text), default=0)
