"""SavedModel export of a causal language model: prompt strings in, generated text out, with the
sampling settings as inputs, served by TensorFlow alone.

The exported graph holds tokenization (characters or whitespace-separated words, looked up in
the vocabulary), `<bos>`, the compiled generation loop over the static cache
(`keras_attn.decoding.generate`, the settings a `keras_attn.decoding.samplers.TopP`) and
detokenization. A consumer needs neither keras_attn nor
Keras:

    generator = tf.saved_model.load("runs/char_lm/saved_model")
    generator.signatures["generate"](
        prompt=tf.constant(["the time "]), max_new_tokens=tf.constant(40),
        temperature=tf.constant(0.8), top_k=tf.constant(0), top_p=tf.constant(0.9),
        seed=tf.constant(7))["text"]

Signature `generate`: `prompt` tf.string `[None]` (an empty batch gets empty outputs),
`max_new_tokens` int32 `[]` (at least 1;
`2**31 - 1` = as many as fit), `temperature` float32 `[]` (0 = greedy), `top_k` int32 `[]`
(0 = all tokens), `top_p` float32 `[]` (1 = all), `seed` int32 `[]` → `text` tf.string `[None]`
(the continuation, up to `<eos>`), `truncated` bool `[None]` (the prompt's beginning was cut,
see below), `context` tf.string `[None]` (the prompt as the model read it: standardized,
unknown tokens as `[UNK]`, only its kept end when truncated).

The `max_length` positions hold `<bos>`, the prompt and the continuation. A prompt keeps its
most recent tokens, as many as leave room for `max_new_tokens` new ones, but at least half of
the positions: at most `max_length - 1 - min(max_new_tokens, (max_length - 1) // 2)` tokens.
A longer prompt loses its beginning and says so in `truncated`.

A setting out of range (a NaN or negative `temperature`, `top_p` outside (0, 1], a negative
`top_k` or `seed`, `max_new_tokens` below 1) fails the call with
`tf.errors.InvalidArgumentError` naming it; it is never replaced (`keras_attn.decoding.checks`).
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from keras_attn import decoding
from keras_attn._checks import check_int, check_new_directory
from keras_attn.decoding import checks, samplers
from keras_attn.preprocessing import (
    CausalLMPreprocessor,
    CharacterTokenizer,
    PretrainedTokenizer,
)


def make_generate_fn(model, preprocessor, max_length: int):
    """The graph function of the `generate` signature (module docstring) of `model` read
    through `preprocessor` (a `keras_attn.preprocessing.CausalLMPreprocessor`: its tokenizer,
    template and special ids, the same layout `keras_attn.tasks.CausalLM.generate` uses)."""
    ids = preprocessor.generation_ids()

    def generate(prompt, max_new_tokens, temperature, top_k, top_p, seed):
        settings, sampler = _request(max_length, max_new_tokens, temperature, top_k, top_p,
                                     seed)
        prompts = preprocessor.generate_preprocess(prompt, max_length,
                                                   settings["max_new_tokens"])
        lengths = prompts["lengths"]  # (B,)
        tokens = decoding.generate(
            model, prompts["token_ids"], max_length, sampler=sampler,
            max_new_tokens=settings["max_new_tokens"], prompt_lengths=lengths,
            stop_token_ids=ids["stop_token_ids"] or None, pad_id=ids["pad_id"],
            suppressed_ids=ids["suppressed_ids"])  # (B, L)
        limits = lengths + tf.minimum(settings["max_new_tokens"], max_length - lengths)
        text = preprocessor.generate_postprocess(tokens, lengths, limits)
        return {"text": text, "truncated": prompts["truncated"],
                "context": prompts["context"]}

    return answer_empty_batches(generate)


# The prompt run in place of an empty batch: it encodes to at least one token with every
# vocabulary and tokenizer (a character, a byte, or the unknown id).
PLACEHOLDER_PROMPT = "a"


def answer_empty_batches(generate):
    """`generate` (a `generate` signature's graph function) answering an empty batch of
    prompts with empty outputs: the decoding loop needs a row, so a placeholder prompt is run
    (its settings checked as any call's) and its row dropped."""

    def answered(prompt, max_new_tokens, temperature, top_k, top_p, seed):
        batch = tf.shape(prompt)[0]
        rows = tf.cond(batch > 0, lambda: prompt,
                       lambda: tf.constant([PLACEHOLDER_PROMPT]))  # (max(B, 1),)
        outputs = generate(rows, max_new_tokens, temperature, top_k, top_p, seed)
        return {name: value[:batch] for name, value in outputs.items()}

    return answered


def export_generator(model, vocabulary: list[str], path: str, max_length: int,
                     split: str = "chars", lowercase: bool = False,
                     standardize: Callable[[tf.Tensor], tf.Tensor] | None = None) -> str:
    """Write a SavedModel with a raw-string `generate` signature (module docstring).

    Args:
        model: a causal LM from `keras_attn.models.causal_lm` (a layer named "decoder").
        vocabulary: list of str, token `i` at index `i`, the reserved tokens first (`""`,
            `"[UNK]"`, `"<bos>"`, `"<eos>"`, as `keras_attn.tokens.RESERVED_TOKENS`).
        path: str, the SavedModel directory to write: a new or empty directory (an
            existing file or non-empty directory is refused, never written into).
        max_length: int, positions of the cache: prompt (with `<bos>`) and generated tokens.
        split: `"chars"` (a token per character) or `"whitespace"` (per word).
            Defaults to `"chars"`.
        lowercase: bool, lowercase the prompt first (as the training text was).
            Defaults to `False`.
        standardize: optional function of a `(B,)` string tensor written with `tf.strings`
            ops, run on the prompts (after `lowercase`) before they are split: the
            normalization the training text had, e.g. letters only, as
            `examples/char_lm.py` trains. Defaults to `None` (the prompt as written).

    Returns:
        `path`.

    Example:
    >>> export_generator(model, vocabulary, "runs/lm/saved_model", max_length=128,
    ...                  standardize=lambda s: tf.strings.regex_replace(
    ...                      tf.strings.lower(s), "[^a-z]+", " "))
    """
    path = check_new_directory("path", path)
    check_int("max_length", max_length, 4)
    tokenizer = CharacterTokenizer(list(vocabulary), split, lowercase,
                                   standardize=standardize)
    return export_causal_lm(model, CausalLMPreprocessor(tokenizer), path, max_length)


def export_causal_lm(model, preprocessor, path: str, max_length: int) -> str:
    """Write the SavedModel of a causal LM read through `preprocessor` (a
    `keras_attn.preprocessing.CausalLMPreprocessor`): the `generate` signature of the module
    docstring. `keras_attn.tasks.CausalLM.export`, `export_generator` and
    `export_checkpoint_generator` all write it.

    Args:
        model: a keras_attn causal LM (a layer `"decoder"`; TensorFlow backend).
        preprocessor: its `CausalLMPreprocessor`.
        path: str, the SavedModel directory to write: a new or empty directory.
        max_length: int, positions of the cache: the prompt (with the template) and the
            generated tokens.

    Returns:
        `path`.
    """
    path = check_new_directory("path", path)
    check_int("max_length", max_length, 3)
    generate = make_generate_fn(model, preprocessor, max_length)
    return _write(model, generate, preprocessor.tokenizer.resources(), path)


def _request(max_length: int, max_new_tokens, temperature, top_k, top_p, seed):
    """The request's settings, checked (a failed call naming the input), and its sampler:
    `TopP(p=top_p, k=top_k, temperature=temperature, seed=seed)` (`temperature` 0: greedy)."""
    settings = checks.settings(
        caps={"max_new_tokens": max_length}, max_new_tokens=max_new_tokens,
        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
    sampler = samplers.TopP(p=settings["top_p"], k=settings["top_k"],
                            temperature=settings["temperature"], seed=settings["seed"])
    return settings, sampler


def _write(model, generate, resources, path: str) -> str:
    """The SavedModel at `path`: `model`, the tokenizer's `resources` (tables, modules), and
    the `generate` signature (module docstring) of the graph function `generate`."""
    archive = keras.export.ExportArchive()
    archive.track(model)
    for resource in resources:
        archive.track(resource)
    archive.add_endpoint(
        name="generate",
        fn=generate,
        input_signature=[
            tf.TensorSpec([None], tf.string, name="prompt"),
            tf.TensorSpec([], tf.int32, name="max_new_tokens"),
            tf.TensorSpec([], tf.float32, name="temperature"),
            tf.TensorSpec([], tf.int32, name="top_k"),
            tf.TensorSpec([], tf.float32, name="top_p"),
            tf.TensorSpec([], tf.int32, name="seed"),
        ],
    )
    archive.write_out(path, verbose=False)
    return path


def export_checkpoint_generator(model, tokenizer, spec, path: str, max_length: int) -> str:
    """Write a SavedModel with a raw-string `generate` signature for a pretrained checkpoint.

    As `export_generator` (the same signature and settings), with the checkpoint's tokenizer
    in the graph (`keras_attn.checkpoints.load_tokenizer`: its TensorFlow and tensorflow-text
    ops) and its own ids: the prompt is encoded with the tokenizer's template (Llama's
    `<s>`, ...; an empty prompt of a tokenizer without one starts from `<bos>`), generation
    stops at any of the checkpoint's end ids, and `text` is the continuation up to the end
    id, decoded without special tokens. `context` is the prompt as the model read it (only
    its kept end when `truncated`).

    Serving needs TensorFlow, and tensorflow-text imported (`import tensorflow_text`) so that
    the tokenizer's ops are registered; neither Keras nor keras_attn.

    Args:
        model: the causal LM of `keras_attn.checkpoints.build_model` (TensorFlow backend).
        tokenizer: its `CheckpointTokenizer` (`keras_attn.checkpoints.load_tokenizer`).
        spec: its `ArchitectureSpec` (the end and padding ids).
        path: str, the SavedModel directory to write: a new or empty directory (as for
            `export_generator`).
        max_length: int, positions of the cache: the prompt (with the template) and the
            generated tokens.

    Returns:
        `path`.

    Example:
    >>> model, tokenizer, spec = from_pretrained("path/to/Llama-3.2-1B", dtype="float32")
    >>> export_checkpoint_generator(model, tokenizer, spec, "runs/llama/saved_model", 256)
    """
    from keras_attn.checkpoints.canonical import check_spec

    path = check_new_directory("path", path)
    check_spec(spec)
    check_int("max_length", max_length, 3)
    return export_causal_lm(model, checkpoint_preprocessor(tokenizer, spec), path, max_length)


def checkpoint_preprocessor(tokenizer, spec) -> CausalLMPreprocessor:
    """The `CausalLMPreprocessor` of a checkpoint's `CheckpointTokenizer` with the ids of its
    `ArchitectureSpec` (start, end and padding ids), as `export_checkpoint_generator` serves
    it; a spec of another task than `"causal_lm"` is refused."""
    from keras_attn.checkpoints import generation_ids
    from keras_attn.checkpoints.canonical import check_spec
    from keras_attn.checkpoints.tokenizer_base import CheckpointTokenizer

    check_spec(spec)
    if spec.task != "causal_lm":
        raise ValueError(f"Argument `spec` must describe a causal language model. Received: "
                         f"spec.task={spec.task!r}")
    if not isinstance(tokenizer, CheckpointTokenizer):
        raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
            "Argument `tokenizer` must be the checkpoint's tokenizer "
            "(keras_attn.checkpoints.load_tokenizer). Received: "
            f"tokenizer={tokenizer!r:.100}")
    ids = generation_ids(spec)
    wrapped = PretrainedTokenizer.from_tokenizer(
        tokenizer, start_token_id=spec.bos_token_id, end_token_ids=ids["stop_token_ids"],
        pad_token_id=ids["pad_id"])
    return CausalLMPreprocessor(wrapped)
