"""What every checkpoint tokenizer shares: `CheckpointTokenizer` (added tokens split out
first, the template's special ids, ids back to text through the kind's decoder) and the
reading of `tokenizer.json`'s common parts. The kinds are in `tokenizer_bpe`, `tokenizer_spm`
and `tokenizer_wordpiece`; `tokenizer.load_tokenizer` picks one.
"""

from __future__ import annotations

import json
import os

import numpy as np
import tensorflow as tf

from keras_attn._checks import check_bool
from keras_attn._traced import TracedFunctions
from keras_attn.checkpoints.tokenizer_lengths import (
    pad_ids,
    read_padding,
    read_truncation,
    truncate_ids,
)
from keras_attn.checkpoints.tokenizer_ragged import (
    around,
    keep_values,
    nested,
    place_rows,
    row_positions,
)

# Bytes that never occur in UTF-8 text: a boundary marker inside a graph.
MARK = b"\xff"
# The key of a built `tokenizer.json` (from older files) for the bos/eos/pad/unk tokens that
# transformers assumes when `tokenizer_config.json` does not name them.
DEFAULT_SPECIALS = "_default_special_tokens"


def read_json(path: str) -> dict:
    """The JSON object in `path`, or a ValueError naming the file."""
    try:
        with open(path, encoding="utf-8") as file:
            value = json.load(file)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"Cannot load the tokenizer: {path} is not UTF-8 JSON ({error}).") \
            from error
    if not isinstance(value, dict):
        raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad files
            f"Cannot load the tokenizer: {path} must hold a JSON object. Received: "
            f"{type(value).__name__}")
    return value


def refuse_tokenizer(component: str, value, why: str) -> None:
    """Raise the ValueError of a tokenizer option the graph tokenizer cannot reproduce."""
    raise ValueError(f"Cannot load the tokenizer exactly: `{component}`={value!r} is not "
                     f"supported: {why}. Refused rather than approximated.")


def expect_component(spec: dict, component: str, accepted, why: str) -> dict:
    """`spec[component]` (`{}` when absent), refused (`refuse_tokenizer`) unless
    `accepted(value)`."""
    value = spec.get(component) or {}
    if not accepted(value):
        refuse_tokenizer(component, value, why)
    return value


def split_keeping(texts: tf.Tensor, pattern: str, dropped: str | None = None) -> tf.RaggedTensor:
    """Pieces of `texts` `(N,)` -> `(N, None)`: every match of the RE2 `pattern` is a piece,
    and so is the text between matches; matches of `dropped` (which never matches what
    `pattern` does) are removed; no piece is empty.

    tensorflow-text's `regex_split` does this but ends a text at its first NUL character;
    `tf.strings.regex_replace` and `tf.strings.split` do not, so the matches are fenced with
    `MARK` (a byte no UTF-8 text has) and the texts split there. The rewrites use the whole
    match (`\\0`), not a group, which RE2 finds several times faster.
    """
    if dropped is not None:
        texts = tf.strings.regex_replace(texts, dropped, MARK)
    fenced = tf.strings.regex_replace(texts, pattern, MARK + b"\\0" + MARK)
    pieces = tf.strings.split(fenced, sep=MARK)
    return keep_values(pieces, tf.strings.length(pieces.flat_values) > 0)


def _token_content(value):
    return value.get("content") if isinstance(value, dict) else value


def template_ids(post_processor, token_to_id) -> tuple[list[int], list[int]]:
    """The special ids a post-processor puts before and after a single sequence."""
    if post_processor is None:
        return [], []
    kind = post_processor.get("type")
    if kind == "Sequence":
        prefix, suffix = [], []
        for step in post_processor["processors"]:
            before, after = template_ids(step, token_to_id)
            prefix, suffix = prefix + before, suffix + after
        return prefix, suffix
    if kind == "ByteLevel":  # offsets only
        return [], []
    if kind in ("BertProcessing", "RobertaProcessing"):
        return [post_processor["cls"][1]], [post_processor["sep"][1]]
    if kind != "TemplateProcessing":
        refuse_tokenizer("post_processor.type", kind, "expected TemplateProcessing, "
                         "BertProcessing, RobertaProcessing, ByteLevel or a Sequence of them")
    items = post_processor["single"]
    sequences = [i for i, item in enumerate(items) if "Sequence" in item]
    if len(sequences) != 1 or items[sequences[0]]["Sequence"]["id"] != "A":
        refuse_tokenizer("post_processor.single", items, "expected one `$A`")
    specials = post_processor.get("special_tokens", {})

    def ids(part):
        out = []
        for item in part:
            name = item["SpecialToken"]["id"]
            out.extend(specials[name]["ids"] if name in specials else [token_to_id(name)])
        return out

    return ids(items[:sequences[0]]), ids(items[sequences[0] + 1:])


class CheckpointTokenizer(tf.Module):
    """The tokenizer of a pretrained checkpoint, as TensorFlow ops.

    Build it with `load_tokenizer(directory)`. Added tokens (`<|endoftext|>`, `[CLS]`, …) in
    the text are matched first (longest first) and encoded as their ids; the rest goes
    through the kind's normalizer, pre-tokenizer and model.

    Inside a `tf.function`, a `tf.data` map or a SavedModel, `encode` and `decode` are ops of
    that graph. Called eagerly, each runs one traced function per set of options, traced by
    its first call (about a second for a byte-level BPE; `benchmarks/tokenizer_speed.py`).

    Args:
        kind: str, `"byte_level_bpe"`, `"sentencepiece"` or `"wordpiece"`.
        tokens: list of str, the token of every id (`""` where the id space has a hole).
        added: dict from added-token content to id.
        special: list of int, the ids `decode(skip_special_tokens=True)` drops.
        prefix: list of int, the template's ids before the text.
        suffix: list of int, the template's ids after it.
        special_tokens: dict with the ids of `"bos"`, `"eos"`, `"pad"`, `"unk"` (None when the
            tokenizer has none).
        truncation: optional dict, `tokenizer.json`'s `truncation` section
            (`tokenizer_lengths.read_truncation`), applied by `encode`. Defaults to `None`.
        padding: optional dict, its `padding` section (`tokenizer_lengths.read_padding`),
            applied by `encode`. Defaults to `None`.

    Example:
    >>> tokenizer = load_tokenizer("path/to/checkpoint")
    >>> ids = tokenizer.encode(["Hello world"])  # tf.RaggedTensor (1, None) int32
    >>> tokenizer.decode(ids)  # tf.Tensor [b"Hello world"]
    """

    def __init__(self, kind: str, tokens: list[str], added: dict[str, int], special: list[int],
                 prefix: list[int], suffix: list[int], special_tokens: dict,
                 truncation: dict | None = None, padding: dict | None = None, name=None):
        super().__init__(name=name)
        self.kind = kind
        self.truncation = None if truncation is None else dict(truncation)
        self._functions = TracedFunctions()
        self.padding = None if padding is None else dict(padding)
        self.tokens = list(tokens)
        self.vocab_size = len(tokens)
        self.added = dict(added)
        self.special_tokens = dict(special_tokens)
        self.bos_token_id = special_tokens.get("bos")
        self.eos_token_id = special_tokens.get("eos")
        self.pad_token_id = special_tokens.get("pad")
        self._prefix = tf.constant(prefix, tf.int32, shape=[len(prefix)])
        self._suffix = tf.constant(suffix, tf.int32, shape=[len(suffix)])
        dropped = np.zeros(self.vocab_size, bool)
        dropped[[i for i in special if 0 <= i < self.vocab_size]] = True
        dropped[[i for i, token in enumerate(tokens) if token == ""]] = True
        self._dropped_if_special = tf.constant(dropped)
        holes = np.array([token == "" for token in tokens], bool)
        self._holes = tf.constant(holes)
        self._added_table = None
        if added:
            contents = sorted(added, key=len, reverse=True)  # leftmost, then longest
            self._added_pattern = "|".join(_re2_escape(c) for c in contents)
            self._added_table = tf.lookup.StaticHashTable(
                tf.lookup.KeyValueTensorInitializer(tf.constant(contents),
                                                    tf.constant([added[c] for c in contents],
                                                                tf.int32)), -1)

    def init_from_spec(self, kind: str, spec: dict, directory: str, vocab: dict[str, int],
                       added: dict[str, int], special: list[int]) -> list[str]:
        """What every kind's constructor does with `tokenizer.json` once its own checks have
        passed: the id table of `vocab` and the added tokens, the post-processor's template
        and the special ids of the directory; returns the token of every id."""
        tokens = id_table(vocab, added)
        lookup = {**vocab, **added}.get
        prefix, suffix = template_ids(spec.get("post_processor"), lookup)
        specials = special_ids(directory, lookup, spec.get(DEFAULT_SPECIALS))
        CheckpointTokenizer.__init__(
            self, kind, tokens, added, special, prefix, suffix, specials,
            read_truncation(spec, len(prefix) + len(suffix)), read_padding(spec))
        return tokens

    @property
    def prefix_ids(self) -> list[int]:
        """The ids the template puts before the text (e.g. `[bos]`, `[CLS]`)."""
        return [int(i) for i in self._prefix.numpy()]

    @property
    def suffix_ids(self) -> list[int]:
        """The ids the template puts after the text (e.g. `[SEP]`)."""
        return [int(i) for i in self._suffix.numpy()]

    # --- what each kind provides -----------------------------------------------------------

    def _encode_segments(self, segments: tf.Tensor, first: tf.Tensor) -> tf.RaggedTensor:
        """Segments of text without added tokens `(N,)` (and whether each starts the text)
        -> ids `(N, None)`."""
        raise NotImplementedError

    def _decode_ids(self, ids: tf.RaggedTensor) -> tf.Tensor:
        """Valid ids `(B, None)` -> strings `(B,)`."""
        raise NotImplementedError

    # --- the shared pipeline ---------------------------------------------------------------

    def _segments(self, texts: tf.Tensor):
        """Split out added tokens: segments `(B, S)`, their added ids (-1: plain text) and
        whether each segment starts its text."""
        if self._added_table is None:
            nonempty = tf.strings.length(texts) > 0
            segments = tf.RaggedTensor.from_row_lengths(tf.boolean_mask(texts, nonempty), tf.cast(
                nonempty, tf.int64), validate=False)  # (B, 0 or 1)
        else:
            segments = split_keeping(texts, self._added_pattern)  # (B, S)
        flat = segments.flat_values
        added = (self._added_table.lookup(flat) if self._added_table is not None
                 else tf.fill(tf.shape(flat), -1))
        return segments, added, tf.equal(row_positions(segments), 0)

    @tf.autograph.experimental.do_not_convert  # graph control flow is explicit: tracing
    def encode(self, texts, add_special_tokens: bool = True, truncate: bool = True,
               pad: bool = True) -> tf.RaggedTensor:
        """Token ids of `texts`, as `tokenizers.Tokenizer.encode_batch(texts)` gives them.

        `tokenizer.json`'s `truncation` and `padding` sections (`self.truncation`,
        `self.padding`) are applied as `tokenizers` applies them (see `tokenizer_lengths`).

        Args:
            texts: string tensor or list of str, `(B,)` (a scalar is a batch of one), valid
                UTF-8.
            add_special_tokens: bool, whether to add the template's special tokens (BOS,
                `[CLS]`/`[SEP]`). Defaults to `True`.
            truncate: bool, whether to apply the `truncation` section (when there is one).
                Defaults to `True`.
            pad: bool, whether to apply the `padding` section (when there is one). Defaults
                to `True`.

        Returns:
            `tf.RaggedTensor` of int32, `(B, None)`.
        """
        for name, value in (("add_special_tokens", add_special_tokens), ("truncate", truncate),
                            ("pad", pad)):
            check_bool(name, value)
        texts = _texts_batch(texts)
        if tf.executing_eagerly():  # one traced graph per option set, not op by op
            return self._compiled(("encode", add_special_tokens, truncate, pad), lambda t: (
                self._encode(t, add_special_tokens, truncate, pad)), _TEXTS)(texts)
        return self._encode(texts, add_special_tokens, truncate, pad)

    def _encode(self, texts, add_special_tokens, truncate, pad):
        segments, added_ids, first = self._segments(texts)  # (B, S)
        plain = added_ids < 0
        encoded = self._encode_segments(tf.boolean_mask(segments.flat_values, plain),
                                        tf.boolean_mask(first, plain))
        added = tf.boolean_mask(added_ids, ~plain)
        rows = place_rows([(tf.where(plain)[:, 0], tf.cast(encoded.flat_values, tf.int32),
                            encoded.row_lengths()),
                           (tf.where(~plain)[:, 0], added, tf.ones_like(added, tf.int64))],
                          tf.size(added_ids, tf.int64))  # (B * S, None) in text order
        ids = nested(segments, rows)  # (B, None)
        if truncate and self.truncation is not None:
            special = int(self._prefix.shape[0] + self._suffix.shape[0])
            ids = truncate_ids(ids, self.truncation, special if add_special_tokens else 0)
        if add_special_tokens:
            ids = around(ids, self._prefix, self._suffix)
        if pad and self.padding is not None:
            ids = pad_ids(ids, self.padding)
        return ids

    def _compiled(self, key, function, *signature):
        """`function` traced once per `key` for the tensors of `signature`."""
        return self._functions.get(key, function, *signature)

    @tf.autograph.experimental.do_not_convert  # without autograph takes seconds less
    def decode(self, ids, skip_special_tokens: bool = True) -> tf.Tensor:
        """Text of token ids, as `tokenizers.Tokenizer.decode(ids, skip_special_tokens)`.

        Ids outside the vocabulary are dropped (the `tokenizers` library skips them too).

        Args:
            ids: integer tensor `(B, T)`, `tf.RaggedTensor` `(B, None)` or a list of lists of
                int.
            skip_special_tokens: bool, whether special tokens are dropped. Defaults to `True`.

        Returns:
            string tensor `(B,)`.
        """
        check_bool("skip_special_tokens", skip_special_tokens)
        ids = _ids_batch(ids)  # int64: an id past int32 is outside, not wrapped into it
        if tf.executing_eagerly():
            return self._compiled(("decode", skip_special_tokens), lambda values, splits: (
                self._decode(tf.RaggedTensor.from_row_splits(values, splits, validate=False),
                             skip_special_tokens)), _IDS, _IDS)(ids.flat_values, ids.row_splits)
        return self._decode(ids, skip_special_tokens)

    def _decode(self, ids, skip_special_tokens):
        flat = ids.flat_values  # (N,) int64
        inside = (flat >= 0) & (flat < self.vocab_size)
        flat = tf.cast(tf.where(inside, flat, 0), tf.int32)
        dropped = tf.gather(self._dropped_if_special if skip_special_tokens else self._holes,
                            flat)
        return self._decode_kept(ids.with_flat_values(flat), inside & ~dropped)

    def _decode_kept(self, ids: tf.RaggedTensor, keep: tf.Tensor) -> tf.Tensor:
        """Ids `(B, None)` of the vocabulary and which of them are decoded `(N,)` -> strings
        `(B,)`."""
        return self._decode_ids(keep_values(ids, keep))


_TEXTS = tf.TensorSpec([None], tf.string)
_IDS = tf.TensorSpec([None], tf.int64)  # the values and row splits of ids (B, None)


def _texts_batch(texts) -> tf.Tensor:
    """`encode`'s `texts` as a string tensor `(B,)` of valid UTF-8, or a ValueError."""
    if isinstance(texts, tf.RaggedTensor):
        texts_shape = texts.shape
    else:
        try:
            texts = tf.convert_to_tensor(texts, tf.string)
        except (TypeError, ValueError) as error:
            raise ValueError("Argument `texts` must be a string or a batch (list, 1-D tensor) "
                             f"of strings. Received: texts={texts!r:.200}") from error
        texts_shape = texts.shape
        if texts_shape.rank == 0:
            return _utf8_checked(texts[None])
        if texts_shape.rank == 1:
            return _utf8_checked(texts)
    raise ValueError("Argument `texts` must be a string or a 1-D batch of strings (nested "
                     "lists are not joined into one text; pairs are not supported). Received: "
                     f"texts of shape {texts_shape}")


def _utf8_checked(texts: tf.Tensor) -> tf.Tensor:
    """`texts` `(B,)`, after checking that every text is valid UTF-8 (eagerly a ValueError;
    in a graph an assertion that fails the call)."""
    valid = tf.equal(tf.strings.unicode_transcode(texts, "UTF-8", "UTF-8", errors="replace",
                                                  replacement_char=0xFFFD,
                                                  replace_control_characters=False), texts)
    message = "Argument `texts` must be valid UTF-8; invalid in row"
    if tf.executing_eagerly():
        bad = np.flatnonzero(~valid.numpy())
        if bad.size:
            raise ValueError(f"{message} {int(bad[0])}: {texts[int(bad[0])].numpy()[:80]!r}")
        return texts
    check = tf.debugging.Assert(tf.reduce_all(valid), [message, tf.where(~valid)[:1, 0]])
    with tf.control_dependencies([check]):
        return tf.identity(texts)


def _ids_batch(ids) -> tf.RaggedTensor:
    """`decode`'s `ids` as an int64 `tf.RaggedTensor` `(B, None)`, or a ValueError."""
    if isinstance(ids, (list, tuple)):
        rows = [row.tolist() if isinstance(row, np.ndarray) else row for row in ids]
        flat = [x for row in rows if isinstance(row, (list, tuple)) for x in row]
        values = np.asarray(flat if flat else np.zeros([0], np.int64))
        if (not all(isinstance(row, (list, tuple)) for row in rows) or values.ndim != 1
                or values.dtype.kind not in "iu"):  # (much faster than tf.ragged.constant)
            raise ValueError("Argument `ids` must be a batch of token id sequences (a list of "
                             f"lists of int; floats are not truncated to ids). Received: "
                             f"ids={ids!r:.200}")
        return tf.RaggedTensor.from_row_lengths(values.astype(np.int64),
                                                [len(row) for row in rows], validate=False)
    elif not isinstance(ids, tf.RaggedTensor):
        try:
            ids = tf.convert_to_tensor(ids)
        except (TypeError, ValueError) as error:
            raise ValueError("Argument `ids` must be an integer tensor (batch, length). "
                             f"Received: ids={ids!r:.200}") from error
    values = ids.flat_values if isinstance(ids, tf.RaggedTensor) else ids
    if values.shape.num_elements() == 0:  # `[[]]` is a float32 list to TensorFlow
        ids = tf.cast(ids, tf.int64)
    if not ids.dtype.is_integer or ids.shape.rank != 2:
        raise ValueError("Argument `ids` must be integer token ids of shape (batch, length) "
                         "(a list of lists of int, a 2-D tensor or a RaggedTensor); floats are "
                         f"not truncated to ids. Received: ids of dtype {ids.dtype.name} and "
                         f"shape {ids.shape}")
    if not isinstance(ids, tf.RaggedTensor):
        ids = tf.RaggedTensor.from_tensor(ids)
    return tf.cast(ids, tf.int64).with_row_splits_dtype(tf.int64)


def _re2_escape(text: str) -> str:
    return "".join(f"\\x{{{ord(c):x}}}" for c in text)


def special_ids(directory: str, token_to_id, defaults: dict | None = None) -> dict:
    """bos/eos/pad/unk ids from `tokenizer_config.json` (or `special_tokens_map.json`), else
    of the tokens in `defaults` (key -> token)."""
    found = {key: token_to_id(token) for key, token in (defaults or {}).items()}
    found = {key: index for key, index in found.items() if index is not None}
    explicit = set()
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            config = read_json(path)
            for key in ("bos", "eos", "pad", "unk"):
                content = _token_content(config.get(f"{key}_token"))
                if key not in explicit and content is not None:
                    found[key] = token_to_id(content)
                    explicit.add(key)
    return {key: found.get(key) for key in ("bos", "eos", "pad", "unk")}


def added_tokens(spec: dict, normalized_ok: bool) -> tuple[dict[str, int], list[int]]:
    """`tokenizer.json`'s added tokens (content -> id) and the special ones' ids (an empty
    content is skipped, as `tokenizers` skips it)."""
    added, special = {}, []
    for token in spec.get("added_tokens") or []:
        if not isinstance(token, dict) or not isinstance(token.get("content"), str) or not (
                isinstance(token.get("id"), int) and token["id"] >= 0):
            refuse_tokenizer("added_tokens", token, "expected {content, id} entries")
        if token["content"] == "":
            continue
        for option in ("lstrip", "rstrip", "single_word"):
            if token.get(option):
                refuse_tokenizer(f"added_tokens[{token['content']!r}].{option}", True,
                                 "added tokens are matched as exact strings only")
        if token.get("normalized") and not normalized_ok:
            refuse_tokenizer(f"added_tokens[{token['content']!r}].normalized", True,
                             "added tokens are matched before the normalizer")
        added[token["content"]] = token["id"]
        if token.get("special"):
            special.append(token["id"])
    return added, special


def model_vocab(model: dict) -> dict[str, int]:
    """`model["vocab"]`, checked: token -> non-negative id (what `tokenizers` reads)."""
    vocab = model.get("vocab")
    if not isinstance(vocab, dict) or not all(
            isinstance(index, int) and not isinstance(index, bool) and index >= 0
            for index in vocab.values()):
        refuse_tokenizer("model.vocab", type(vocab).__name__, "expected token -> id")
    return vocab


def id_table(vocab: dict[str, int], added: dict[str, int]) -> list[str]:
    """The token of every id, `""` for ids no token has."""
    size = max(list(vocab.values()) + list(added.values()), default=-1) + 1
    tokens = [""] * size
    for token, index in {**vocab, **added}.items():
        tokens[index] = token
    return tokens
