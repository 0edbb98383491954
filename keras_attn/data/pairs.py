"""Loader for tab-separated sentence pairs (Tatoeba / Anki exports such as d2l's `fra.txt`).

Each line is `source<TAB>target[<TAB>attribution]`. Text is preprocessed as in d2l: every run of
whitespace (Unicode's, non-breaking spaces U+202F and U+00A0 included: `translation.WHITESPACE`)
becomes one space, everything is lowercased, and a space is put before `, . ! ?` when none
precedes them; tokens are then the space-separated words.

The file must be UTF-8 (a byte-order mark at its start is dropped); invalid UTF-8 is an error
naming the line, never a silent replacement. Pairs too long for the padded lengths are dropped
and counted (`TranslationData.num_too_long`), never silently truncated.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from keras_attn._checks import check_int, check_positive_int
from keras_attn.data.subwords import (
    WORD_START,
    SentencePieceVectorizer,
    learn_sentencepiece,
)
from keras_attn.data.translation import (
    WHITESPACE,
    Pair,
    TranslationData,
    build_vectorizer,
)

# The tokenizations `load_tatoeba` offers.
TOKENIZERS = ("word", "sentencepiece")

FRA_ENG_URL = "http://d2l-data.s3-accelerate.amazonaws.com/fra-eng.zip"

_PUNCT_AFTER_NON_SPACE = re.compile(r"(?<=[^ ])([,.!?])")
_RUNS_OF_SPACE = re.compile(f"[{WHITESPACE}]+")


def preprocess(text: str) -> str:
    """d2l's `preprocess_nmt` for one side of a pair, with runs of whitespace collapsed.

    Args:
        text: str, e.g. `"Va !"` or `"Hello,world!"`.

    Returns:
        str of space-separated tokens, e.g. `"va !"`, `"hello , world !"`.
    """
    text = _RUNS_OF_SPACE.sub(" ", text).lower()
    text = _PUNCT_AFTER_NON_SPACE.sub(r" \1", text)
    return _RUNS_OF_SPACE.sub(" ", text).strip(" ")


@keras.saving.register_keras_serializable(package="keras_attn")
def preprocess_tf(text: tf.Tensor) -> tf.Tensor:
    """`preprocess` with `tf.strings` ops, usable inside a graph.

    Args:
        text: string tensor of any shape.

    Returns:
        string tensor of the same shape, equal to `preprocess` element-wise.
    """
    text = tf.strings.regex_replace(text, f"[{WHITESPACE}]+", " ")
    text = tf.strings.lower(text, encoding="utf-8")
    # A space before every mark; the collapse below removes the doubled ones.
    text = tf.strings.regex_replace(text, "([,.!?])", r" \1")
    text = tf.strings.regex_replace(text, " +", " ")
    return tf.strings.strip(text)


def _read_text(path) -> str:
    """The text of the UTF-8 file `path`, without a leading byte-order mark, newlines as `\\n`."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(  # noqa: TRY004 (the project raises ValueError for bad arguments)
            "Received an invalid value for argument `path`, expected a file path (str or "
            f"os.PathLike). Received: path={path!r}"
        )
    if os.path.isdir(path):
        raise ValueError(
            "Received an invalid value for argument `path`, expected a file, not a directory. "
            f"Received: path={os.fspath(path)!r} (a directory)"
        )
    if not os.path.exists(path):
        raise ValueError(
            "Received an invalid value for argument `path`, expected an existing file. "
            f"Received: path={os.fspath(path)!r} (no such file)"
        )
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise ValueError(
            "Received an invalid value for argument `path`, expected a readable file. "
            f"Received: path={os.fspath(path)!r} ({error.strerror})"
        ) from error
    try:
        text = data.decode("utf-8-sig")  # drops a byte-order mark at the start, nowhere else
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ValueError(
            f"Argument `path` must be a UTF-8 text file; line {line} holds the invalid bytes "
            f"{data[error.start : error.end]!r} ({error.reason}). Convert the file to UTF-8 "
            "(e.g. `iconv -f latin1 -t utf-8`). "
            f"Received: path={os.fspath(path)!r}"
        ) from None
    # Universal newlines, as `open` in text mode would give.
    return text.replace("\r\n", "\n").replace("\r", "\n")


def read_pairs(
    path: str | os.PathLike, num_examples: int | None = None, verbose: int = 1
) -> tuple[list[Pair], int]:
    """Reads and preprocesses the pairs of a tab-separated file.

    Lines with no tab, or with an empty side after preprocessing, are skipped and counted; blank
    lines (no tab, only whitespace) are ignored. Columns after the second (attribution) are dropped.
    A UTF-8 byte-order mark at the start of the file is dropped.

    Args:
        path: str or `os.PathLike`, path of a UTF-8 text file.
        num_examples: int, stop after this many valid pairs (the first ones of the file, as in
            d2l). Defaults to `None` (all).
        verbose: int, 1 shows a `keras.utils.Progbar` and a summary line, 0 is silent.
            Defaults to `1`.

    Returns:
        `(pairs, num_skipped)`: list of `(source, target)` token strings and the number of
        malformed lines.

    Raises:
        ValueError: naming `path` when it is missing, a directory, unreadable, or not valid
            UTF-8 (the message gives the line of the first invalid bytes: a file in another
            encoding would otherwise turn every accented letter into U+FFFD without a word).
    """
    check_positive_int("num_examples", num_examples, allow_none=True)
    lines = _read_text(path).split("\n")
    progbar = keras.utils.Progbar(len(lines), unit_name="line") if verbose else None
    pairs: list[Pair] = []
    num_skipped = 0
    for index, line in enumerate(lines):
        if progbar is not None and index % 10000 == 0:
            progbar.update(index)
        if num_examples is not None and len(pairs) >= num_examples:
            break
        if not line.strip() and "\t" not in line:
            continue  # blank line, e.g. the end of the file
        parts = line.split("\t")
        source = preprocess(parts[0])
        target = preprocess(parts[1]) if len(parts) > 1 else ""
        if not source or not target:
            num_skipped += 1
            continue
        pairs.append((source, target))
    if progbar is not None:
        progbar.update(len(lines), finalize=True)
        print(
            f"Read {len(pairs)} pairs from {os.fspath(path)}, "
            f"skipped {num_skipped} malformed lines."
        )
    return pairs, num_skipped


def typical_length(lengths: Sequence[int]) -> int:
    """The padded length for a list of sequence lengths that one runaway value cannot set.

    The longest length at most `2 * p90`, where `p90` is the 90th percentile of `lengths`
    (nearest rank: the smallest length that at least 90% of `lengths` do not exceed). Lengths
    above `2 * p90` are outliers. For natural-language sentence lengths this keeps well over 99%
    of the sentences (their 99th percentile is typically 1.3 to 1.6 times the 90th), while a
    single 300-word line among short ones is left out in any list of 10 lengths or more, where
    a plain "cover 99%" rule cannot leave out one line of fewer than 100. Below 10 lengths the
    90th percentile is the maximum, and so is the result.

    Args:
        lengths: non-empty list of positive ints, e.g. token counts of training sentences.

    Returns:
        int, an element of `lengths`: e.g. `typical_length([3, 4, 5, 4, 3, 4, 6, 4, 3, 300])`
        is `6` (the 90th percentile is `6`, and `300 > 12`).
    """
    ordered = sorted(lengths)
    if not ordered:
        raise ValueError(
            "Received an invalid value for argument `lengths`, expected a non-empty list. "
            f"Received: lengths={lengths!r}"
        )
    p90 = ordered[math.ceil(0.9 * len(ordered)) - 1]
    return max(length for length in ordered if length <= 2 * p90)


def _num_tokens(text: str) -> int:
    return len(text.split(" "))


def _lengths_from(max_length) -> tuple[int, int]:
    """`(source_length, target_length)` from an explicit `max_length` (int or pair)."""
    if isinstance(max_length, (tuple, list)):
        if len(max_length) != 2:
            raise ValueError(
                "Received an invalid value for argument `max_length`, expected an int or a "
                f"pair (source_length, target_length). Received: max_length={max_length!r}"
            )
        lengths = tuple(max_length)
    else:
        lengths = (max_length, max_length)
    for length in lengths:
        check_positive_int("max_length", length)
    return lengths


def split_by_source(
    pairs: Sequence[Pair],
    test_fraction: float = 0.1,
    validation_fraction: float = 0.0,
    seed: int = 0,
) -> tuple[list[Pair], list[Pair], list[Pair]]:
    """Splits pairs so that no source sentence is in two splits.

    Unique source sentences are shuffled with `np.random.default_rng(seed)`; the first
    `round(test_fraction * n)` go to test, the next `round(validation_fraction * n)` to
    validation, the rest to train. All pairs of a source follow it; file order is kept inside
    each split.

    Args:
        pairs: list of `(source, target)` pairs.
        test_fraction: float in [0, 1). Defaults to `0.1`.
        validation_fraction: float in [0, 1). Defaults to `0.0`.
        seed: int. Defaults to `0`.

    Returns:
        `(train, validation, test)` lists of pairs.
    """
    for name, value in (
        ("test_fraction", test_fraction),
        ("validation_fraction", validation_fraction),
    ):
        if not 0.0 <= value < 1.0:
            raise ValueError(
                f"Received an invalid value for argument `{name}`, expected a number in [0, 1). "
                f"Received: {name}={value!r}"
            )
    if test_fraction + validation_fraction >= 1.0:
        raise ValueError(
            "Arguments `test_fraction` + `validation_fraction` must be below 1 to leave a "
            f"training split. Received: test_fraction={test_fraction}, "
            f"validation_fraction={validation_fraction}"
        )
    sources = list(dict.fromkeys(source for source, _ in pairs))
    order = np.random.default_rng(seed).permutation(len(sources))
    num_test = round(test_fraction * len(sources))
    num_validation = round(validation_fraction * len(sources))
    split_of = {}
    for rank, index in enumerate(order.tolist()):
        split_of[sources[index]] = (
            2 if rank < num_test else 1 if rank < num_test + num_validation else 0
        )
    splits: tuple[list[Pair], list[Pair], list[Pair]] = ([], [], [])
    for pair in pairs:
        splits[split_of[pair[0]]].append(pair)
    return splits


def _download_fra_eng() -> str:
    path = keras.utils.get_file("fra-eng.zip", origin=FRA_ENG_URL, extract=True)
    folder = path if os.path.isdir(path) else os.path.dirname(path)
    for root, _, files in os.walk(folder):
        if "fra.txt" in files:
            return os.path.join(root, "fra.txt")
    raise FileNotFoundError(
        f"No fra.txt found under {folder} after downloading {FRA_ENG_URL}."
    )


def _check_tokenizer(tokenizer, vocab_size, min_freq) -> None:
    if tokenizer not in TOKENIZERS:
        raise ValueError(
            f"Received an invalid value for argument `tokenizer`, expected one of {TOKENIZERS}. "
            f"Received: tokenizer={tokenizer!r}")
    if tokenizer == "word":
        check_positive_int("min_freq", min_freq, allow_none=True)
        if vocab_size is not None:
            raise ValueError(
                "Argument `vocab_size` is for subword vocabularies (tokenizer='sentencepiece'); "
                "word vocabularies keep the words seen `min_freq` times. Received: "
                f"vocab_size={vocab_size!r}, tokenizer='word'")
        return
    if min_freq is not None:
        raise ValueError(
            "Argument `min_freq` is for word vocabularies (tokenizer='word'); a SentencePiece "
            f"vocabulary has `vocab_size` ids. Received: min_freq={min_freq!r}, "
            f"tokenizer={tokenizer!r}")
    if vocab_size is None:
        raise ValueError(
            "Argument `vocab_size` is required with tokenizer='sentencepiece' (e.g. 8000). "
            "Received: vocab_size=None")
    check_int("vocab_size", vocab_size, 8)


def _sentencepiece_vectorizers(train: list[Pair], vocab_size: int):
    """Both sides' `SentencePieceVectorizer`s learned from `train`, the training pairs that fit
    their piece lengths, and how many did not."""
    models = [learn_sentencepiece((pair[side] for pair in train), vocab_size) for side in (0, 1)]
    counts = [SentencePieceVectorizer(model, 1).count_tokens(
        tf.constant([pair[side] for pair in train])).numpy() for side, model in enumerate(models)]
    lengths = (typical_length(counts[0].tolist()), typical_length((counts[1] + 1).tolist()))
    fits = (counts[0] <= lengths[0]) & (counts[1] < lengths[1])
    vectorizers = tuple(
        SentencePieceVectorizer(model, length, name=f"{side}_vectorizer")
        for model, length, side in zip(models, lengths, ("source", "target")))
    kept = [pair for pair, fit in zip(train, fits.tolist()) if fit]
    return vectorizers, kept, len(train) - len(kept)


def load_tatoeba(
    path: str | os.PathLike | None = None,
    download: bool = False,
    num_examples: int | None = None,
    min_freq: int | None = None,
    max_length: int | tuple[int, int] | None = None,
    seed: int = 0,
    test_fraction: float = 0.1,
    validation_fraction: float = 0.0,
    verbose: int = 1,
    tokenizer: str = "word",
    vocab_size: int | None = None,
) -> TranslationData:
    """Loads a Tatoeba/Anki sentence-pair file as a word-level or subword translation task.

    Vocabularies are built from the training split only. With `tokenizer="word"` they keep
    the words seen at least `min_freq` times (test words unseen in training are `[UNK]`). With
    `tokenizer="sentencepiece"` each side gets a SentencePiece BPE model of `vocab_size` ids
    (`keras_attn.data.subwords`): words are split into known pieces, so only characters never
    seen in training are `[UNK]`.

    Every pair is padded to `(source_length, target_length)` tokens, the target counting its
    `<eos>` (`target_in` is `<bos> y`, `target_out` is `y <eos>`). Pairs that do not fit
    (`len(source) > source_length` or `len(target) + 1 > target_length`) are dropped from all
    three splits and counted in `num_too_long`, never truncated: a truncated target would lose
    its `<eos>` and teach the model not to stop. Text encoded later (`encode_source`, an
    exported translator) is still truncated to the source length.

    Subwords: the pairs are chosen by their length in words exactly as for words (the same
    `max_length`, the same splits, so the two tokenizations are scored on the same held-out
    pairs), then the lengths in pieces are `typical_length` of the training pairs' piece counts
    (plus one for `<eos>` on the target side); training pairs longer in pieces are dropped and
    counted in `num_too_long`. Held-out pairs are never dropped for their piece count: their
    sources are encoded as an exported translator would encode them (truncated to the source
    length when longer), their targets are only references.

    Args:
        path: str or `os.PathLike`, path of the tab-separated UTF-8 file. Defaults to `None`,
            which needs `download=True`.
        download: bool, when `path` is None, fetch d2l's English-French `fra-eng.zip`
            (`FRA_ENG_URL`) with `keras.utils.get_file` (cached in `~/.keras/datasets`).
            Defaults to `False`.
        num_examples: int, use the first this many valid pairs of the file (before too-long
            pairs are dropped). Defaults to `None` (all).
        min_freq: int, minimum word count to enter a word vocabulary (not used with
            subwords). Defaults to `None` (2 for words).
        max_length: int for both sides, `(source_length, target_length)`, or `None` to choose
            each length from the training split: `typical_length` of the training source
            lengths, and of the training target lengths plus one (for `<eos>`), i.e. the
            longest sentence at most twice the 90th percentile, so that one runaway line does
            not set the padded length of every batch. Pairs longer than the lengths are dropped
            and counted. Defaults to `None`.
        seed: int, seed of the split. Defaults to `0`.
        test_fraction: float, fraction of unique source sentences held out for test.
            Defaults to `0.1`.
        validation_fraction: float, fraction held out for validation. Defaults to `0.0`.
        verbose: int, 1 shows progress and a summary (split sizes, pairs dropped as too long,
            vocabulary sizes), 0 is silent. Defaults to `1`.
        tokenizer: str, `"word"` (space-separated words) or `"sentencepiece"` (subword
            pieces). Defaults to `"word"`.
        vocab_size: int, with `"sentencepiece"`: the number of ids of each side's model, the
            four reserved ones included. Defaults to `None` (required with subwords).

    Returns:
        A `TranslationData` (word-level: `decode` joins tokens with spaces) whose `num_skipped`
        counts the malformed lines and `num_too_long` the pairs dropped for their length.

    Raises:
        ValueError: naming `path` when it is missing, a directory, not UTF-8 or holds no valid
            pair; naming `max_length` when it is not a positive int or pair of them, or when no
            training pair fits it; naming `tokenizer`, `vocab_size` or `min_freq` when they do
            not go together (`min_freq` is for words, `vocab_size` for subwords).

    Example:
    >>> data = load_tatoeba("fra.txt", num_examples=600, max_length=9)
    >>> data.num_too_long  # pairs of more than 9 source or 8 target tokens
    >>> ds = data.make_dataset("train", batch_size=64, shuffle=True)
    """
    explicit_lengths = _lengths_from(max_length) if max_length is not None else None
    _check_tokenizer(tokenizer, vocab_size, min_freq)
    if path is None:
        if not download:
            raise ValueError(
                "Argument `path` is required unless `download=True`. "
                f"Received: path={path!r}, download={download!r}"
            )
        path = _download_fra_eng()
    pairs, num_skipped = read_pairs(path, num_examples=num_examples, verbose=verbose)
    if not pairs:
        raise ValueError(
            f"No valid tab-separated pairs found in `path`. Received: path={os.fspath(path)!r}"
        )
    train, validation, test = split_by_source(
        pairs, test_fraction, validation_fraction, seed
    )
    if not train:
        raise ValueError(
            "Arguments `test_fraction` and `validation_fraction` leave no training pair: the "
            f"file has {len({s for s, _ in pairs})} unique source sentences. Received: "
            f"test_fraction={test_fraction}, validation_fraction={validation_fraction}"
        )
    if explicit_lengths is not None:
        source_length, target_length = explicit_lengths
    else:
        source_length = typical_length([_num_tokens(s) for s, _ in train])
        target_length = typical_length([_num_tokens(t) + 1 for _, t in train])

    def fits(pair: Pair) -> bool:
        source, target = pair
        return _num_tokens(source) <= source_length and _num_tokens(target) < target_length

    num_pairs = len(train) + len(validation) + len(test)
    train, validation, test = (
        [pair for pair in split if fits(pair)] for split in (train, validation, test)
    )
    num_too_long = num_pairs - len(train) - len(validation) - len(test)
    if not train:
        raise ValueError(
            "Received an invalid value for argument `max_length`: no training pair has at most "
            f"{source_length} source and {target_length - 1} target tokens (plus <eos>). "
            f"Received: max_length={max_length!r}"
        )
    if tokenizer == "word":
        min_freq = 2 if min_freq is None else min_freq
        vectorizers = (
            build_vectorizer((s for s, _ in train), source_length, min_freq,
                             name="source_vectorizer"),
            build_vectorizer((t for _, t in train), target_length, min_freq,
                             name="target_vectorizer"))
    else:
        vectorizers, train, num_long_pieces = _sentencepiece_vectorizers(train, vocab_size)
        num_too_long += num_long_pieces
    data = TranslationData(
        source_vectorizer=vectorizers[0],
        target_vectorizer=vectorizers[1],
        train=train,
        validation=validation,
        test=test,
        source_length=vectorizers[0].get_config()["output_sequence_length"],
        target_length=vectorizers[1].get_config()["output_sequence_length"],
        standardize=preprocess,
        standardize_tf=preprocess_tf,
        target_joiner=" ",
        num_skipped=num_skipped,
        num_too_long=num_too_long,
        word_start=None if tokenizer == "word" else WORD_START,
    )
    if verbose:
        print(
            f"Split {len(train)}/{len(validation)}/{len(test)} pairs (train/validation/test); "
            f"dropped {num_too_long} pairs longer than {source_length} source or "
            f"{target_length - 1} target tokens"
            + ("" if tokenizer == "word" else
               f" (or, in training, {data.source_length} source or {data.target_length - 1} "
               "target pieces)")
            + f"; vocabularies {data.source_vocab_size} source, {data.target_vocab_size} target "
            + ("words." if tokenizer == "word" else "SentencePiece ids.")
        )
    return data
