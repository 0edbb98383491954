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
matches). The merges are `tokenizer_merges.BytePairMerger`'s. A directory without
`tokenizer.json` but with GPT-2's `vocab.json` and `merges.txt` is read as transformers'
`GPT2Tokenizer` reads it (`gpt2_spec`).
"""

from __future__ import annotations

import os

import tensorflow as tf
import tensorflow_text as tf_text

from keras_attn.checkpoints.tokenizer_base import (
    DEFAULT_SPECIALS,
    MARK,
    CheckpointTokenizer,
    _token_content,
    added_tokens,
    expect_component,
    model_vocab,
    read_json,
    refuse_tokenizer,
    split_keeping,
)
from keras_attn.checkpoints.tokenizer_merges import BytePairMerger
from keras_attn.checkpoints.tokenizer_ragged import join_rows, nested

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
    """Byte-level BPE: NFC (optional), split regex, bytes to GPT-2's alphabet, BPE merges
    (the attribute `merger`, a `tokenizer_merges.BytePairMerger`)."""

    def __init__(self, spec: dict, directory: str):
        model = spec["model"]
        _check_model(model)
        normalizer = spec.get("normalizer")
        if normalizer not in (None, {"type": "NFC"}):
            refuse_tokenizer("normalizer", normalizer, "expected none or NFC")
        expect_component(spec, "decoder", lambda d: d.get("type") == "ByteLevel",
                         "expected ByteLevel")
        added, special = added_tokens(spec, normalized_ok=normalizer is None)
        vocab = model_vocab(model)
        alphabet = bytes_to_unicode()
        missing = [byte for byte, char in alphabet.items() if char not in vocab]
        if missing:
            refuse_tokenizer("model.vocab", f"{len(vocab)} tokens", f"bytes {missing[:8]} have "
                             "no token (the `tokenizers` library would drop them)")
        tokens = self.init_from_spec("byte_level_bpe", spec, directory, vocab, added, special)
        self._nfc = normalizer is not None
        self._boundary, self._split = RE2_SPLITS[_pre_tokenizer_regex(spec)]
        merges = model.get("merges") or []
        if not isinstance(merges, list):
            refuse_tokenizer("model.merges", type(merges).__name__, "expected a list")
        self.merger = BytePairMerger(vocab, merges,
                                   [alphabet[byte] for byte in range(256)],
                                   ignore_merges=bool(model.get("ignore_merges")))
        self._bytes = tf.constant([self._token_bytes(token, token in added, inverse_map(alphabet))
                                   for token in tokens])

    @staticmethod
    def _token_bytes(token: str, is_added: bool, inverse: dict) -> bytes:
        # As the `tokenizers` ByteLevel decoder: characters of the alphabet back to bytes; a
        # token with any other character (an added token) as its UTF-8.
        if all(char in inverse for char in token):
            return bytes(inverse[char] for char in token)
        return token.encode("utf-8")

    def _encode_segments(self, segments, first):
        if self._nfc:
            segments = tf_text.normalize_utf8(segments, "NFC")
        marked = tf.strings.regex_replace(segments, self._boundary, b"\\1" + MARK + b"\\2")
        pieces = tf.strings.split(marked, sep=MARK)  # (N, P)
        words = nested(pieces, split_keeping(pieces.flat_values, self._split))  # (N, W)
        return nested(words, self.merger.merge(words.flat_values))  # (N, None)

    def _decode_kept(self, ids, keep):
        pieces = tf.where(keep, tf.gather(self._bytes, ids.flat_values), "")  # (N,)
        raw = join_rows(ids.with_flat_values(pieces))  # (B,)
        # invalid UTF-8 -> U+FFFD per maximal invalid subsequence (Rust's from_utf8_lossy)
        return tf.strings.unicode_transcode(raw, "UTF-8", "UTF-8", errors="replace",
                                            replacement_char=0xFFFD,
                                            replace_control_characters=False)


def inverse_map(alphabet: dict[int, str]) -> dict[str, int]:
    return {char: byte for byte, char in alphabet.items()}


def byte_level_bpe_tokenizer(directory: str, spec: dict | None) -> ByteLevelBPETokenizer:
    """The byte-level BPE of `directory` (see `load_tokenizer`): its `tokenizer.json`, or
    without one its `vocab.json` and `merges.txt` (`gpt2_spec`)."""
    return ByteLevelBPETokenizer(spec if spec is not None else gpt2_spec(directory), directory)


GPT2_CLASSES = (None, "GPT2Tokenizer", "GPT2TokenizerFast")


def gpt2_spec(directory: str) -> dict:
    """The `tokenizer.json` transformers' `GPT2Tokenizer` builds from `vocab.json` and
    `merges.txt` (GPT-2's classic layout) and the options of `tokenizer_config.json`:
    `ByteLevel` pre-tokenizer and decoder, unk/bos/eos `<|endoftext|>` unless named, added
    as special tokens, `add_bos_token` / `add_eos_token` as the template."""
    config_path = os.path.join(directory, "tokenizer_config.json")
    config = read_json(config_path) if os.path.isfile(config_path) else {}
    if config.get("tokenizer_class") not in GPT2_CLASSES:
        refuse_tokenizer("tokenizer_config.json tokenizer_class", config["tokenizer_class"],
                         "vocab.json and merges.txt are read as GPT-2's (GPT2Tokenizer)")
    if os.path.isfile(os.path.join(directory, "added_tokens.json")):
        refuse_tokenizer("added_tokens.json", "present", "its tokens are not read")
    vocab = read_json(os.path.join(directory, "vocab.json"))
    if not all(isinstance(index, int) and not isinstance(index, bool)
               for index in vocab.values()):
        refuse_tokenizer("vocab.json", f"{len(vocab)} entries", "expected token -> id")
    merges = []
    with open(os.path.join(directory, "merges.txt"), encoding="utf-8") as file:
        for number, line in enumerate(file, 1):
            line = line.rstrip("\n")
            if not line or (number == 1 and line.startswith("#version")):
                continue
            if len(line.split(" ")) != 2:
                refuse_tokenizer(f"merges.txt line {number}", line, "expected two tokens")
            merges.append(line)
    defaults = {"unk": "<|endoftext|>", "bos": "<|endoftext|>", "eos": "<|endoftext|>"}
    names = {key: _token_content(config.get(f"{key}_token", defaults.get(key)))
             for key in ("unk", "bos", "eos", "pad")}
    added = {int(index): token for index, token in
             (config.get("added_tokens_decoder") or {}).items()}
    for token in dict.fromkeys(name for name in names.values() if name is not None):
        if token not in vocab and token not in [t.get("content") for t in added.values()]:
            refuse_tokenizer("vocab.json", f"{len(vocab)} tokens", f"no {token!r} (transformers "
                             "would add it with a new id)")
        index = vocab.get(token)
        if index is not None and index not in added:
            added[index] = {"content": token, "special": True}
    template = [{"Sequence": {"id": "A", "type_id": 0}}]
    specials = {}
    for key, where in (("bos", 0), ("eos", len(template) + 1)):
        if config.get(f"add_{key}_token") and names[key] is not None:
            template.insert(where, {"SpecialToken": {"id": names[key], "type_id": 0}})
            specials[names[key]] = {"id": names[key], "ids": [vocab[names[key]]],
                                    "tokens": [names[key]]}
    byte_level = {"type": "ByteLevel", "add_prefix_space": bool(config.get("add_prefix_space")),
                  "trim_offsets": True, "use_regex": True}
    return {
        "added_tokens": [{"id": index, **token} for index, token in sorted(added.items())],
        "normalizer": None, "pre_tokenizer": byte_level, "decoder": byte_level,
        "post_processor": {"type": "TemplateProcessing", "single": template,
                           "special_tokens": specials},
        "model": {"type": "BPE", "vocab": vocab, "merges": merges},
        DEFAULT_SPECIALS: {key: token for key, token in names.items() if token is not None},
    }
