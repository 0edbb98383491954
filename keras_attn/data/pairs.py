"""Loader for tab-separated sentence pairs (Tatoeba / Anki exports such as d2l's `fra.txt`).

Each line is `source<TAB>target[<TAB>attribution]`. Text is preprocessed as in d2l: non-breaking
spaces (U+202F, U+00A0) become spaces, everything is lowercased, and a space is put before
`, . ! ?` when none precedes them; tokens are then the space-separated words.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import keras
import numpy as np
import tensorflow as tf

from keras_attn.data.translation import (
    Pair,
    TranslationData,
    build_vectorizer,
    max_tokens,
)

FRA_ENG_URL = "http://d2l-data.s3-accelerate.amazonaws.com/fra-eng.zip"

_WS = r" \t\n\r\f\v"
_PUNCT_AFTER_NON_SPACE = re.compile(r"(?<=[^ ])([,.!?])")
_RUNS_OF_SPACE = re.compile(f"[{_WS}]+")


def preprocess(text: str) -> str:
    """d2l's `preprocess_nmt` for one side of a pair, with runs of whitespace collapsed.

    Args:
        text: str, e.g. `"Va !"` or `"Hello,world!"`.

    Returns:
        str of space-separated tokens, e.g. `"va !"`, `"hello , world !"`.
    """
    text = text.replace("\u202f", " ").replace("\xa0", " ").lower()
    text = _PUNCT_AFTER_NON_SPACE.sub(r" \1", text)
    return _RUNS_OF_SPACE.sub(" ", text).strip(" \t\n\r\f\v")


def preprocess_tf(text: tf.Tensor) -> tf.Tensor:
    """`preprocess` with `tf.strings` ops, usable inside a graph.

    Args:
        text: string tensor of any shape.

    Returns:
        string tensor of the same shape, equal to `preprocess` element-wise.
    """
    text = tf.strings.regex_replace(text, "[\u202f\u00a0]", " ")
    text = tf.strings.lower(text, encoding="utf-8")
    # A space before every mark; the collapse below removes the doubled ones.
    text = tf.strings.regex_replace(text, "([,.!?])", r" \1")
    text = tf.strings.regex_replace(text, f"[{_WS}]+", " ")
    return tf.strings.strip(text)


def read_pairs(
    path: str, num_examples: int | None = None, verbose: int = 1
) -> tuple[list[Pair], int]:
    """Reads and preprocesses the pairs of a tab-separated file.

    Lines with no tab, or with an empty side after preprocessing, are skipped and counted; blank
    lines (no tab, only whitespace) are ignored. Columns after the second (attribution) are dropped.

    Args:
        path: str, path of a UTF-8 text file.
        num_examples: int, stop after this many valid pairs (the first ones of the file, as in
            d2l). Defaults to `None` (all).
        verbose: int, 1 shows a `keras.utils.Progbar` and a summary line, 0 is silent.
            Defaults to `1`.

    Returns:
        `(pairs, num_skipped)`: list of `(source, target)` token strings and the number of
        malformed lines.
    """
    with open(path, encoding="utf-8", errors="replace") as file:
        lines = file.read().split("\n")
    progbar = keras.utils.Progbar(len(lines), unit_name="line") if verbose else None
    pairs: list[Pair] = []
    num_skipped = 0
    for index, line in enumerate(lines):
        if progbar is not None and index % 10000 == 0:
            progbar.update(index)
        if num_examples is not None and len(pairs) >= num_examples:
            break
        line = line.rstrip("\r")
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
            f"Read {len(pairs)} pairs from {path}, skipped {num_skipped} malformed lines."
        )
    return pairs, num_skipped


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


def load_tatoeba(
    path: str | None = None,
    download: bool = False,
    num_examples: int | None = None,
    min_freq: int = 2,
    max_length: int | tuple[int, int] | None = None,
    seed: int = 0,
    test_fraction: float = 0.1,
    validation_fraction: float = 0.0,
    verbose: int = 1,
) -> TranslationData:
    """Loads a Tatoeba/Anki sentence-pair file as a word-level translation task.

    Vocabularies are built from the training split only (test words unseen in training are
    `[UNK]`), keeping words seen at least `min_freq` times.

    Args:
        path: str, path of the tab-separated file. Defaults to `None`, which needs
            `download=True`.
        download: bool, when `path` is None, fetch d2l's English-French `fra-eng.zip`
            (`FRA_ENG_URL`) with `keras.utils.get_file` (cached in `~/.keras/datasets`).
            Defaults to `False`.
        num_examples: int, use the first this many valid pairs of the file. Defaults to `None`
            (all).
        min_freq: int, minimum word count to enter a vocabulary. Defaults to `2`.
        max_length: int for both sides, `(source_length, target_length)`, or `None` for the
            longest training source and the longest training target plus one (for `<eos>`).
            Longer sequences are truncated. Defaults to `None`.
        seed: int, seed of the split. Defaults to `0`.
        test_fraction: float, fraction of unique source sentences held out for test.
            Defaults to `0.1`.
        validation_fraction: float, fraction held out for validation. Defaults to `0.0`.
        verbose: int, 1 shows progress and a summary, 0 is silent. Defaults to `1`.

    Returns:
        A `TranslationData` (word-level: `decode` joins tokens with spaces) whose `num_skipped`
        counts the malformed lines.

    Example:
    >>> data = load_tatoeba("fra.txt", num_examples=600, max_length=9)
    >>> ds = data.make_dataset("train", batch_size=64, shuffle=True)
    """
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
            f"No valid tab-separated pairs found in `path`. Received: path={path!r}"
        )
    train, validation, test = split_by_source(
        pairs, test_fraction, validation_fraction, seed
    )
    if isinstance(max_length, (tuple, list)):
        source_length, target_length = max_length
    elif max_length is not None:
        source_length = target_length = max_length
    else:
        source_length = max_tokens(s for s, _ in train)
        target_length = max_tokens(t for _, t in train) + 1
    data = TranslationData(
        source_vectorizer=build_vectorizer(
            (s for s, _ in train), source_length, min_freq, name="source_vectorizer"
        ),
        target_vectorizer=build_vectorizer(
            (t for _, t in train), target_length, min_freq, name="target_vectorizer"
        ),
        train=train,
        validation=validation,
        test=test,
        source_length=source_length,
        target_length=target_length,
        standardize=preprocess,
        standardize_tf=preprocess_tf,
        target_joiner=" ",
        num_skipped=num_skipped,
    )
    if verbose:
        print(
            f"Split {len(train)}/{len(validation)}/{len(test)} pairs (train/validation/test); "
            f"vocabularies {data.source_vocab_size} source, {data.target_vocab_size} target words."
        )
    return data
