"""Byte-level BPE (`tokenizer.json` of GPT-2, Llama 3, Qwen2) as TensorFlow ops.

The pre-tokenizers split with regexes that use a lookahead (`\\s+(?!\\S)`), which RE2 (the regex
engine of TensorFlow) does not have. Its effect is reproduced exactly in two steps:

1. a run of whitespace followed by a non-space character gives up its last whitespace
   character to what follows (`"a   b"` -> `"a"`, `"  "`, `" b"`). So a boundary marker (the
   byte 0xFF, which never occurs in UTF-8) goes before that last character whenever at least
   two whitespace characters precede it: for GPT-2 in any whitespace run, for Llama 3 and Qwen2
   in the part of the run after its last `\\r`/`\\n` (`\\s*[\\r\\n]+` takes what comes before);
2. each piece between markers is split with the regex without the lookahead, where
   `\\s+(?!\\S)|\\s+` can only match whole runs: every run left inside a piece either ends the
   piece or is a single character.

`\\s` is spelled out as Unicode's White_Space (what the `tokenizers` library's Oniguruma
matches). The merges are keras-hub's `BytePairTokenizer`'s (its cache, primed with the whole
vocabulary when `ignore_merges` asks that a pre-token found in the vocabulary be kept whole).
"""

from __future__ import annotations

import tensorflow as tf
import tensorflow_text as tf_text

from keras_attn.checkpoints.tokenizer_base import (
    MARK,
    CheckpointTokenizer,
    added_tokens,
    expect_component,
    refuse_tokenizer,
)

# Unicode White_Space, as a character-class body; and without \n, \r.
WS = (r"\t-\r \x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}"
      r"\x{3000}")
WS_INLINE = WS.replace(r"\t-\r", r"\t\x{0b}\x{0c}")
# The pre-tokenizer regexes of the `tokenizers` library (as they appear in tokenizer.json)
GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3 = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
          r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")
# ... and (boundary regex, the regex without lookahead) for RE2.
RE2_SPLITS = {
    GPT2: (f"([{WS}]+)([{WS}][^{WS}])",
           rf"'s|'t|'re|'ve|'m|'ll|'d| ?\p{{L}}+| ?\p{{N}}+| ?[^{WS}\p{{L}}\p{{N}}]+|[{WS}]+"),
    LLAMA3: (f"([{WS_INLINE}]+)([{WS_INLINE}][^{WS}])",
             (rf"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{{L}}\p{{N}}]?\p{{L}}+|\p{{N}}{{1,3}}| ?"
              rf"[^{WS}\p{{L}}\p{{N}}]+[\r\n]*|[{WS}]*[\r\n]+|[{WS}]+")),
}
RE2_SPLITS[QWEN2] = (RE2_SPLITS[LLAMA3][0],
                     RE2_SPLITS[LLAMA3][1].replace(r"\p{N}{1,3}", r"\p{N}"))


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's map from bytes to printable characters (the `ByteLevel` alphabet)."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    mapping, extra = {}, 0
    for byte in range(256):
        if byte in printable:
            mapping[byte] = chr(byte)
        else:
            mapping[byte] = chr(256 + extra)
            extra += 1
    return mapping


def _pre_tokenizer_regex(spec: dict) -> str:
    """The split regex of a byte-level pre-tokenizer, or a refusal."""
    pre = spec.get("pre_tokenizer") or {}
    steps = pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    regex = None
    for step in steps:
        kind = step.get("type")
        if kind == "ByteLevel":
            if step.get("add_prefix_space"):
                refuse_tokenizer("pre_tokenizer.add_prefix_space", True,
                                 "a prefix space per segment is not reproduced")
            if step.get("use_regex", True):
                regex = GPT2 if regex is None else refuse_tokenizer(
                    "pre_tokenizer", pre, "two split regexes")
        elif kind == "Split":
            pattern = step.get("pattern", {}).get("Regex")
            if pattern not in RE2_SPLITS or step.get("behavior") not in ("Isolated", "isolated") \
                    or step.get("invert"):
                refuse_tokenizer("pre_tokenizer.Split", step, "the known split regexes are "
                                 "GPT-2's, Llama 3's and Qwen2's, isolated, not inverted")
            regex = pattern if regex is None else refuse_tokenizer(
                "pre_tokenizer", pre, "two split regexes")
        else:
            refuse_tokenizer("pre_tokenizer.type", kind, "expected ByteLevel or Split")
    if regex is None or not any(step.get("type") == "ByteLevel" for step in steps):
        refuse_tokenizer("pre_tokenizer", pre, "a byte-level BPE needs a ByteLevel step and a "
                         "split regex")
    return regex


def _check_model(model: dict) -> None:
    if model.get("dropout") not in (None, 0.0):
        refuse_tokenizer("model.dropout", model["dropout"], "BPE dropout samples")
    for key in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(key):
            refuse_tokenizer(f"model.{key}", model[key], "not used by byte-level BPE")
    if model.get("byte_fallback"):
        refuse_tokenizer("model.byte_fallback", True, "byte-level BPE has every byte already")


class ByteLevelBPETokenizer(CheckpointTokenizer):
    """Byte-level BPE: NFC (optional), split regex, bytes to GPT-2's alphabet, BPE merges."""

    def __init__(self, spec: dict, directory: str):
        import keras_hub

        model = spec["model"]
        _check_model(model)
        normalizer = spec.get("normalizer")
        if normalizer not in (None, {"type": "NFC"}):
            refuse_tokenizer("normalizer", normalizer, "expected none or NFC")
        expect_component(spec, "decoder", lambda d: d.get("type") == "ByteLevel",
                         "expected ByteLevel")
        added, special = added_tokens(spec, normalized_ok=normalizer is None)
        vocab = model["vocab"]
        alphabet = bytes_to_unicode()
        missing = [byte for byte, char in alphabet.items() if char not in vocab]
        if missing:
            refuse_tokenizer("model.vocab", f"{len(vocab)} tokens", f"bytes {missing[:8]} have "
                             "no token (the `tokenizers` library would drop them)")
        tokens = self.init_from_spec("byte_level_bpe", spec, directory, vocab, added, special)
        self._nfc = normalizer is not None
        self._boundary, self._split = RE2_SPLITS[_pre_tokenizer_regex(spec)]
        merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
        self._bpe = keras_hub.tokenizers.BytePairTokenizer(
            vocabulary=dict(vocab), merges=merges, unsplittable_tokens=[],
            _allow_python_workflow=False)
        if model.get("ignore_merges"):  # a pre-token in the vocabulary is kept whole
            inverse = {char: byte for byte, char in alphabet.items()}
            keys, values = [], []
            for token in vocab:
                if all(char in inverse for char in token):
                    keys.append(bytes(inverse[char] for char in token))
                    values.append(token)
            self._bpe.cache.insert(tf.constant(keys), tf.constant(values))
        self._bytes = tf.constant([self._token_bytes(token, token in added, inverse_map(alphabet))
                                   for token in tokens])

    @staticmethod
    def _token_bytes(token: str, is_added: bool, inverse: dict) -> bytes:
        # As the `tokenizers` ByteLevel decoder: characters of the alphabet back to bytes; a
        # token with any other character (an added token) as its UTF-8.
        if all(char in inverse for char in token):
            return bytes(inverse[char] for char in token)
        return token.encode("utf-8")

    def _merge(self, words: tf.Tensor) -> tf.RaggedTensor:
        """Pre-tokens `(W,)` -> ids `(W, None)` through keras-hub's merge loop and cache."""
        bpe = self._bpe
        cached = bpe.cache.lookup(words)
        unseen = tf.equal(cached, "")

        def merge():
            bpe._bpe_merge_and_update_cache_tf(tf.boolean_mask(words, unseen))
            return bpe.cache.lookup(words)

        merged = tf.cond(tf.reduce_any(unseen & (words != "")), merge, lambda: cached)
        return bpe.token_to_id_map.lookup(tf.strings.split(merged, sep=" "))

    def _encode_segments(self, segments, first):
        if self._nfc:
            segments = tf_text.normalize_utf8(segments, "NFC")
        marked = tf.strings.regex_replace(segments, self._boundary, b"\\1" + MARK + b"\\2")
        pieces = tf.strings.split(marked, sep=MARK)  # (N, P)
        words = tf_text.regex_split(pieces, self._split, self._split).merge_dims(1, 2)
        ids = self._merge(words.flat_values)  # (W, None)
        return tf.RaggedTensor.from_row_splits(ids, words.row_splits).merge_dims(1, 2)

    def _decode_ids(self, ids):
        raw = tf.strings.reduce_join(tf.gather(self._bytes, ids), axis=1)
        # invalid UTF-8 -> U+FFFD per maximal invalid subsequence (Rust's from_utf8_lossy)
        return tf.strings.unicode_transcode(raw, "UTF-8", "UTF-8", errors="replace",
                                            replacement_char=0xFFFD,
                                            replace_control_characters=False)


def inverse_map(alphabet: dict[int, str]) -> dict[str, int]:
    return {char: byte for byte, char in alphabet.items()}


def byte_level_bpe_tokenizer(directory: str, spec: dict) -> ByteLevelBPETokenizer:
    """The `tokenizer.json` byte-level BPE of `directory` (see `load_tokenizer`)."""
    return ByteLevelBPETokenizer(spec, directory)
