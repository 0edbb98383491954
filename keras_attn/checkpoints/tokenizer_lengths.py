"""`tokenizer.json`'s `truncation` and `padding` sections, applied as the `tokenizers` library
applies them in `Tokenizer.encode_batch` (a single sequence per row, no pairs):

- truncation first, to `max_length` less the template's special tokens when they are added
  (no truncation at all when `max_length` is below their number, as `tokenizers`), keeping
  the first tokens (`"Right"`) or the last (`"Left"`); `stride` only shapes the overflowing
  pieces `tokenizers` also returns, not the ids;
- then the template (`<s> $A`, `[CLS] $A [SEP]`);
- then padding with `pad_id`, to `{"Fixed": n}` tokens or to the batch's longest row
  (`"BatchLongest"`), rounded up to `pad_to_multiple_of`, after the ids (`"Right"`) or
  before them (`"Left"`); a row already longer keeps its length.
"""

from __future__ import annotations

import tensorflow as tf

from keras_attn.checkpoints.tokenizer_ragged import keep_values, row_positions

DIRECTIONS = ("Right", "Left")


def _refuse(key: str, value, expected: str) -> None:
    raise ValueError(f"Cannot load the tokenizer: tokenizer.json `{key}` must be {expected}. "
                     f"Received: {key}={value!r}")


def _count(key: str, value, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        _refuse(key, value, "a non-negative integer" + (" or null" if allow_none else ""))
    return value


def _direction(section: str, value) -> str:
    if value not in DIRECTIONS:
        _refuse(f"{section}.direction", value, f"one of {DIRECTIONS}")
    return value


def _section(spec: dict, name: str) -> dict | None:
    section = spec.get(name)
    if section is not None and not isinstance(section, dict):
        _refuse(name, section, "an object or null")
    return section


def read_truncation(spec: dict, added: int) -> dict | None:
    """`spec["truncation"]` checked: `{"max_length", "direction", "strategy", "stride"}`, or
    None (`added`: the template's special tokens)."""
    section = _section(spec, "truncation")
    if section is None:
        return None
    strategy = section.get("strategy", "LongestFirst")
    if strategy not in ("LongestFirst", "OnlyFirst"):  # OnlySecond fails on one sequence
        _refuse("truncation.strategy", strategy, "LongestFirst or OnlyFirst (`tokenizers` "
                "fails on every single text with OnlySecond)")
    max_length = _count("truncation.max_length", section.get("max_length"))
    stride = _count("truncation.stride", section.get("stride", 0))
    if stride and stride >= max_length - added:  # `tokenizers` raises or panics on long texts
        _refuse("truncation.stride", stride, f"below max_length ({max_length}) less the "
                f"template's {added} special tokens")
    return {"max_length": max_length, "stride": stride, "strategy": strategy,
            "direction": _direction("truncation", section.get("direction", "Right"))}


def read_padding(spec: dict) -> dict | None:
    """`spec["padding"]` checked: `{"length" (None: the batch's longest), "direction",
    "pad_to_multiple_of", "pad_id", "pad_type_id", "pad_token"}`, or None."""
    section = _section(spec, "padding")
    if section is None:
        return None
    strategy = section.get("strategy", "BatchLongest")
    if strategy == "BatchLongest":
        length = None
    elif isinstance(strategy, dict) and list(strategy) == ["Fixed"]:
        length = _count("padding.strategy.Fixed", strategy["Fixed"])
    else:
        _refuse("padding.strategy", strategy, '"BatchLongest" or {"Fixed": n}')
    pad_id = section.get("pad_id", 0)
    if isinstance(pad_id, bool) or not isinstance(pad_id, int) or not 0 <= pad_id < 2 ** 31:
        _refuse("padding.pad_id", pad_id, "an id (a non-negative 32-bit integer)")
    return {"length": length, "direction": _direction("padding", section.get("direction",
                                                                             "Right")),
            "pad_to_multiple_of": _count("padding.pad_to_multiple_of",
                                         section.get("pad_to_multiple_of"), allow_none=True),
            "pad_id": pad_id, "pad_type_id": section.get("pad_type_id", 0),
            "pad_token": section.get("pad_token", "[PAD]")}


def truncate_ids(ids: tf.RaggedTensor, truncation: dict, added: int) -> tf.RaggedTensor:
    """Ids `(B, None)` of the text alone, truncated so that with the `added` special tokens
    a row has at most `truncation["max_length"]`."""
    limit = truncation["max_length"] - added
    if limit < 0:  # `tokenizers` leaves the encoding whole
        return ids
    position = row_positions(ids)  # (N,)
    if truncation["direction"] == "Right":
        keep = position < limit
    else:
        keep = position >= tf.gather(ids.row_lengths(), ids.value_rowids()) - limit
    return keep_values(ids, keep)


def pad_ids(ids: tf.RaggedTensor, padding: dict) -> tf.RaggedTensor:
    """Ids `(B, None)` padded with `padding["pad_id"]` (see the module docstring)."""
    lengths = ids.row_lengths()  # (B,)
    target = (tf.constant(padding["length"], tf.int64) if padding["length"] is not None
              else tf.reduce_max(tf.concat([lengths, [0]], 0)))
    multiple = padding["pad_to_multiple_of"]
    if multiple:
        target = (target + multiple - 1) // multiple * multiple
    missing = tf.maximum(target - lengths, 0)
    pads = tf.RaggedTensor.from_row_lengths(
        tf.fill([tf.reduce_sum(missing)], tf.constant(padding["pad_id"], ids.dtype)), missing)
    parts = [ids, pads] if padding["direction"] == "Right" else [pads, ids]
    return tf.concat(parts, axis=1)
