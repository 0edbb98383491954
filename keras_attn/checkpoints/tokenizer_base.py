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
import tensorflow_text as tf_text

# Bytes that never occur in UTF-8 text: a boundary marker inside a graph.
MARK = b"\xff"


def read_json(path: str):
    with open(path, encoding="utf-8") as file:
        return json.load(file)


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

    Args:
        kind: str, `"byte_level_bpe"`, `"sentencepiece"` or `"wordpiece"`.
        tokens: list of str, the token of every id (`""` where the id space has a hole).
        added: dict from added-token content to id.
        special: list of int, the ids `decode(skip_special_tokens=True)` drops.
        prefix: list of int, the template's ids before the text.
        suffix: list of int, the template's ids after it.
        special_tokens: dict with the ids of `"bos"`, `"eos"`, `"pad"`, `"unk"` (None when the
            tokenizer has none).

    Example:
    >>> tokenizer = load_tokenizer("path/to/checkpoint")
    >>> ids = tokenizer.encode(["Hello world"])  # tf.RaggedTensor (1, None) int32
    >>> tokenizer.decode(ids)  # tf.Tensor [b"Hello world"]
    """

    def __init__(self, kind: str, tokens: list[str], added: dict[str, int], special: list[int],
                 prefix: list[int], suffix: list[int], special_tokens: dict, name=None):
        super().__init__(name=name)
        self.kind = kind
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
        CheckpointTokenizer.__init__(self, kind, tokens, added, special, prefix, suffix,
                                     special_ids(directory, lookup))
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
            segments = tf.RaggedTensor.from_tensor(texts[:, None])  # (B, 1)
            segments = tf.ragged.boolean_mask(segments, tf.strings.length(segments) > 0)
            flat = segments.flat_values
            return segments, tf.fill(tf.shape(flat), -1), tf.ones(tf.shape(flat), tf.bool)
        segments, starts, _ = tf_text.regex_split_with_offsets(
            texts, self._added_pattern, self._added_pattern)  # (B, S)
        flat = segments.flat_values
        return segments, self._added_table.lookup(flat), tf.equal(starts.flat_values, 0)

    def encode(self, texts, add_special_tokens: bool = True) -> tf.RaggedTensor:
        """Token ids of `texts`, as `tokenizers.Tokenizer.encode(text).ids`.

        Args:
            texts: string tensor or list of str, `(B,)` (a scalar is a batch of one).
            add_special_tokens: bool, whether to add the template's special tokens (BOS,
                `[CLS]`/`[SEP]`). Defaults to `True`.

        Returns:
            `tf.RaggedTensor` of int32, `(B, None)`.
        """
        texts = tf.convert_to_tensor(texts, tf.string)
        if texts.shape.rank == 0:
            texts = texts[None]
        segments, added_ids, first = self._segments(texts)
        plain = added_ids < 0
        encoded = self._encode_segments(tf.boolean_mask(segments.flat_values, plain),
                                        tf.boolean_mask(first, plain))
        added_rows = tf.RaggedTensor.from_row_lengths(
            tf.boolean_mask(added_ids, ~plain), tf.ones_like(tf.boolean_mask(added_ids, ~plain),
                                                             tf.int64))
        position = tf.concat([tf.where(plain)[:, 0], tf.where(~plain)[:, 0]], axis=0)
        rows = tf.gather(tf.concat([tf.cast(encoded, tf.int32), added_rows], axis=0),
                         tf.argsort(position))  # (N, None) back in text order
        ids = tf.RaggedTensor.from_row_splits(rows, segments.row_splits).merge_dims(1, 2)
        if add_special_tokens:
            batch = tf.shape(texts)[:1]
            prefix = tf.RaggedTensor.from_tensor(tf.tile(self._prefix[None], tf.concat(
                [batch, [1]], 0)))
            suffix = tf.RaggedTensor.from_tensor(tf.tile(self._suffix[None], tf.concat(
                [batch, [1]], 0)))
            ids = tf.concat([prefix, ids, suffix], axis=1)
        return ids

    def decode(self, ids, skip_special_tokens: bool = True) -> tf.Tensor:
        """Text of token ids, as `tokenizers.Tokenizer.decode(ids, skip_special_tokens)`.

        Ids outside the vocabulary are dropped (the `tokenizers` library skips them too).

        Args:
            ids: int tensor `(B, T)`, `tf.RaggedTensor` `(B, None)` or nested lists.
            skip_special_tokens: bool, whether special tokens are dropped. Defaults to `True`.

        Returns:
            string tensor `(B,)`.
        """
        if isinstance(ids, (list, tuple)):
            ids = tf.ragged.constant(ids, dtype=tf.int32, ragged_rank=1)
        elif not isinstance(ids, tf.RaggedTensor):
            ids = tf.RaggedTensor.from_tensor(tf.convert_to_tensor(ids))
        ids = tf.cast(ids, tf.int32)
        inside = (ids >= 0) & (ids < self.vocab_size)
        ids = tf.ragged.boolean_mask(ids, inside)
        dropped = tf.gather(self._dropped_if_special if skip_special_tokens else self._holes,
                            ids)
        return self._decode_ids(tf.ragged.boolean_mask(ids, ~dropped))


def _re2_escape(text: str) -> str:
    return "".join(f"\\x{{{ord(c):x}}}" for c in text)


def special_ids(directory: str, token_to_id) -> dict:
    """bos/eos/pad/unk ids from `tokenizer_config.json` (or `special_tokens_map.json`)."""
    found = {}
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            config = read_json(path)
            for key in ("bos", "eos", "pad", "unk"):
                content = _token_content(config.get(f"{key}_token"))
                if key not in found and content is not None:
                    found[key] = token_to_id(content)
    return {key: found.get(key) for key in ("bos", "eos", "pad", "unk")}


def added_tokens(spec: dict, normalized_ok: bool) -> tuple[dict[str, int], list[int]]:
    """`tokenizer.json`'s added tokens (content -> id) and the special ones' ids."""
    added, special = {}, []
    for token in spec.get("added_tokens") or []:
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


def id_table(vocab: dict[str, int], added: dict[str, int]) -> list[str]:
    """The token of every id, `""` for ids no token has."""
    size = max(list(vocab.values()) + list(added.values()), default=-1) + 1
    tokens = [""] * size
    for token, index in {**vocab, **added}.items():
        tokens[index] = token
    return tokens
