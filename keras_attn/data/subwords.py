"""Subword vocabularies: SentencePiece models learned from a training split, applied in a graph.

A word-level vocabulary maps every word it has not seen often enough to `[UNK]`: names,
numbers and rare inflections cannot be read or written. A subword vocabulary splits such words
into known pieces instead (`"surrendered"` -> `"▁surrend" "ered"`), so almost nothing is
unknown (only characters never seen in training).

- `learn_sentencepiece(texts, vocab_size)`: a byte-pair-encoding model (Sennrich et al., 2016)
  learned with the `sentencepiece` library (Kudo & Richardson, 2018) from token strings (text
  already standardized, words separated by single spaces). Pieces never cross a space; a piece
  that starts a word carries the marker `"▁"` (U+2581). The reserved ids are keras_attn's
  (`keras_attn.tokens`: padding 0, `[UNK]` 1, `<bos>` 2, `<eos>` 3). Learning is deterministic:
  the same texts give the same model. About 0.3 s for 65,000 sentences on 2 CPU cores.
- `SentencePieceVectorizer`: the layer that applies a model to a batch of strings with
  tensorflow-text's `SentencepieceTokenizer` op, padded ids out, as `TextVectorization` does
  for words; `detokenize_tf` / `detokenize` turn pieces back into words.

A graph that contains the layer (an exported translator) needs the tensorflow-text ops: a
consumer runs `import tensorflow_text` before `tf.saved_model.load`.

References:
    Kudo & Richardson, 2018, "SentencePiece: A simple and language independent subword
    tokenizer and detokenizer for Neural Text Processing", https://arxiv.org/abs/1808.06226
    Sennrich et al., 2016, "Neural Machine Translation of Rare Words with Subword Units",
    https://arxiv.org/abs/1508.07909
"""

from __future__ import annotations

import base64
import io
import os
import re
import tempfile
from collections.abc import Iterable, Sequence

import tensorflow as tf

from keras_attn._checks import check_int, check_positive_int
from keras_attn.tokens import BOS_ID, EOS_ID, PAD_ID, RESERVED_TOKENS, UNK, UNK_ID

# The word-start marker of SentencePiece pieces.
WORD_START = "\u2581"
# How the reserved ids are spelled inside the SentencePiece model. Upper case: the examples'
# standardization lowercases text, so no input word can be read as one of them.
_RESERVED_PIECES = {"pad": "[PAD]", "unk": UNK, "bos": "[BOS]", "eos": "[EOS]"}


def learn_sentencepiece(texts: Iterable[str], vocab_size: int, model_type: str = "bpe") -> bytes:
    """Learns a SentencePiece model from token strings.

    Args:
        texts: iterable of standardized strings (words separated by single spaces).
        vocab_size: int, number of ids of the model, the 4 reserved ones included. The
            learner raises when the texts cannot fill it (too few distinct pieces).
        model_type: str, `"bpe"` (byte-pair encoding) or `"unigram"` (a unigram language
            model). Defaults to `"bpe"`.

    Returns:
        bytes, the serialized model (`SentencePieceVectorizer`'s `model`).

    Raises:
        ValueError: naming `vocab_size` when it is below 8 or more than the texts can fill,
            `model_type` when it is neither `"bpe"` nor `"unigram"`, `texts` when empty.

    Example:
    >>> model = learn_sentencepiece(["the cat sat", "the cats sat down"] * 50, 20)
    >>> SentencePieceVectorizer(model, 6)(tf.constant(["the cat"]))  # (1, 6) int64
    """
    import sentencepiece
    from sentencepiece import sentencepiece_model_pb2

    check_int("vocab_size", vocab_size, 8)
    if model_type not in ("bpe", "unigram"):
        raise ValueError(
            "Received an invalid value for argument `model_type`, expected 'bpe' or 'unigram'. "
            f"Received: model_type={model_type!r}")
    texts = [text for text in texts if text]
    if not texts:
        raise ValueError("Argument `texts` must hold at least one non-empty string. "
                         "Received: no text")
    model = io.BytesIO()
    with tempfile.TemporaryDirectory() as folder:
        # The text is used as given (the caller standardized it). SentencePiece's "identity"
        # normalization would do that too, but its model then logs a line to stderr every time
        # it is loaded (in every process that serves it); a one-rule normalization of its own
        # does not. The rule maps U+001C to a space, which standardized text never holds.
        rule = os.path.join(folder, "rule.tsv")
        with open(rule, "w") as file:
            file.write("1C\t20\n")
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size,
                model_type=model_type, pad_id=PAD_ID, unk_id=UNK_ID, bos_id=BOS_ID,
                eos_id=EOS_ID,
                **{f"{kind}_piece": piece for kind, piece in _RESERVED_PIECES.items()},
                # Every character of the training text gets a piece; one thread for a
                # deterministic result.
                character_coverage=1.0, normalization_rule_tsv=rule, num_threads=1,
                minloglevel=2, hard_vocab_limit=True)
        except RuntimeError as error:
            raise ValueError(
                f"Received an invalid value for argument `vocab_size`: {error}. Choose a "
                f"smaller vocabulary for these {len(texts)} texts. "
                f"Received: vocab_size={vocab_size}") from None
    # The model records where the rule file was; a temporary path would make the same texts
    # give different bytes.
    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model.getvalue())
    proto.normalizer_spec.ClearField("normalization_rule_tsv")
    return proto.SerializeToString()


def _pieces_of(model: bytes) -> list[str]:
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_proto=model)
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


class SentencePieceVectorizer(tf.Module):
    """Subword ids of a batch of strings, padded to a fixed length: `TextVectorization` for a
    SentencePiece model.

    The strings are standardized text (words separated by spaces, as the model was learned
    from); each becomes the ids of its pieces, truncated or padded with 0 to
    `output_sequence_length`. A `tf.Module` (text processing runs in TensorFlow whatever the
    Keras backend, as `tf.data` does) whose tensorflow-text `SentencepieceTokenizer` op works
    eagerly, inside `tf.function` graphs, `tf.data` pipelines and exported SavedModels (which
    track its model resource).

    Args:
        model: bytes, a serialized SentencePiece model from `learn_sentencepiece` (reserved
            ids 0-3 as in `keras_attn.tokens`).
        output_sequence_length: int, length `L` of the outputs.
        name: str, the module's name. Defaults to `None`.

    Call arguments:
        texts: string tensor or list of strings `(B,)`.

    Returns:
        int32 ids `(B, L)`, 0 after the last piece.

    Example:
    >>> model = learn_sentencepiece(["the cat sat", "the cats sat down"] * 50, 20)
    >>> vectorizer = SentencePieceVectorizer(model, 6)
    >>> vectorizer(tf.constant(["the cats"]))  # (1, 6): ▁the ▁cat s 0 0 0
    >>> detokenize(["▁the", "▁cat", "s"])  # "the cats"
    """

    def __init__(self, model: bytes, output_sequence_length: int, name: str | None = None):
        super().__init__(name=name)
        if not isinstance(model, bytes):
            raise ValueError(  # noqa: TRY004 (the project raises ValueError for bad arguments)
                "Received an invalid value for argument `model`, expected the bytes of a "
                f"SentencePiece model (learn_sentencepiece). Received: model={model!r:.80}")
        check_positive_int("output_sequence_length", output_sequence_length)
        try:
            pieces = _pieces_of(model)
        except RuntimeError as error:
            raise ValueError("Argument `model` is not a SentencePiece model "
                             f"({error}). Received: {len(model)} bytes") from None
        expected = [_RESERVED_PIECES[kind] for kind in ("pad", "unk", "bos", "eos")]
        if pieces[:4] != expected:
            raise ValueError(
                f"Argument `model` must reserve ids 0-3 for {expected} (keras_attn.tokens), as "
                f"learn_sentencepiece does. Received a model whose ids 0-3 are {pieces[:4]}")
        self.model = model
        self.output_sequence_length = int(output_sequence_length)
        self._pieces = pieces
        # A tracked attribute: an exported graph that calls this module holds its model.
        self.tokenizer = self._new_tokenizer()

    def _new_tokenizer(self):
        import tensorflow_text

        return tensorflow_text.SentencepieceTokenizer(self.model, out_type=tf.int32)

    def _live_tokenizer(self):
        """`self.tokenizer`, made again when its model resource is gone: the op's kernel owns
        it, and `keras.backend.clear_session()` clears the kernels. Checked eagerly, also
        while a graph that calls the tokenizer is traced."""
        with tf.init_scope():
            try:
                self.tokenizer.tokenize(tf.constant([""]))
            except tf.errors.NotFoundError:
                self.tokenizer = self._new_tokenizer()
        return self.tokenizer

    def tokenize(self, texts) -> tf.RaggedTensor:
        """The ids of the pieces of each string, unpadded: int32 ragged `(B, None)`."""
        return self._live_tokenizer().tokenize(tf.convert_to_tensor(texts, tf.string))

    def count_tokens(self, texts) -> tf.Tensor:
        """The number of pieces of each string `(B,)`, before truncation: int32 `(B,)`."""
        return tf.cast(self.tokenize(texts).row_lengths(), "int32")

    def __call__(self, texts) -> tf.Tensor:
        ids = self.tokenize(texts)
        return ids.to_tensor(default_value=PAD_ID,
                             shape=[None, self.output_sequence_length])  # (B, L)

    def get_vocabulary(self) -> list[str]:
        """The piece of every id, the reserved ids spelled as in `keras_attn.tokens`
        (`""`, `"[UNK]"`, `"<bos>"`, `"<eos>"`)."""
        return list(RESERVED_TOKENS) + self._pieces[len(RESERVED_TOKENS):]

    def vocabulary_size(self) -> int:
        """Number of ids, the reserved ones included."""
        return len(self._pieces)

    def get_config(self) -> dict:
        """`output_sequence_length`, `split="sentencepiece"` and `standardize=None`, the keys
        of `TextVectorization`'s config that keras_attn reads; `model` as base64 text, so that
        `SentencePieceVectorizer(**config)`-style copies (`from_config`) are possible."""
        return {"name": self.name, "output_sequence_length": self.output_sequence_length,
                "split": "sentencepiece", "standardize": None,
                "model": base64.b64encode(self.model).decode("ascii")}

    @classmethod
    def from_config(cls, config: dict) -> SentencePieceVectorizer:
        """The vectorizer `get_config` describes."""
        return cls(base64.b64decode(config["model"]), config["output_sequence_length"],
                   name=config.get("name"))


def detokenize(pieces: Sequence[str], word_start: str = WORD_START) -> str:
    """Words from SentencePiece pieces: concatenated, every word-start marker a space, runs of
    spaces one space, none at either end: `["▁je", "▁sui", "s", "▁."]` -> `"je suis ."`.

    Args:
        pieces: list of str.
        word_start: str, the marker. Defaults to `WORD_START` (`"▁"`).

    Returns:
        str of words separated by single spaces.
    """
    return re.sub(" +", " ", "".join(pieces).replace(word_start, " ")).strip(" ")


def detokenize_tf(text: tf.Tensor, word_start: str = WORD_START) -> tf.Tensor:
    """`detokenize` in a graph, for pieces already concatenated: string `(B,)` -> `(B,)`.

    Args:
        text: string tensor, each element the pieces of one output joined with `""`.
        word_start: str, the marker. Defaults to `WORD_START` (`"▁"`).

    Returns:
        string tensor of the same shape, equal to `detokenize` element-wise.
    """
    text = tf.strings.regex_replace(text, re.escape(word_start), " ")
    text = tf.strings.regex_replace(text, " +", " ")
    return tf.strings.strip(text)
