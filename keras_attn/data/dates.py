"""Built-in translation task that needs no download: date normalization.

Dates written by people in 19 formats are translated to ISO 8601 ("2021-03-03"). The dates are
drawn uniformly from 1950-01-01 to 2049-12-31; weekday names are the true weekday of the date.
Sources are lowercase; the tokenizer lowercases whatever it is given, so "March 3rd, 2021" is
read as "march 3rd, 2021". The 19 formats (`FORMATS`), shown for 2021-03-03, a Wednesday:

| #  | example                   | #  | example                   |
|----|---------------------------|----|---------------------------|
| 0  | `wednesday, march 3 2021` | 10 | `03/03/2021`              |
| 1  | `3/3/21`                  | 11 | `wed, 3 mar 21`           |
| 2  | `03 mar 2021`             | 12 | `the third of march 2021` |
| 3  | `the 3rd of march, 2021`  | 13 | `march third, 2021`       |
| 4  | `march 3rd, 2021`         | 14 | `3rd march 2021`          |
| 5  | `2021/03/03`              | 15 | `03-mar-2021`             |
| 6  | `3 march 2021`            | 16 | `march 3, '21`            |
| 7  | `mar 3, 2021`             | 17 | `wed mar 3 2021`          |
| 8  | `wednesday 3 march 2021`  | 18 | `2021-3-3`                |
| 9  | `03.03.2021`              |    |                           |

The formats are chosen so that every source string has exactly one answer:

- slashes are month first (`3/4/21` is March 4), unless the year comes first (`2021/04/03`);
- dots are day first (`04.03.2021` is March 4);
- two-digit years pivot at 50: `00`-`49` are 2000-2049, `50`-`99` are 1950-1999.

Not covered, so a model trained here has never seen it: dates outside 1950-2049, day-first
slashes (`31/12/2021`), other languages, times, relative dates ("tomorrow"), partial dates
("march 2021"), impossible dates ("february 30, 2021") and any other text. A translator still
writes a well-formed ISO date for such input. The `score` output of an exported translator
(`keras_attn.export`) is clearly lower for text that is no date at all ("hello world"), but it
measures the model's confidence, not the input's validity: a trained model turned
"february 30, 2021" into "2021-02-30" and "31/12/2021" into "2021-03-12" with scores as high as
for real dates.

Tokenization (`to_tokens`) splits every digit into its own token and separates punctuation, so
the source vocabulary is small (about 90 tokens: digits, month and weekday names, ordinal words
and suffixes, punctuation) and the target is the 10 characters of the ISO date, e.g.
`"2 0 2 1 - 0 3 - 0 3"`; `from_tokens` joins them back to `"2021-03-03"`.
"""

from __future__ import annotations

import datetime
import re
from collections.abc import Sequence
from typing import NamedTuple

import keras
import numpy as np
import tensorflow as tf

from keras_attn.data.translation import (
    WHITESPACE,
    Pair,
    TranslationData,
    build_vectorizer,
)

_MONTHS = (
    "january", "february", "march", "april", "may", "june",
    "july", "august", "september", "october", "november", "december",
)  # fmt: skip
_WEEKDAYS = (
    "monday",
    "tuesday",
    "wednesday",
    "thursday",
    "friday",
    "saturday",
    "sunday",
)
_UNITS = (
    "first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth",
    "tenth", "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth",
    "seventeenth", "eighteenth", "nineteenth",
)  # fmt: skip
_ORDINAL_WORDS = (
    *_UNITS,
    "twentieth",
    *(f"twenty-{unit}" for unit in _UNITS[:9]),
    "thirtieth",
    "thirty-first",
)

# Each format is filled by `_fields(date)`; comments show 2021-03-03 (a wednesday).
FORMATS = (
    "{weekday}, {month} {d} {yyyy}",  # wednesday, march 3 2021
    "{m}/{d}/{yy}",  # 3/3/21
    "{dd} {mon} {yyyy}",  # 03 mar 2021
    "the {ord} of {month}, {yyyy}",  # the 3rd of march, 2021
    "{month} {ord}, {yyyy}",  # march 3rd, 2021
    "{yyyy}/{mm}/{dd}",  # 2021/03/03
    "{d} {month} {yyyy}",  # 3 march 2021
    "{mon} {d}, {yyyy}",  # mar 3, 2021
    "{weekday} {d} {month} {yyyy}",  # wednesday 3 march 2021
    "{dd}.{mm}.{yyyy}",  # 03.03.2021
    "{mm}/{dd}/{yyyy}",  # 03/03/2021
    "{wkd}, {d} {mon} {yy}",  # wed, 3 mar 21
    "the {ordw} of {month} {yyyy}",  # the third of march 2021
    "{month} {ordw}, {yyyy}",  # march third, 2021
    "{ord} {month} {yyyy}",  # 3rd march 2021
    "{dd}-{mon}-{yyyy}",  # 03-mar-2021
    "{month} {d}, '{yy}",  # march 3, '21
    "{wkd} {mon} {d} {yyyy}",  # wed mar 3 2021
    "{yyyy}-{m}-{d}",  # 2021-3-3
)

FIRST_DATE = datetime.date(1950, 1, 1)
LAST_DATE = datetime.date(2049, 12, 31)

# One token: a digit, a run of letters, or any other single character but whitespace
# (Unicode's, see `WHITESPACE`).
_TOKEN = rf"[0-9]|[a-z]+|[^{WHITESPACE}a-z0-9]"
_TOKEN_RE = re.compile(_TOKEN)


class DateSplits(NamedTuple):
    """Raw `(human date, ISO date)` pairs, e.g. `("3/3/21", "2021-03-03")`."""

    train: list[Pair]
    validation: list[Pair]
    test: list[Pair]


def _suffix(day: int) -> str:
    if 11 <= day <= 13:
        return "th"
    return {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")


def _fields(date: datetime.date) -> dict[str, str]:
    return {
        "weekday": _WEEKDAYS[date.weekday()],
        "wkd": _WEEKDAYS[date.weekday()][:3],
        "month": _MONTHS[date.month - 1],
        "mon": _MONTHS[date.month - 1][:3],
        "d": str(date.day),
        "dd": f"{date.day:02d}",
        "ord": f"{date.day}{_suffix(date.day)}",
        "ordw": _ORDINAL_WORDS[date.day - 1],
        "m": str(date.month),
        "mm": f"{date.month:02d}",
        "yyyy": str(date.year),
        "yy": f"{date.year % 100:02d}",
    }


def format_date(date: datetime.date, fmt: int | str) -> str:
    """Writes `date` the way a person might, in lowercase.

    Args:
        date: `datetime.date` between 1950-01-01 and 2049-12-31 (two-digit years pivot at 50).
        fmt: int index into `FORMATS`, or a format string with the fields `{weekday}`, `{wkd}`,
            `{month}`, `{mon}`, `{d}`, `{dd}`, `{ord}`, `{ordw}`, `{m}`, `{mm}`, `{yyyy}`, `{yy}`.

    Returns:
        The human-readable string, e.g. `"the 3rd of march, 2021"`.
    """
    template = FORMATS[fmt] if isinstance(fmt, (int, np.integer)) else fmt
    return template.format(**_fields(date))


def to_tokens(text: str) -> str:
    """Tokenizes a date string: lowercase, one token per digit, punctuation apart.

    Args:
        text: str, e.g. `"Saturday, March 3rd 2021"` or `"2021-03-03"`.

    Returns:
        str of tokens joined by single spaces, e.g. `"saturday , march 3 rd 2 0 2 1"` or
        `"2 0 2 1 - 0 3 - 0 3"`.
    """
    return " ".join(_TOKEN_RE.findall(text.lower()))


@keras.saving.register_keras_serializable(package="keras_attn")
def to_tokens_tf(text: tf.Tensor) -> tf.Tensor:
    """`to_tokens` with `tf.strings` ops, usable inside a graph.

    Args:
        text: string tensor of any shape.

    Returns:
        string tensor of the same shape, equal to `to_tokens` element-wise.
    """
    text = tf.strings.lower(text, encoding="utf-8")
    text = tf.strings.regex_replace(text, f"({_TOKEN})", r" \1 ")
    text = tf.strings.regex_replace(text, f"[{WHITESPACE}]+", " ")
    return tf.strings.strip(text)


def from_tokens(tokens: str | Sequence[str]) -> str:
    """Joins target character tokens back into a string: `"2 0 2 1 - 0 3 - 0 3"` -> `"2021-03-03"`.

    Meant for targets (ISO dates contain no spaces); a tokenized source loses its spaces.

    Args:
        tokens: str of space-separated tokens, or a list of tokens.

    Returns:
        str, the tokens concatenated.
    """
    if isinstance(tokens, str):
        tokens = tokens.split()
    return "".join(tokens)


def load_dates(
    num_examples: int = 20000,
    seed: int = 0,
    splits: tuple[float, float, float] = (0.8, 0.1, 0.1),
) -> DateSplits:
    """Generates raw date-normalization pairs, deterministically from `seed`.

    Random dates and formats are drawn until `num_examples` distinct source strings exist
    (duplicates are dropped), then these are cut into train, validation and test in draw order,
    so no source string is in two splits (a date may appear in two splits, written differently).

    Args:
        num_examples: int, number of distinct pairs. Defaults to `20000`.
        seed: int, seed of `np.random.default_rng`. Defaults to `0`.
        splits: three non-negative fractions `(train, validation, test)` summing to 1.
            Defaults to `(0.8, 0.1, 0.1)`.

    Returns:
        `DateSplits(train, validation, test)`, lists of `(source, target)` pairs such as
        `("wed, 3 mar 21", "2021-03-03")`.
    """
    if (
        isinstance(num_examples, bool)
        or not isinstance(num_examples, (int, np.integer))
        or num_examples <= 0
    ):
        raise ValueError(
            "Received an invalid value for argument `num_examples`, expected a positive integer. "
            f"Received: num_examples={num_examples!r}"
        )
    if len(splits) != 3 or min(splits) < 0 or abs(sum(splits) - 1.0) > 1e-6:
        raise ValueError(
            "Received an invalid value for argument `splits`, expected three non-negative "
            f"fractions summing to 1. Received: splits={splits!r}"
        )
    rng = np.random.default_rng(seed)
    num_days = (LAST_DATE - FIRST_DATE).days + 1
    seen: set[str] = set()
    pairs: list[Pair] = []
    while len(pairs) < num_examples:
        size = num_examples - len(pairs)
        days = rng.integers(0, num_days, size=size)
        formats = rng.integers(0, len(FORMATS), size=size)
        for day, fmt in zip(days.tolist(), formats.tolist()):
            date = FIRST_DATE + datetime.timedelta(days=day)
            source = format_date(date, fmt)
            if source not in seen:
                seen.add(source)
                pairs.append((source, date.isoformat()))
    num_train = round(splits[0] * num_examples)
    num_validation = round(splits[1] * num_examples)
    return DateSplits(
        train=pairs[:num_train],
        validation=pairs[num_train : num_train + num_validation],
        test=pairs[num_train + num_validation :],
    )


def max_source_tokens() -> int:
    """Longest tokenized source any format can produce (e.g. 11 tokens)."""
    # A two-digit month and a day >= 20 make every field as long as it gets.
    date = datetime.date(2021, 12, 27)
    return max(
        len(to_tokens(format_date(date, fmt)).split()) for fmt in range(len(FORMATS))
    )


def describe_formats(date: datetime.date = datetime.date(2021, 3, 3)) -> str:
    """The formats of the task as plain text, for a command line's `--help`.

    Args:
        date: `datetime.date` written in every format. Defaults to 2021-03-03.

    Returns:
        str of several lines: each format written for `date`, the rules that make them
        unambiguous, and what is not covered.
    """
    examples = [format_date(date, fmt) for fmt in range(len(FORMATS))]
    width = max(len(example) for example in examples) + 2
    rows = [examples[i:i + 3] for i in range(0, len(examples), 3)]
    years = f"{FIRST_DATE.year} to {LAST_DATE.year}"
    lines = [f"The built-in dates task reads {len(FORMATS)} formats of dates from {years}",
             f"and writes ISO 8601 dates; here are the formats for {date.isoformat()}:"]
    lines += ["  " + "".join(example.ljust(width) for example in row).rstrip() for row in rows]
    lines += [
        "Slashes are month first (3/4/21 is March 4) unless the year comes first; dots are day",
        "first (04.03.2021 is March 4); two-digit years 00-49 are 2000-2049, 50-99 are",
        "1950-1999; upper case is read as lower case. Anything else (other years, day-first",
        "slashes, other languages, times, impossible dates such as february 30) still gets an",
        "ISO date. The exported translator's `score` is clearly lower for text that is no date",
        "at all, but a date just outside the formats (31/12/2021, february 30) can come back",
        "wrong with a confident score: check the dates you rely on.",
    ]
    return "\n".join(lines)


def load_dates_translation(
    num_examples: int = 20000,
    seed: int = 0,
    splits: tuple[float, float, float] = (0.8, 0.1, 0.1),
) -> TranslationData:
    """The date-normalization task as token pairs with vocabularies and tf.data pipelines.

    Sources are `to_tokens(human date)`, targets the ISO date as 10 character tokens. Lengths are
    fixed by the formats, not the sample: `source_length = max_source_tokens()` and
    `target_length = 11` (10 characters and `<eos>`), so nothing is ever truncated.
    `decode` joins characters without spaces and returns ISO dates.

    Args:
        num_examples: int, number of distinct pairs. Defaults to `20000`.
        seed: int, seed of the generator. Defaults to `0`.
        splits: fractions `(train, validation, test)`. Defaults to `(0.8, 0.1, 0.1)`.

    Returns:
        A `TranslationData` (vocabularies built from the training split, `min_freq=1`).

    Example:
    >>> data = load_dates_translation(num_examples=1000)
    >>> (src, tgt_in), tgt_out = next(iter(data.make_dataset("train", batch_size=8)))
    >>> src.shape, tgt_in.shape
    (TensorShape([8, 11]), TensorShape([8, 11]))
    """
    raw = load_dates(num_examples=num_examples, seed=seed, splits=splits)
    train, validation, test = (
        [(to_tokens(source), to_tokens(target)) for source, target in split]
        for split in raw
    )
    source_length = max_source_tokens()
    target_length = 11
    return TranslationData(
        source_vectorizer=build_vectorizer(
            [s for s, _ in train], source_length, name="dates_source_vectorizer"
        ),
        target_vectorizer=build_vectorizer(
            [t for _, t in train], target_length, name="dates_target_vectorizer"
        ),
        train=train,
        validation=validation,
        test=test,
        source_length=source_length,
        target_length=target_length,
        standardize=to_tokens,
        standardize_tf=to_tokens_tf,
        target_joiner="",
    )
