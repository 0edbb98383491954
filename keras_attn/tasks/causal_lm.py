"""`CausalLM`: a causal language model as one object — strings in, strings out, `fit` on text,
LoRA, samplers, `.keras` and SavedModel export."""

from __future__ import annotations

import os
import warnings

import keras
import numpy as np

from keras_attn._checks import check_bool, check_int
from keras_attn.decoding import checks
from keras_attn.models.decoder_only import TransformerDecoderOnly
from keras_attn.models.lora import DEFAULT_TARGETS, enable_lora
from keras_attn.preprocessing import CausalLMPreprocessor, PretrainedTokenizer
from keras_attn.preprocessing.chat import as_conversations, is_conversation
from keras_attn.preprocessing.streaming import TextStream, cut_at_stop, stream_pieces
from keras_attn.tasks import generate_inputs
from keras_attn.tasks.task import DEFAULT_BATCH_SIZE, Task, check_not_empty, is_text

# The memory assumed when the machine's cannot be read (`_memory_bytes`).
UNKNOWN_MEMORY_BYTES = 64 * 2**30


def _memory_bytes() -> int:
    """This machine's physical memory in bytes: a key/value cache larger than it for one
    prompt is refused before any memory is asked for."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return UNKNOWN_MEMORY_BYTES


def _backbone(backbone) -> TransformerDecoderOnly:
    """`backbone` as the decoder-only stack: itself, or the layer `"decoder"` of a model
    (`keras_attn.models.causal_lm`, `keras_attn.checkpoints.build_model`)."""
    if isinstance(backbone, keras.Model) and not isinstance(backbone, TransformerDecoderOnly):
        try:
            backbone = backbone.get_layer("decoder")
        except ValueError:
            backbone = None
    if not isinstance(backbone, TransformerDecoderOnly) or backbone.name != "decoder":
        raise ValueError(
            "Argument `backbone` must be a keras_attn `TransformerDecoderOnly` named "
            "'decoder', or a model holding one (keras_attn.models.causal_lm, "
            f"keras_attn.checkpoints.build_model). Received: backbone={backbone!r}")
    return backbone


@keras.saving.register_keras_serializable(package="keras_attn")
class CausalLM(Task):
    """A causal language model with its preprocessor and sampler (keras-hub's `CausalLM`).

    The model takes `{"token_ids": (B, T) int32, "padding_mask": (B, T) bool}` and returns
    float32 next-token logits `(B, T, vocabulary_size)`; its layer `"decoder"` is the backbone,
    which `keras_attn.decoding.generate` decodes over its static cache. With a preprocessor it
    generates from strings and trains on strings.

    Args:
        backbone: a `keras_attn.models.TransformerDecoderOnly` named `"decoder"`, or a model
            holding one (`keras_attn.models.causal_lm(...)`).
        preprocessor: optional `keras_attn.preprocessing.CausalLMPreprocessor` (its tokenizer
            and special ids). Defaults to `None` (token ids in and out).
        sampler: how `generate` chooses tokens: a name (`"greedy"`, ...), a config or a sampler
            of `keras_attn.decoding.samplers`; `compile(sampler=...)` and `generate(...,
            sampler=...)` replace it. Defaults to `"greedy"`.
        compile: bool, compile with the task's defaults (`compile()`) when made, as
            keras-hub's tasks are. Defaults to `True`.

    Example:
    >>> lm = CausalLM.from_pretrained("path/to/Llama-3.2-1B")
    >>> lm.generate("The Time Traveller", max_length=64)
    >>> lm.enable_lora(4); lm.fit(["some text", ...], epochs=1)
    """

    def __init__(self, backbone, preprocessor: CausalLMPreprocessor | None = None,
                 sampler="greedy", compile: bool = True, **kwargs):
        backbone = _backbone(backbone)
        if preprocessor is not None and not isinstance(preprocessor, CausalLMPreprocessor):
            raise ValueError(
                "Argument `preprocessor` must be a CausalLMPreprocessor or None. Received: "
                f"preprocessor={preprocessor!r}")
        inputs = {"token_ids": keras.Input((None,), dtype="int32", name="token_ids"),
                  "padding_mask": keras.Input((None,), dtype="bool", name="padding_mask")}
        logits = backbone(inputs["token_ids"], padding_mask=inputs["padding_mask"])
        kwargs.setdefault("name", "causal_lm")
        super().__init__(inputs, logits, **kwargs)
        self.backbone, self.preprocessor = backbone, preprocessor
        self.sampler = _samplers().get(sampler)
        self._compile_by_default(compile)

    @classmethod
    def from_pretrained(cls, directory: str, dtype: str | None = None,
                        sequence_length: int = 512, sampler="greedy", **kernel) -> CausalLM:
        """A Hugging Face causal LM directory (Llama, Mistral, Qwen2, GPT-2: `config.json`,
        safetensors, tokenizer files) as a `CausalLM`, matching `transformers` to the token.

        Args:
            directory: str, the checkpoint directory.
            dtype: optional `"float32"`, `"bfloat16"` or `"float16"`. Defaults to the stored
                weights'.
            sequence_length: int, the preprocessor's training length. Defaults to `512`.
            sampler: the generation sampler. Defaults to `"greedy"`.
            **kernel: attention kernel options (`implementation`, `chunk_size`,
                `flash_attention`; `keras_attn.checkpoints.build_model`).
        """
        from keras_attn.checkpoints import (
            build_model,
            generation_ids,
            load_hf_checkpoint,
        )

        if not isinstance(directory, str):
            raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
                "Argument `directory` must be the path of a checkpoint directory. "
                f"Received: directory={directory!r}")
        spec, weights = load_hf_checkpoint(directory, dtype)
        if spec.task != "causal_lm":
            raise ValueError(
                f"CausalLM.from_pretrained needs a causal language model; {directory!r} holds "
                f"a {spec.source} ({spec.task!r}). BERT: keras_attn.tasks.TextClassifier.")
        model = build_model(spec, weights, dtype=dtype, **kernel)
        ids = generation_ids(spec)
        tokenizer = PretrainedTokenizer(
            directory, start_token_id=spec.bos_token_id, end_token_ids=tuple(
                spec.eos_token_ids), pad_token_id=ids["pad_id"])
        return cls(model, CausalLMPreprocessor(tokenizer, sequence_length), sampler=sampler)

    def compile(self, optimizer="auto", loss="auto", weighted_metrics="auto", sampler=None,
                **kwargs):
        """`keras.Model.compile` with keras-hub's defaults: AdamW (learning rate 5e-5, weight
        decay 0.01), the cross-entropy of the logits averaged over real tokens, accuracy
        weighted the same way; `sampler` sets how `generate` chooses tokens."""
        if optimizer == "auto":
            optimizer = keras.optimizers.AdamW(5e-5, weight_decay=0.01)
        if loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction="mean_with_sample_weight")
        if weighted_metrics == "auto":
            weighted_metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
        if sampler is not None:
            self.sampler = _samplers().get(sampler)
        super().compile(optimizer=optimizer, loss=loss, weighted_metrics=weighted_metrics,
                        **kwargs)

    def enable_lora(self, rank: int, target_names=DEFAULT_TARGETS, alpha=None) -> list[str]:
        """LoRA on the backbone's attention projections (`keras_attn.models.enable_lora`):
        every other weight frozen. Compile again before `fit`."""
        return enable_lora(self.backbone, rank, target_names, alpha)

    def fit(self, x=None, y=None, batch_size=None, validation_data=None, **kwargs):
        """`keras.Model.fit`; in-memory strings are tokenized once, up front, into arrays
        that Keras batches (`batch_size`, 32 by default), shuffles every epoch (`shuffle`,
        seeded by `keras.utils.set_random_seed`) and splits (`validation_split`), each row
        weighted by its real tokens; a tf.data dataset of strings goes through the
        preprocessor batch by batch (in its own order); `validation_data` likewise."""
        check_not_empty(x)
        if self.preprocessor is not None and is_text(x) and not _is_dataset(x):
            if y is not None:
                raise ValueError("A CausalLM learns the next token of its texts: give `x` "
                                 f"only (strings). Received: y={y!r:.100}")
            if kwargs.get("sample_weight") is not None:
                raise ValueError("A CausalLM weights each label by whether it is a real token: "
                                 "`sample_weight` does not apply to strings.")
            x, y, kwargs["sample_weight"] = self._arrays(x)
            if batch_size is None:
                batch_size = DEFAULT_BATCH_SIZE
        elif _is_dataset(x):  # its own order (Keras warns that it ignores `shuffle`)
            kwargs.setdefault("shuffle", False)
        return super().fit(x, y, batch_size=batch_size, validation_data=validation_data,
                           **kwargs)

    def _arrays(self, texts):
        """In-memory `texts` through the preprocessor: NumPy `(x, y, sample_weight)`."""
        texts = [texts] if isinstance(texts, (str, bytes)) else texts
        if not type(texts).__module__.startswith("tensorflow"):
            texts = np.asarray(texts).astype(str)
        x, y, weights = self.preprocessor(texts)
        return ({name: value.numpy() for name, value in x.items()}, y.numpy(),
                weights.numpy())

    def _text_dataset(self, x, y, batch_size):
        import tensorflow as tf

        if y is not None:
            raise ValueError("A CausalLM learns the next token of its texts: give `x` only "
                             f"(strings). Received: y={y!r:.100}")
        if not isinstance(x, tf.data.Dataset):
            x = tf.data.Dataset.from_tensor_slices(tf.constant(
                [x] if isinstance(x, (str, bytes)) else list(np.asarray(x).astype(str))))
            x = x.batch(batch_size)
        return x.map(self.preprocessor, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)

    # ---- generation ----------------------------------------------------------------------------

    def generate(self, inputs, max_length: int | None = None, *, stop_token_ids="auto",
                 strip_prompt: bool | None = None, sampler=None, max_new_tokens=None,
                 stop_strings=None, stream: bool = False, draft=None,
                 draft_tokens: int | None = None, return_acceptance: bool = False):
        """Continue prompts: strings for strings, token ids for token ids, the assistant's
        reply for a conversation.

        Args:
            inputs: a str or a list of str (needs the preprocessor); a conversation (a list
                of messages `{"role": ..., "content": ...}`) or a list of conversations,
                rendered by the checkpoint's chat template as transformers'
                `apply_chat_template(..., add_generation_prompt=True)` renders them; int token
                ids `(B, P)` right-padded with the padding id, or a dict `{"token_ids",
                "padding_mask"}` (keras-hub's form).
            max_length: int, the longest sequence, prompt included (the cache's positions;
                at most the model's position table, and a cache per prompt that fits in
                this machine's memory).
                A text prompt that leaves room for a new token is kept whole; a longer one
                keeps its last tokens, with a warning. Defaults to the preprocessor's
                `sequence_length` (token ids without one: required).
            stop_token_ids: `"auto"` (the tokenizer's end ids), None (no stop), a token id
                (a Python or NumPy int) or a tuple of ids. Defaults to `"auto"`.
            strip_prompt: bool, return the continuation only; otherwise the prompt and the
                continuation detokenized as one sequence. Defaults to `None`: the whole text
                for string prompts, the reply alone for conversations.
            sampler: optional sampler for this call (default: the model's). Defaults to `None`.
            max_new_tokens: optional int >= 1, new tokens at most per row (any larger than
                fit means as many as fit; with it, a text prompt keeps at most its last
                tokens that leave room for them, but at least half of the positions).
                Defaults to `None`.
            stop_strings: optional str or list of str (text prompts only): each continuation
                ends after the first of them it contains, which it keeps (transformers'
                `stop_strings`). Defaults to `None`.
            stream: bool, return an iterator of the text as it is generated (text prompts
                and conversations; not with beam search): pieces of str for a str or a
                conversation, lists of str (one piece per row, `""` where nothing is new) for
                a list; joined, the pieces are what `stream=False` returns, the prompt (where
                returned) coming first. A piece is never half a character and never changes
                (`keras_attn.preprocessing.streaming`). Defaults to `False`.
            draft: optional smaller `CausalLM` (or causal model of keras_attn) with the same
                vocabulary: speculative decoding (`keras_attn.decoding.speculative`). The
                draft proposes `draft_tokens` tokens, this model verifies them in one pass
                over its cache: the same greedy output, token for token, or draws from this
                model's distribution with a `Random`, `TopK`, `TopP` or `MinP` sampler; not
                with beam search or `stream`. Defaults to `None`.
            draft_tokens: optional int >= 1, tokens the draft proposes per round (with
                `draft`). Defaults to `None` (4).
            return_acceptance: bool (with `draft`), also return the share of drafted tokens
                this model kept. Defaults to `False`.

        Returns:
            A str for a str or a conversation, a list of str for a list; for ids, int32
            `(B, max_length)` (the prompt, the continuation, then padding); with `stream`,
            an iterator of pieces; with `return_acceptance`, `(outputs, acceptance)`.

        Example:
        >>> lm.generate([{"role": "user", "content": "Who is the Time Traveller?"}])
        """
        chat = is_conversation(inputs)
        if chat:
            if self.preprocessor is None:
                raise ValueError("Argument `inputs` is a conversation, which needs a "
                                 "preprocessor with a chat template; this CausalLM has none.")
            conversations, single = as_conversations("inputs", inputs)
            rendered = self.preprocessor.apply_chat_template(conversations)
            inputs = rendered[0] if single else rendered
            strip_prompt = True if strip_prompt is None else strip_prompt
        text = is_text(inputs)
        check_bool("stream", stream)
        if max_length is None:
            if self.preprocessor is None:
                raise ValueError("Argument `max_length` is required without a preprocessor.")
            max_length = self.preprocessor.sequence_length
        check_int("max_length", max_length, 2)
        if strip_prompt is not None:
            check_bool("strip_prompt", strip_prompt)
        self._check_positions(int(max_length))
        if max_new_tokens is not None:  # at most 2**31 - 1 (as many as fit), before any cast
            max_new_tokens = checks.scalar("max_new_tokens", max_new_tokens,
                                           checks.POSITIVE_INT)
        sampler = self.sampler if sampler is None else _samplers().get(sampler)
        stops = generate_inputs.stop_strings(stop_strings)
        if stops and not text:
            raise ValueError("Argument `stop_strings` applies to text prompts; token ids stop "
                             "at `stop_token_ids`.")
        if stream:
            beam = sampler.beam()
            if not text or (beam is not None and beam.num_beams > 1):
                raise ValueError(
                    "Argument `stream` applies to text prompts and conversations decoded one "
                    "token at a time; a beam search's text is known only at its end, and "
                    f"token ids come back whole. Received: stream=True, sampler={sampler!r}, "
                    f"inputs={'text' if text else 'token ids'}")
        speculation = generate_inputs.speculation(draft, draft_tokens, return_acceptance, stream, sampler)
        if text:
            return self._generate_text(inputs, int(max_length), stop_token_ids,
                                       bool(strip_prompt), sampler, max_new_tokens, stops,
                                       add_special_tokens=not chat, stream=stream,
                                       speculation=speculation)
        token_ids, lengths = generate_inputs.prompt_ids(inputs)
        ids = self._ids(stop_token_ids)
        if strip_prompt:
            raise ValueError("Argument `strip_prompt` applies to strings; token ids come back "
                             "whole (the prompt's lengths say where each continuation starts).")
        return self._decode(token_ids, lengths, int(max_length), max_new_tokens, ids, sampler,
                            speculation=speculation)

    def _ids(self, stop_token_ids) -> dict:
        """The generation ids: the preprocessor's (derived once), with `stop_token_ids`."""
        if self.preprocessor is not None:
            ids = dict(self.preprocessor.generation_ids())
        else:
            pad = self.backbone.pad_id
            ids = {"stop_token_ids": (3,), "pad_id": 0 if pad is None else pad,
                   "suppressed_ids": None}
        if isinstance(stop_token_ids, str) and stop_token_ids == "auto":
            return ids
        if stop_token_ids is None:
            ids["stop_token_ids"] = ()
            return ids
        stops = [stop_token_ids] if isinstance(stop_token_ids, (int, np.integer)) else (
            stop_token_ids)
        if isinstance(stops, np.ndarray) and stops.ndim == 1:
            stops = stops.tolist()
        if not isinstance(stops, (list, tuple)) or not all(
                isinstance(i, (int, np.integer)) and not isinstance(i, bool) and i >= 0
                for i in stops):
            raise ValueError(
                "Argument `stop_token_ids` must be \"auto\", None, a token id or a tuple of "
                f"them (non-negative ints). Received: stop_token_ids={stop_token_ids!r:.200}")
        ids["stop_token_ids"] = tuple(int(i) for i in stops)
        return ids

    def _check_positions(self, max_length: int) -> None:
        """A ValueError naming `max_length` when the backbone cannot hold that many positions:
        its position table's length, or a static cache for one prompt (keys and values of
        every layer, in the compute dtype) larger than this machine's memory."""
        table = getattr(self.backbone, "max_sequence_length", None)
        if isinstance(table, int) and max_length > table:
            raise ValueError(
                f"Argument `max_length` must be at most the model's {table} positions "
                f"(its position table). Received: max_length={max_length}")
        config = self.backbone.get_config()
        attention = (config.get("block") or {}).get("attention") or {}
        heads = attention.get("num_key_value_heads") or attention.get("num_heads") or 1
        head_dim = attention.get("head_dim") or config.get("hidden_dim", 1) // max(
            attention.get("num_heads") or 1, 1)
        itemsize = 2 if self.backbone.compute_dtype in ("float16", "bfloat16") else 4
        per_row = 2 * itemsize * config.get("num_layers", 1) * heads * head_dim * max_length
        memory = _memory_bytes()
        if per_row > memory:
            raise ValueError(
                f"Argument `max_length` asks for a key/value cache of {per_row / 2**30:.1f} GiB "
                f"per prompt, more than this machine's {memory / 2**30:.1f} GiB. Received: "
                f"max_length={max_length}")

    def _generate_text(self, inputs, max_length, stop_token_ids, strip_prompt, sampler,
                       max_new_tokens, stops=(), add_special_tokens=True, stream=False,
                       speculation=None):
        import tensorflow as tf

        single = isinstance(inputs, (str, bytes))
        new = max_length if max_new_tokens is None else max_new_tokens
        prompts = self.preprocessor.generate_preprocess(inputs, max_length, max_new_tokens,
                                                        add_special_tokens)
        if bool(np.any(prompts["truncated"].numpy())):
            warnings.warn(
                f"A prompt does not fit in max_length={max_length} positions with room for "
                "new tokens: it keeps its last tokens (its beginning is cut).", stacklevel=3)
        ids = self._ids(stop_token_ids)
        lengths = prompts["lengths"]
        limits = lengths + tf.minimum(tf.cast(new, tf.int32), max_length - lengths)
        context = [] if strip_prompt else [t.decode("utf-8") for t in
                                           prompts["context"].numpy()]

        def decode(on_step=None):
            return self._decode(prompts["token_ids"].numpy(), lengths.numpy(), max_length,
                                max_new_tokens, ids, sampler, on_step, speculation)

        def texts_of(tokens):
            tokens = keras.ops.convert_to_numpy(tokens)
            if not context:
                continuation = self.preprocessor.generate_postprocess(
                    tokens, lengths, limits, stop_ids=ids["stop_token_ids"])
                return [cut_at_stop(t.decode("utf-8"), stops)[0] for t in continuation.numpy()]
            # The prompt and its continuation detokenized as one sequence (a word tokenizer
            # joins them with its separator); a stop string counts in the continuation only.
            whole = self.preprocessor.generate_postprocess(
                tokens, lengths, limits, stop_ids=ids["stop_token_ids"], keep_prompt=True)
            texts = [w.decode("utf-8") for w in whole.numpy()]
            starts = [len(os.path.commonprefix([c, w])) for c, w in zip(context, texts)]
            return [w[:start] + cut_at_stop(w[start:], stops)[0]
                    for w, start in zip(texts, starts)]

        if stream:
            text_stream = TextStream(self.preprocessor.tokenizer, lengths.numpy(),
                                     limits.numpy(), ids["stop_token_ids"], stops,
                                     prompts=context or None)
            pieces = stream_pieces(decode, text_stream, texts_of)
            return (rows[0] for rows in pieces) if single else pieces
        outputs = decode()
        if speculation is not None and speculation["return_acceptance"]:
            texts = texts_of(outputs[0])
            return (texts[0] if single else texts), outputs[1]
        texts = texts_of(outputs)
        return texts[0] if single else texts

    def _decode(self, token_ids, lengths, max_length, max_new_tokens, ids, sampler,
                on_step=None, speculation=None):
        from keras_attn.decoding import generation

        return generation.run(
            self, token_ids, max_length, sampler=sampler, max_new_tokens=max_new_tokens,
            stop_token_ids=ids["stop_token_ids"] or None, pad_id=ids["pad_id"],
            suppressed_ids=ids["suppressed_ids"], prompt_lengths=lengths, on_step=on_step,
            **(speculation or {}))

    def export(self, path: str, max_length: int | None = None,
               format: str = "tf_saved_model") -> str:
        """Write the model for serving.

        `format="tf_saved_model"`: a SavedModel whose `generate` signature takes prompt
        strings (with its settings `max_new_tokens`, `temperature`, `top_k`, `top_p`, `seed`)
        and returns the generated `text`, `truncated` and `context`: the tokenizer, the
        decoding loop and the detokenization in the graph, served by TensorFlow (+
        tensorflow-text's ops for a checkpoint's tokenizer) alone
        (`keras_attn.export_generator.export_causal_lm`). A LoRA model exports its merged
        kernels' values.

        `format="onnx"` or `"litert"`: token ids in and out, the loop outside the graph:
        `forward` (logits of `token_ids` and `padding_mask`) and `decode_step` (one token
        through the static cache of `max_length` positions, the caches as inputs and
        outputs) with an `export.json` (`keras_attn.export_decoding`);
        `keras_attn.export_steps.greedy(path, token_ids)` generates with them as `generate`
        does greedily (NumPy and onnxruntime or ai-edge-litert only).

        TensorFlow backend only.

        Args:
            path: str, a new or empty directory.
            max_length: int, the cache's positions: prompt (with the template) and generated
                tokens. Defaults to the preprocessor's `sequence_length` (required without
                a preprocessor, ONNX and LiteRT).
            format: `"tf_saved_model"`, `"onnx"` or `"litert"`. Defaults to
                `"tf_saved_model"`.

        Returns:
            `path`.
        """
        from keras_attn.export_decoding import check_format

        check_format("CausalLM", format)
        if format == "tf_saved_model":
            self._check_exportable()
            from keras_attn.export_generator import export_causal_lm

            if max_length is None:
                max_length = self.preprocessor.sequence_length
            return export_causal_lm(self, self.preprocessor, path, max_length)
        from keras_attn.decoding import special_ids
        from keras_attn.export_decoding import export_causal_lm

        max_length = self._steps_max_length(max_length, format, "sequence_length", 2)
        self._check_positions(max_length)
        ids = self._ids("auto")
        ids = special_ids(self, stop_token_ids=ids["stop_token_ids"] or None,
                          pad_id=ids["pad_id"], suppressed_ids=ids["suppressed_ids"])
        return export_causal_lm(self, path, format, max_length, ids)

    def get_config(self):
        config = super().get_config()
        config["sampler"] = _samplers().serialize(self.sampler)
        return config


def _samplers():
    from keras_attn.decoding import samplers

    return samplers


def _is_dataset(x) -> bool:
    if not type(x).__module__.startswith("tensorflow"):
        return False
    import tensorflow as tf

    return isinstance(x, tf.data.Dataset)
