"""SavedModel export of a trained translator: raw strings in, strings out, TensorFlow alone.

The exported graph holds the whole path from text to text: the source standardization
(`tf.strings` ops), the source vocabulary lookup, the encoder, the compiled decoding loop over
the static key/value cache, and the detokenization. A consumer loads it with
`tf.saved_model.load(path)` and needs neither keras_attn nor Keras; a translator with
subword vocabularies (`keras_attn.data.subwords.SentencePieceVectorizer`) holds tensorflow-text's
SentencePiece op, which `import tensorflow_text` registers before the load:

    import tensorflow_text  # only for subword vocabularies
    translator = tf.saved_model.load("runs/transformer/saved_model")
    out = translator.signatures["translate"](text=tf.constant(["march 3rd, 2021"]))
    out["translation"], out["score"], out["truncated"]

Three signatures are written:

- `translate`: `text` (tf.string, `[None]`) → a dict of three `[None]` tensors:
    - `translation` (tf.string): the output tokens joined by `joiner` (subword pieces:
      detokenized into words separated by single spaces).
    - `score` (float32): how sure the model is of that translation, the log-probability of
      its tokens (`<eos>` included) divided by GNMT's length normaliser
      `((5 + |Y|) / 6) ** length_penalty`, the quantity beam search ranks by. It is at most 0
      (0 = certain). Input unlike anything the model was trained on (for a dates model: text
      that is no date) scores clearly lower than held-out inputs of the training
      distribution, so a consumer can flag or reject outputs under a threshold chosen on
      held-out data. It is the model's confidence, not a check of the input: input close to
      the training data but outside it (an impossible date) can get a confident, wrong
      translation. An input with no tokens (empty, or only whitespace of any kind: Unicode's
      spaces such as U+00A0, U+2003 and U+3000, line separators; `WHITESPACE` of
      `keras_attn.data.translation`) gets the empty translation and the score `-inf`: there
      is nothing to translate.
    - `truncated` (bool): True when the input has more tokens (after standardization) than the
      model's source length `Ls`; the translation is then of the first `Ls` tokens only, so
      the flag must be checked.
- `translate_with_settings`: `text` and `beam_size` (int32, `[]`): the search as a request
  setting, 1 for greedy search or the export's `beam_size` for its beam search (any other value
  fails the call with `tf.errors.InvalidArgumentError` naming `beam_size`), so that one
  SavedModel serves the fast greedy search and the better beam search; the same outputs as
  `translate`, whose search is the export's `beam_size`.
- `serve`: the plain forward pass, `source_ids` (int32, `[None, Ls]`) and `target_in_ids`
  (int32, `[None, Lt]`) → `logits` (float32, `[None, Lt, vocab]`), as Keras' `model.export` does.

`export_nat_translator` writes the same `translate` signature (not `translate_with_settings`)
for a non-autoregressive
`nat_seq2seq` model decoded by Mask-Predict (its `score` is the mean log-probability of the
output tokens), and a `serve` signature with its two outputs.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from keras_attn import decoding
from keras_attn._checks import check_new_directory, check_number, check_positive_int
from keras_attn.data.subwords import SentencePieceVectorizer, detokenize_tf
from keras_attn.data.translation import WHITESPACE
from keras_attn.decoding import checks, samplers
from keras_attn.decoding.mask_predict import check_mask_predict_args
from keras_attn.layers import legacy
from keras_attn.tokens import FIRST_WORD_ID, UNK_ID

# Splits of `TextVectorization` whose token count the exported graph reproduces exactly.
_SPLITS = ("whitespace", "character")


def _check_vectorizer(name: str, vectorizer) -> None:
    if isinstance(vectorizer, SentencePieceVectorizer):
        return  # a fixed length, and it counts its own pieces
    if not isinstance(vectorizer, keras.layers.TextVectorization):
        raise ValueError(  # noqa: TRY004 (the project raises ValueError for bad arguments)
            f"Argument `{name}` must be a keras.layers.TextVectorization or a "
            "keras_attn.data.subwords.SentencePieceVectorizer. "
            f"Received: {name}={vectorizer!r}"
        )
    config = vectorizer.get_config()
    if config["output_sequence_length"] is None:
        raise ValueError(
            f"Argument `{name}` must have a fixed `output_sequence_length` (the exported "
            "signatures have static lengths). Received: output_sequence_length=None"
        )
    if name == "source_vectorizer" and (
        config["standardize"] is not None or config["split"] not in _SPLITS
    ):
        raise ValueError(
            "Argument `source_vectorizer` must have `standardize=None` and `split` in "
            f"{_SPLITS} (pass the preprocessing as `standardize`), so that the exported "
            "signature can count the source tokens and flag inputs it truncates. Received: "
            f"standardize={config['standardize']!r}, split={config['split']!r}"
        )


def _check_word_start(word_start, joiner) -> None:
    if word_start is None:
        return
    if not isinstance(word_start, str) or not word_start:
        raise ValueError(
            "Received an invalid value for argument `word_start`, expected a non-empty string "
            f"(SentencePiece's '\u2581') or None. Received: word_start={word_start!r}")
    if joiner != " ":
        raise ValueError(
            "Argument `joiner` must be ' ' with `word_start`: subword pieces are concatenated "
            "and their word-start markers become the spaces between words. Received: "
            f"joiner={joiner!r}, word_start={word_start!r}")


def _count_tokens(vectorizer, tokens: tf.Tensor) -> tf.Tensor:
    """Number of tokens the source vectorizer sees in each string of `tokens` `(B,)`."""
    if isinstance(vectorizer, SentencePieceVectorizer):
        return vectorizer.count_tokens(tokens)
    split = vectorizer.get_config()["split"]
    if split == "character":
        return tf.cast(tf.strings.length(tokens, unit="UTF8_CHAR"), "int32")
    return tf.cast(tf.strings.split(tokens).row_lengths(), "int32")  # whitespace runs


def _text_fn(
    source_vectorizer: keras.layers.TextVectorization,
    target_vocabulary: list[str],
    decode: Callable[..., tuple[tf.Tensor, tf.Tensor]],
    standardize: Callable[[tf.Tensor], tf.Tensor] | None,
    joiner: str,
    word_start: str | None = None,
) -> Callable[[tf.Tensor], dict[str, tf.Tensor]]:
    """Text in, text out around `decode(source_ids (B, Ls), *settings) -> (ids (B, T),
    scores (B,))`, whose ids are tokens, then `<eos>`, then padding: the function of the
    `translate` signature (`translate(text, *settings)`, the settings passed to `decode`)."""
    _check_word_start(word_start, joiner)
    source_length = source_vectorizer.get_config()["output_sequence_length"]
    vocabulary = tf.constant(list(target_vocabulary))

    def translate(text: tf.Tensor, *settings) -> dict[str, tf.Tensor]:
        tokens = standardize(text) if standardize is not None else text
        num_tokens = _count_tokens(source_vectorizer, tokens)  # (B,)
        source_ids = tf.cast(source_vectorizer(tokens), "int32")  # (B, Ls), PAD_ID = padding
        ids, scores = decode(source_ids, *settings)
        ids = tf.cast(ids, "int32")  # (B, T): tokens, <eos>, then padding
        words = tf.gather(vocabulary, ids)  # (B, T) strings
        # Words and [UNK] are kept; padding, <bos> and <eos> are dropped.
        keep = tf.logical_or(ids >= FIRST_WORD_ID, tf.equal(ids, UNK_ID))
        kept = tf.ragged.boolean_mask(words, keep)  # (B, None)
        if word_start is None:
            translation = tf.strings.reduce_join(kept, axis=-1, separator=joiner)  # (B,)
        else:  # subword pieces: concatenated, each word-start marker a space
            translation = detokenize_tf(tf.strings.reduce_join(kept, axis=-1), word_start)
        # (B,): nothing to translate: no token, or only whitespace (Unicode's, whatever the
        # standardization makes of it)
        empty = tf.logical_or(tf.equal(num_tokens, 0),
                              tf.strings.regex_full_match(text, f"[{WHITESPACE}]*"))
        return {
            "translation": tf.where(empty, tf.constant(""), translation),
            "score": tf.where(empty, tf.constant(float("-inf")), tf.cast(scores, "float32")),
            "truncated": num_tokens > source_length,
        }

    return translate


def _write_archive(path: str, model: keras.Model, source_vectorizer, translate: Callable,
                   serve: Callable, serve_signature: list, with_settings: bool = False) -> str:
    """A SavedModel at `path` with the `translate` (text) and `serve` (ids) endpoints, and
    with `with_settings` the `translate_with_settings` one (text and `beam_size`)."""
    if not getattr(source_vectorizer, "built", True):  # a layer never called yet cannot be
        source_vectorizer(tf.constant([""]))  # tracked (a SentencePieceVectorizer always can)
    archive = keras.export.ExportArchive()
    archive.track(model)
    archive.track(source_vectorizer)
    archive.add_endpoint(
        name="translate",
        fn=translate,
        input_signature=[tf.TensorSpec([None], tf.string, name="text")],
    )
    if with_settings:
        archive.add_endpoint(
            name="translate_with_settings",
            fn=translate,
            input_signature=[tf.TensorSpec([None], tf.string, name="text"),
                             tf.TensorSpec([], tf.int32, name="beam_size")],
        )
    archive.add_endpoint(name="serve", fn=serve, input_signature=serve_signature)
    archive.write_out(path, verbose=False)
    return path


def make_translate_fn(
    model: keras.Model,
    source_vectorizer: keras.layers.TextVectorization,
    target_vocabulary: list[str],
    max_length: int,
    beam_size: int = 1,
    length_penalty: float = 0.6,
    standardize: Callable[[tf.Tensor], tf.Tensor] | None = None,
    joiner: str = " ",
    word_start: str | None = None,
) -> Callable[[tf.Tensor], dict[str, tf.Tensor]]:
    """The graph function behind the exported `translate` signature.

    Useful on its own to translate in Python with exactly the exported computation.
    Arguments are those of `export_translator`.

    Returns:
        A function of a string tensor `text` `(B,)`, and optionally a request's `beam_size`
        (a scalar int32 tensor: 1, greedy search, or the export's `beam_size`; without it the
        export's), returning a dict with `translation` (tf.string `(B,)`), `score` (float32
        `(B,)`) and `truncated` (bool `(B,)`), as described in the module docstring.
    """
    _check_vectorizer("source_vectorizer", source_vectorizer)
    check_positive_int("beam_size", beam_size)
    check_positive_int("max_length", max_length)
    check_number("length_penalty", length_penalty, 0)

    def search(source_ids, num_beams):
        # Beam(1) is greedy search, its scores normalized as beam search's.
        return decoding.generate(model, source_ids, max_length, return_scores=True,
                                 sampler=samplers.Beam(num_beams, length_penalty))

    def decode(source_ids, request_beam_size=None):
        if request_beam_size is None:
            return search(source_ids, beam_size)
        request_beam_size = checks.one_of("beam_size", request_beam_size,
                                          tuple(sorted({1, beam_size})))
        if beam_size == 1:
            return search(source_ids, 1)
        return tf.cond(request_beam_size == 1, lambda: search(source_ids, 1),
                       lambda: search(source_ids, beam_size))

    return _text_fn(source_vectorizer, target_vocabulary, decode, standardize, joiner,
                    word_start)


def export_translator(
    model: keras.Model,
    source_vectorizer: keras.layers.TextVectorization,
    target_vectorizer: keras.layers.TextVectorization,
    path: str,
    max_length: int | None = None,
    beam_size: int = 1,
    length_penalty: float = 0.6,
    standardize: Callable[[tf.Tensor], tf.Tensor] | None = None,
    joiner: str = " ",
    word_start: str | None = None,
) -> str:
    """Write a SavedModel with a raw-string `translate` signature and a `serve` signature.

    Args:
        model: a seq2seq model from `keras_attn.models` (layers named "encoder" and "decoder").
        source_vectorizer: the source `TextVectorization` (fixed output length `Ls`,
            `standardize=None`, `split="whitespace"` or `"character"`, as
            `keras_attn.data.build_vectorizer` makes them) or
            `keras_attn.data.subwords.SentencePieceVectorizer` (subword pieces; the SavedModel
            then holds tensorflow-text ops: serving needs `import tensorflow_text`).
        target_vectorizer: the target `TextVectorization` or `SentencePieceVectorizer`; its
            vocabulary detokenizes.
        path: str, the SavedModel directory to write: a new or empty directory (an
            existing file or non-empty directory is refused, never written into).
        max_length: int, the output positions (`keras_attn.decoding.generate`'s meaning):
            most tokens to generate. Defaults to the target vectorizer's output length.
        beam_size: int, 1 for greedy search, more for beam search: the search of the
            `translate` signature; `translate_with_settings` serves greedy search too (its
            `beam_size` input 1). Defaults to `1`.
        length_penalty: float >= 0, GNMT length-penalty exponent of the scores (and of beam
            search's ranking). Defaults to `0.6`.
        standardize: optional function of a `(B,)` string tensor written with `tf.strings` ops
            that turns raw text into space-separated tokens, the preprocessing the model was
            trained with (e.g. `TranslationData.standardize_tf`). Defaults to `None` (the text
            is already tokens).
        joiner: str placed between output tokens: `" "` for words, `""` for characters.
            Defaults to `" "`.
        word_start: str, the marker that starts a word in subword pieces
            (`keras_attn.data.subwords.WORD_START` for SentencePiece; `joiner` must be `" "`):
            the output pieces are concatenated and each marker becomes a space. Defaults to
            `None` (the tokens are words or characters). `TranslationData.text_options` holds
            `standardize`, `joiner` and `word_start` of a data set.

    Returns:
        `path`.

    Serving never fails on odd input, and never hides it: an empty or whitespace-only input
    gives the empty translation with score `-inf`; an input longer than `Ls` tokens is
    translated from its first `Ls` tokens with `truncated=True`; unknown words map to the
    unknown id and usually lower the score. See the module docstring for the outputs.
    """
    path = check_new_directory("path", path)
    _check_vectorizer("source_vectorizer", source_vectorizer)
    _check_vectorizer("target_vectorizer", target_vectorizer)
    check_positive_int("beam_size", beam_size)
    target_length = target_vectorizer.get_config()["output_sequence_length"]
    max_length = target_length if max_length is None else max_length
    check_positive_int("max_length", max_length)
    source_length = source_vectorizer.get_config()["output_sequence_length"]
    translate = make_translate_fn(
        model, source_vectorizer, target_vectorizer.get_vocabulary(), max_length, beam_size,
        length_penalty, standardize, joiner, word_start,
    )

    return _write_archive(
        path, model, source_vectorizer, translate,
        serve=lambda source_ids, target_in_ids: {
            "logits": tf.cast(model([source_ids, target_in_ids], training=False), "float32")
        },
        serve_signature=[
            tf.TensorSpec([None, source_length], tf.int32, name="source_ids"),
            tf.TensorSpec([None, target_length], tf.int32, name="target_in_ids"),
        ],
        with_settings=True,
    )


def make_nat_translate_fn(
    model: keras.Model,
    source_vectorizer: keras.layers.TextVectorization,
    target_vocabulary: list[str],
    max_length: int | None = None,
    iterations: int = 10,
    standardize: Callable[[tf.Tensor], tf.Tensor] | None = None,
    joiner: str = " ",
    length_beam: int = 1,
    word_start: str | None = None,
) -> Callable[[tf.Tensor], dict[str, tf.Tensor]]:
    """The graph function behind the `translate` signature of `export_nat_translator`.

    Arguments are those of `export_nat_translator` (`target_vocabulary` is the target
    vectorizer's `get_vocabulary()`).

    Returns:
        A function of a string tensor `text` `(B,)` returning a dict with `translation`
        (tf.string `(B,)`), `score` (float32 `(B,)`, the mean log-probability of the output
        tokens) and `truncated` (bool `(B,)`).
    """
    _check_vectorizer("source_vectorizer", source_vectorizer)
    max_length = check_mask_predict_args(model, iterations, length_beam, max_length)

    def decode(source_ids):
        return decoding.mask_predict(model, source_ids, max_length=max_length,
                                     iterations=iterations, length_beam=length_beam)

    return _text_fn(source_vectorizer, target_vocabulary, decode, standardize, joiner,
                    word_start)


def export_nat_translator(
    model: keras.Model,
    source_vectorizer: keras.layers.TextVectorization,
    target_vectorizer: keras.layers.TextVectorization,
    path: str | None = None,
    max_length: int | None = None,
    iterations: int = 10,
    standardize: Callable[[tf.Tensor], tf.Tensor] | None = None,
    joiner: str = " ",
    length_beam: int = 1,
    word_start: str | None = None,
    **kwargs,
) -> str:
    """Write a SavedModel of a non-autoregressive (`nat_seq2seq`) translator.

    Its `translate` signature is that of `export_translator` (`text` in; `translation`,
    `score`, `truncated` out; empty input: `""` and `-inf`), decoded with
    `keras_attn.decoding.mask_predict`; `score` is the mean log-probability of the output
    tokens (at most 0), with no length normaliser. Its `serve` signature is the forward pass:
    `source_ids` (int32 `[None, Ls]`) and `masked_target_ids` (int32 `[None, T]`, `T` the
    model's `max_target_length`) -> `token_logits` (float32 `[None, T, vocab]`) and
    `length_logits` (float32 `[None, T + 1]`).

    Args:
        model: a `keras_attn.models.nat_seq2seq` model.
        source_vectorizer: the source `TextVectorization` (as for `export_translator`).
        target_vectorizer: the target `TextVectorization`; its vocabulary detokenizes.
        path: str, the SavedModel directory to write: a new or empty directory (as for
            `export_translator`; keras_attn 0.2 called it `export_dir`).
        max_length: int, the longest output, at most the model's `max_target_length`.
            Defaults to `None` (the model's `max_target_length`).
        iterations: int >= 1, Mask-Predict iterations. Defaults to `10`.
        standardize: optional `tf.strings` preprocessing of the raw text (as for
            `export_translator`). Defaults to `None`.
        joiner: str placed between output tokens. Defaults to `" "`.
        length_beam: int >= 1, candidate lengths decoded per input; the one with the best
            mean log-probability is served. Defaults to `1`.
        word_start: str, the word-start marker of subword pieces (as for
            `export_translator`). Defaults to `None`.

    Returns:
        `path`.

    Example:
    >>> export_nat_translator(model, data.source_vectorizer, data.target_vectorizer,
    ...                       "runs/nat/saved_model", iterations=10,
    ...                       standardize=data.standardize_tf, joiner=data.target_joiner)
    >>> translator = tf.saved_model.load("runs/nat/saved_model")
    >>> translator.signatures["translate"](text=tf.constant(["march 3rd, 2021"]))
    """
    path = legacy.rename(kwargs, "export_nat_translator", {"export_dir": "path"}).get("path", path)
    if kwargs:
        raise TypeError(f"export_nat_translator() got unexpected keyword arguments "
                        f"{sorted(kwargs)}")
    path = check_new_directory("path", path)
    _check_vectorizer("source_vectorizer", source_vectorizer)
    _check_vectorizer("target_vectorizer", target_vectorizer)
    translate = make_nat_translate_fn(
        model, source_vectorizer, target_vectorizer.get_vocabulary(), max_length, iterations,
        standardize, joiner, length_beam, word_start,
    )
    source_length = source_vectorizer.get_config()["output_sequence_length"]
    target_length = int(model.get_layer("length_predictor").max_target_length)

    def serve(source_ids, masked_target_ids):
        token_logits, length_logits = model([source_ids, masked_target_ids], training=False)
        return {"token_logits": tf.cast(token_logits, "float32"),
                "length_logits": tf.cast(length_logits, "float32")}

    return _write_archive(
        path, model, source_vectorizer, translate, serve,
        serve_signature=[
            tf.TensorSpec([None, source_length], tf.int32, name="source_ids"),
            tf.TensorSpec([None, target_length], tf.int32, name="masked_target_ids"),
        ],
    )
