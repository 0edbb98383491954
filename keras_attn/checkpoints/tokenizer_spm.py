"""SentencePiece checkpoints (`tokenizer.model` with its `tokenizer.json`: Llama 2, Mistral) as
TensorFlow ops.

The model is tensorflow-text's `SentencepieceTokenizer`; what `tokenizer.json` does around it
is reproduced: added tokens split out first; then per segment the space handling, either a
`Prepend("▁")` + `Replace(" ", "▁")` normalizer (the Llama 2 uploads: every segment gets the
prefix) or a `Metaspace` pre-tokenizer (`prepend_scheme` `"always"`: every segment that does
not already start with a space, `"first"`: only the text's first segment, `"never"`). The
SentencePiece model's own dummy prefix is switched off so that only those rules add one. On
the way back the decoder chain `Replace("▁", " ")`, `ByteFallback` (a run of `<0x..>` tokens
decodes as UTF-8, or to one U+FFFD per byte when invalid), `Fuse`, `Strip(" ", 1, 0)`.
"""

from __future__ import annotations

import os
import re

import numpy as np
import tensorflow as tf
import tensorflow_text as tf_text

from keras_attn.checkpoints.tokenizer_base import (
    CheckpointTokenizer,
    added_tokens,
    expect_component,
    model_vocab,
    refuse_tokenizer,
)
from keras_attn.checkpoints.tokenizer_ragged import join_rows

SPACE = "▁"
DECODER = [{"type": "Replace", "pattern": {"String": SPACE}, "content": " "},
           {"type": "ByteFallback"}, {"type": "Fuse"},
           {"type": "Strip", "content": " ", "start": 1, "stop": 0}]
PREPEND_NORMALIZER = {"type": "Sequence", "normalizers": [
    {"type": "Prepend", "prepend": SPACE},
    {"type": "Replace", "pattern": {"String": " "}, "content": SPACE}]}
BYTE_PIECE = re.compile(r"<0x([0-9A-F]{2})>")
REPLACEMENT = "\ufffd".encode()


def _prefix_rule(spec: dict) -> str:
    """`"segment"` (Prepend: every non-empty segment), `"always"`, `"first"` or `"never"`."""
    normalizer, pre = spec.get("normalizer"), spec.get("pre_tokenizer")
    if normalizer == PREPEND_NORMALIZER and pre is None:
        return "segment"
    if normalizer is None and isinstance(pre, dict) and pre.get("type") == "Metaspace":
        if pre.get("replacement") != SPACE or pre.get("split"):
            refuse_tokenizer("pre_tokenizer", pre, "expected Metaspace('▁', split=False)")
        scheme = pre.get("prepend_scheme", "always")
        if scheme not in ("always", "first", "never"):
            refuse_tokenizer("pre_tokenizer.prepend_scheme", scheme, "unknown scheme")
        return scheme
    refuse_tokenizer("normalizer", normalizer, "expected Llama's Prepend/Replace normalizer, or "
                     f"none with a Metaspace pre-tokenizer (pre_tokenizer={pre!r})")
    return ""


def _model_proto(directory: str, pieces: list[str], byte_fallback: bool) -> bytes:
    """The SentencePiece model without its dummy prefix, after checking that it is the model
    `tokenizer.json` describes."""
    from sentencepiece import sentencepiece_model_pb2

    proto = sentencepiece_model_pb2.ModelProto()
    with open(os.path.join(directory, "tokenizer.model"), "rb") as file:
        proto.ParseFromString(file.read())
    normalizer = proto.normalizer_spec
    if normalizer.name != "identity" or normalizer.precompiled_charsmap:
        refuse_tokenizer("tokenizer.model normalizer_spec.name", normalizer.name,
                         "only the identity normalization is reproduced")
    if normalizer.remove_extra_whitespaces or not normalizer.escape_whitespaces:
        refuse_tokenizer("tokenizer.model normalizer_spec.remove_extra_whitespaces",
                         normalizer.remove_extra_whitespaces, "tokenizer.json keeps every space")
    if proto.trainer_spec.model_type != proto.trainer_spec.BPE:
        refuse_tokenizer("tokenizer.model trainer_spec.model_type",
                         proto.trainer_spec.model_type, "expected BPE")
    if [piece.piece for piece in proto.pieces] != pieces[:len(proto.pieces)]:
        refuse_tokenizer("tokenizer.model", "pieces", "they differ from tokenizer.json's vocab")
    if proto.trainer_spec.byte_fallback != byte_fallback:
        refuse_tokenizer("model.byte_fallback", byte_fallback, "tokenizer.model says "
                         f"{proto.trainer_spec.byte_fallback}")
    normalizer.add_dummy_prefix = False  # the prefix rule above decides
    return proto.SerializeToString()


class SentencePieceTokenizer(CheckpointTokenizer):
    """SentencePiece BPE with `tokenizer.json`'s space handling and decoder."""

    def __init__(self, spec: dict, directory: str):
        model = spec["model"]
        if model.get("type") != "BPE" or model.get("dropout") not in (None, 0.0):
            refuse_tokenizer("model", {k: model.get(k) for k in ("type", "dropout")},
                             "expected a BPE model without dropout")
        expect_component(spec, "decoder", lambda d: d.get("type") == "Sequence"
                         and d.get("decoders") == DECODER,
                         "expected Replace('▁', ' '), ByteFallback, Fuse, Strip(' ', 1, 0)")
        self._rule = _prefix_rule(spec)
        added, special = added_tokens(spec, normalized_ok=False)
        tokens = self.init_from_spec("sentencepiece", spec, directory, model_vocab(model), added,
                                     special)
        self._model = tf_text.SentencepieceTokenizer(
            _model_proto(directory, tokens, bool(model.get("byte_fallback"))), out_type=tf.int32)
        is_byte = np.zeros(len(tokens), bool)
        texts = []
        for index, token in enumerate(tokens):
            match = BYTE_PIECE.fullmatch(token)
            is_byte[index] = match is not None and bool(model.get("byte_fallback"))
            texts.append(bytes([int(match.group(1), 16)]) if is_byte[index]
                         else token.replace(SPACE, " ").encode())
        self._texts, self._is_byte = tf.constant(texts), tf.constant(is_byte)

    def _encode_segments(self, segments, first):
        space = tf.strings.regex_replace(segments, "^[ ▁]", "")  # nothing to prepend?
        starts_with_space = tf.strings.length(space) < tf.strings.length(segments)
        prepend = {"segment": tf.ones_like(first), "always": ~starts_with_space,
                   "first": first & ~starts_with_space, "never": tf.zeros_like(first)}[self._rule]
        segments = tf.where(prepend, tf.strings.join([SPACE, segments]), segments)
        return self._model.tokenize(segments)

    def _decode_ids(self, ids):
        # Byte tokens as their bytes: right wherever every run of them is valid UTF-8, which
        # is when the rows are (the other tokens are whole characters); else run by run.
        joined = join_rows(tf.gather(self._texts, ids))  # (B,)
        valid = tf.equal(tf.strings.unicode_transcode(
            joined, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD,
            replace_control_characters=False), joined)
        text = tf.cond(tf.reduce_all(valid), lambda: joined, lambda: self._decode_runs(ids))
        return tf.strings.regex_replace(text, "^ ", "")

    def _decode_runs(self, ids):
        """Ids `(B, None)` -> text `(B,)` (before `Strip`), a run of byte tokens decoded as
        UTF-8, or as one U+FFFD per byte when invalid (`ByteFallback`)."""
        texts, is_byte = tf.gather(self._texts, ids), tf.gather(self._is_byte, ids)  # (B, T)
        flat_bytes, flat_texts = is_byte.flat_values, texts.flat_values
        # runs of byte tokens: a run starts at a byte token not preceded by one in its row
        rows = ids.value_rowids()
        same_row = tf.concat([[False], tf.equal(rows[1:], rows[:-1])], axis=0)
        previous = tf.concat([[False], flat_bytes[:-1]], axis=0) & same_row
        starts = flat_bytes & ~previous
        run = tf.cumsum(tf.cast(starts, tf.int32)) - 1  # run index of every byte token
        runs = tf.reduce_sum(tf.cast(starts, tf.int32))
        joined = tf.strings.unsorted_segment_join(tf.boolean_mask(flat_texts, flat_bytes),
                                                  tf.boolean_mask(run, flat_bytes), runs)
        lengths = tf.math.unsorted_segment_sum(tf.ones_like(tf.boolean_mask(run, flat_bytes)),
                                               tf.boolean_mask(run, flat_bytes), runs)
        valid = tf.equal(tf.strings.unicode_transcode(
            joined, "UTF-8", "UTF-8", errors="replace", replacement_char=0xFFFD,
            replace_control_characters=False), joined)
        replaced = tf.strings.reduce_join(tf.RaggedTensor.from_row_lengths(
            tf.fill([tf.reduce_sum(lengths)], REPLACEMENT), lengths), axis=1)
        run_text = tf.where(valid, joined, replaced)
        # (an extra "" so that the gather has a row to read when no id is a byte token)
        run_text = tf.concat([run_text, tf.constant([""])], axis=0)
        pieces = tf.where(starts, tf.gather(run_text, tf.maximum(run, 0)),
                          tf.where(flat_bytes, "", flat_texts))
        return join_rows(ids.with_flat_values(pieces))


def sentencepiece_tokenizer(directory: str, spec: dict | None) -> SentencePieceTokenizer:
    """The SentencePiece tokenizer of `directory` (see `load_tokenizer`)."""
    if spec is None:
        refuse_tokenizer("tokenizer.json", None, "a tokenizer.model alone does not say how the "
                         "`tokenizers` library treats spaces and special tokens")
    return SentencePieceTokenizer(spec, directory)
