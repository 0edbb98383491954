"""BERT's WordPiece (`tokenizer.json`, or `vocab.txt` + `tokenizer_config.json`) as TensorFlow
ops.

`BertNormalizer` is reproduced step by step, in its order: `clean_text` drops NUL, U+FFFD and
control characters (Cc except tab/newline/return, the 150 format characters (Cf) of the
`tokenizers` library's tables, private use) and turns tab, newline, return and space
separators into spaces; `handle_chinese_chars` surrounds CJK ideographs with spaces (the
library's ranges, which skip U+2B820-U+2B91F); `strip_accents` is NFD then no nonspacing marks;
`lowercase` maps each character to its lowercase on its own (U+0130 to `i` + U+0307 and Σ
always to σ, as Rust's `char::to_lowercase` does; ICU would write a final ς).
`BertPreTokenizer` splits on whitespace and isolates punctuation (ASCII punctuation and Unicode
`P*`); the words go through tensorflow-text's `FastWordpieceTokenizer` (longest match first,
`[UNK]` for a word it cannot cover or longer than `max_input_chars_per_word` characters). The
`WordPiece` decoder joins `##` pieces, puts a space before the others and applies its cleanup
to each token; without a decoder (`"decoder": null`) the tokens are joined with spaces, as the
`tokenizers` library joins them.
"""

from __future__ import annotations

import os

import tensorflow as tf
import tensorflow_text as tf_text

from keras_attn.checkpoints.tokenizer_base import (
    CheckpointTokenizer,
    _token_content,
    added_tokens,
    expect_component,
    model_vocab,
    read_json,
    refuse_tokenizer,
    split_keeping,
)
from keras_attn.checkpoints.tokenizer_bpe import WS
from keras_attn.checkpoints.tokenizer_ragged import join_rows, nested, row_positions

FORMAT = (r"\x{ad}\x{600}-\x{605}\x{61c}\x{6dd}\x{70f}\x{180e}\x{200b}-\x{200f}\x{202a}-\x{202e}"
          r"\x{2060}-\x{2064}\x{2066}-\x{206f}\x{feff}\x{fff9}-\x{fffb}\x{110bd}"
          r"\x{1bca0}-\x{1bca3}\x{1d173}-\x{1d17a}\x{e0001}\x{e0020}-\x{e007f}")
CLEAN_REMOVED = r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\x{fffd}\p{Co}" + FORMAT + "]"
CLEAN_SPACE = r"[\t\n\r\p{Zs}\x{2028}\x{2029}]"
CJK = (r"[\x{4e00}-\x{9fff}\x{3400}-\x{4dbf}\x{20000}-\x{2a6df}\x{2a700}-\x{2b73f}"
       r"\x{2b740}-\x{2b81f}\x{2b920}-\x{2ceaf}\x{f900}-\x{faff}\x{2f800}-\x{2fa1f}]")
PUNCTUATION = r"[!-/:-@\[-`{-~\p{P}]"
CLEANUP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"),
           (" 'm", "'m"), (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"),
           (" 're", "'re"))
NORMALIZER_KEYS = {"type", "clean_text", "handle_chinese_chars", "strip_accents", "lowercase"}


def _literal(text: str) -> str:
    return "".join(f"\\x{{{ord(c):x}}}" for c in text)


# CLEANUP on a token whose only space is the first character: the patterns that can match
CLEANUP_FIRST = "^ (" + "|".join(_literal(old[1:]) for old, _ in CLEANUP
                                  if " " not in old[1:]) + ")"


def _lower(text: tf.Tensor) -> tf.Tensor:
    """`tf.strings.lower` (UTF-8) of every piece between NUL characters, which it would end
    the text at (`clean_text=False` keeps them)."""
    pieces = tf.strings.split(text, sep="\x00")  # (N, P)
    last = tf.equal(row_positions(pieces), tf.gather(pieces.row_lengths() - 1,
                                                     pieces.value_rowids()))
    nul = tf.where(last, "", tf.constant(b"\x00"))  # a NUL tensor: an attribute would end at it
    lowered = tf.strings.join([tf.strings.lower(pieces.flat_values, encoding="utf-8"), nul])
    return join_rows(pieces.with_flat_values(lowered))


def _from_vocab_txt(directory: str) -> dict:
    """The `tokenizer.json` transformers' `BertTokenizer` builds from `vocab.txt` and
    `tokenizer_config.json`."""
    config_path = os.path.join(directory, "tokenizer_config.json")
    config = read_json(config_path) if os.path.isfile(config_path) else {}
    with open(os.path.join(directory, "vocab.txt"), encoding="utf-8") as file:
        vocab = {line.rstrip("\n"): index for index, line in enumerate(file)}
    lowercase = config.get("do_lower_case", True)
    names = {key: _token_content(config.get(f"{key}_token")) or default for key, default in (
        ("unk", "[UNK]"), ("sep", "[SEP]"), ("pad", "[PAD]"), ("cls", "[CLS]"),
        ("mask", "[MASK]"))}
    missing = [token for token in names.values() if token not in vocab]
    if missing:
        refuse_tokenizer("vocab.txt", f"{len(vocab)} tokens", f"no {missing}")
    return {
        "added_tokens": [{"id": vocab[token], "content": token, "special": True}
                         for token in names.values()],
        "normalizer": {"type": "BertNormalizer", "clean_text": True,
                       "handle_chinese_chars": config.get("tokenize_chinese_chars", True),
                       "strip_accents": config.get("strip_accents"), "lowercase": lowercase},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "model": {"type": "WordPiece", "unk_token": names["unk"],
                  "continuing_subword_prefix": "##", "max_input_chars_per_word": 100,
                  "vocab": vocab},
        "post_processor": {"type": "BertProcessing", "cls": [names["cls"], vocab[names["cls"]]],
                           "sep": [names["sep"], vocab[names["sep"]]]},
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
    }


class WordPieceTokenizer(CheckpointTokenizer):
    """BERT's normalizer, pre-tokenizer, WordPiece model and decoder."""

    def __init__(self, spec: dict, directory: str):
        normalizer = spec.get("normalizer") or {}
        if normalizer.get("type") != "BertNormalizer" or set(normalizer) - NORMALIZER_KEYS:
            refuse_tokenizer("normalizer", normalizer, "expected a BertNormalizer")
        if (spec.get("pre_tokenizer") or {}).get("type") != "BertPreTokenizer":
            refuse_tokenizer("pre_tokenizer", spec.get("pre_tokenizer"),
                             "expected BertPreTokenizer")
        # No decoder (`"decoder": null`, what `tokenizers` writes when none is set): the
        # library then joins the tokens with spaces, as they are.
        self._joined = spec.get("decoder") is None
        decoder = {} if self._joined else expect_component(
            spec, "decoder", lambda d: d.get("type") == "WordPiece", "expected WordPiece")
        model = spec["model"]
        vocab = model_vocab(model)
        if sorted(vocab.values()) != list(range(len(vocab))):
            refuse_tokenizer("model.vocab", f"{len(vocab)} tokens", "ids are not 0 ... n - 1")
        added, special = added_tokens(spec, normalized_ok=True)
        if any(vocab.get(token) != index for token, index in added.items()):
            refuse_tokenizer("added_tokens", added, "added tokens outside the vocabulary")
        tokens = self.init_from_spec("wordpiece", spec, directory, vocab, added, special)
        self._clean = normalizer.get("clean_text", True)
        self._chinese = normalizer.get("handle_chinese_chars", True)
        self._lowercase = normalizer.get("lowercase", True)
        strip = normalizer.get("strip_accents")
        self._strip_accents = self._lowercase if strip is None else strip
        self._unk = model.get("unk_token", "[UNK]")
        if self._unk not in vocab:
            refuse_tokenizer("model.unk_token", self._unk, "not in the vocabulary")
        self._max_chars = model.get("max_input_chars_per_word", 100)
        self._subword_prefix = model.get("continuing_subword_prefix", "##")
        self._decode_prefix, self._cleanup = decoder.get("prefix", "##"), decoder.get(
            "cleanup", True)
        self._wordpiece = tf_text.FastWordpieceTokenizer(
            vocab=tokens, suffix_indicator=self._subword_prefix,
            max_bytes_per_word=4 * self._max_chars, token_out_type=tf.int32,
            unknown_token=self._unk, no_pretokenization=True)
        self._strings = tf.constant(tokens)
        self._spaced = any(" " in token for token in tokens)  # then CLEANUP pass by pass

    def _normalize(self, text):
        if self._clean:
            text = tf.strings.regex_replace(text, CLEAN_REMOVED, "")
            text = tf.strings.regex_replace(text, CLEAN_SPACE, " ")
        if self._chinese:
            text = tf.strings.regex_replace(text, CJK, r" \0 ")
        if self._strip_accents:
            text = tf.strings.regex_replace(tf_text.normalize_utf8(text, "NFD"), r"\p{Mn}", "")
        if self._lowercase:  # per character: no final sigma (ICU's lower has one)
            text = tf.strings.regex_replace(text, "\u0130", "i\u0307")
            text = _lower(tf.strings.regex_replace(text, "\u03a3", "\u03c3"))
        return text

    def _encode_segments(self, segments, first):
        words = split_keeping(self._normalize(segments), PUNCTUATION, dropped=f"[{WS}]+")
        flat = words.flat_values  # (W,)
        too_long = tf.strings.length(flat, unit="UTF8_CHAR") > self._max_chars
        ids = self._wordpiece.tokenize(tf.where(too_long, self._unk, flat))  # (W, None)
        return nested(words, ids)

    def _decode_ids(self, ids):
        tokens = tf.gather(self._strings, ids).flat_values
        position = row_positions(ids)
        if self._joined:  # no decoder: the tokens joined with spaces
            tokens = tf.where(position == 0, tokens, tf.strings.join([" ", tokens]))
            return join_rows(ids.with_flat_values(tokens))
        size = len(self._decode_prefix.encode())
        continued = tf.equal(tf.strings.substr(tokens, 0, size), self._decode_prefix)
        stripped = tf.strings.regex_replace(tokens, "^" + _literal(self._decode_prefix), "")
        tokens = tf.where(position == 0, tokens,
                          tf.where(continued, stripped, tf.strings.join([" ", tokens])))
        if self._cleanup and self._spaced:
            for old, new in CLEANUP:
                tokens = tf.strings.regex_replace(tokens, _literal(old), new)
        elif self._cleanup:  # a token's one space is its first character: one pass, the same
            tokens = tf.strings.regex_replace(tokens, CLEANUP_FIRST, r"\1")
        return join_rows(ids.with_flat_values(tokens))


def wordpiece_tokenizer(directory: str, spec: dict | None) -> WordPieceTokenizer:
    """The WordPiece tokenizer of `directory` (see `load_tokenizer`)."""
    return WordPieceTokenizer(spec if spec is not None else _from_vocab_txt(directory),
                              directory)
