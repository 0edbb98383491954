"""Strings to what a causal language model takes, and its tokens back to strings.

`CausalLMPreprocessor` is the one place a causal LM's special ids are derived (from its
tokenizer), the one packing of text for training, and the one prompt layout for generation;
`keras_attn.tasks.CausalLM`, the exported `generate` signature
(`keras_attn.export_generator`) and the fine-tuning example all call it.
"""

from __future__ import annotations

import keras

from keras_attn._checks import check_int
from keras_attn._traced import TracedFunctions
from keras_attn.preprocessing.tokenizers import (
    Tokenizer,
    as_string_tensor,
    as_tokenizer,
)


@keras.saving.register_keras_serializable(package="keras_attn")
class CausalLMPreprocessor(keras.layers.Layer):
    """A tokenizer and the layout of a causal LM's sequences (keras-hub's
    `CausalLMPreprocessor`).

    Training (`__call__` on a batch of strings): each text is the tokenizer's template
    (`<s>` text, `<bos>` text, ...) followed by its first end id, cut to `sequence_length + 1`
    ids; `x = {"token_ids", "padding_mask"}` are the first `sequence_length`, `y` the next ids
    (the labels), and `sample_weight` is 1 where a label is a real token. Generation
    (`generate_preprocess`): the prompt with the template, right-padded; the continuation comes
    back through `generate_postprocess`.

    Args:
        tokenizer: a `keras_attn.preprocessing.Tokenizer` (`CharacterTokenizer`,
            `PretrainedTokenizer`).
        sequence_length: int, the training length (ids per row). Defaults to `512`.

    Call arguments:
        texts: strings `(B,)`.

    Returns:
        `(x, y, sample_weight)`: `{"token_ids": int32 (B, L), "padding_mask": bool (B, L)}`,
        int32 `(B, L)`, float32 `(B, L)` with `L = sequence_length`.

    Example:
    >>> preprocessor = CausalLMPreprocessor(tokenizer, sequence_length=128)
    >>> x, y, weights = preprocessor(["The Time Traveller smiled."])
    """

    def __init__(self, tokenizer: Tokenizer, sequence_length: int = 512, **kwargs):
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        tokenizer = as_tokenizer(tokenizer)
        check_int("sequence_length", sequence_length, 2)
        self.tokenizer, self.sequence_length = tokenizer, int(sequence_length)
        self._functions = TracedFunctions()  # generate_pre/postprocess's eager calls
        self.built = True

    # ---- the special ids, derived once -------------------------------------------------------

    def generation_ids(self) -> dict:
        """The ids generation needs, from the tokenizer: `stop_token_ids` (a tuple, possibly
        empty), `pad_id` (the padding id; without one the first end id, as `transformers`
        pads, else 0) and `suppressed_ids` (keras_attn's reserved padding and `<bos>` for its
        own vocabularies; nothing for a checkpoint's, whose ids are all tokens)."""
        tokenizer = self.tokenizer
        stops = tuple(tokenizer.end_token_ids)
        pad = tokenizer.pad_token_id
        if pad is None:
            pad = stops[0] if stops else 0
        own = getattr(tokenizer, "prefix_ids", ()) == (tokenizer.start_token_id,) and hasattr(
            tokenizer, "vocabulary")
        return {"stop_token_ids": stops, "pad_id": int(pad),
                "suppressed_ids": (tokenizer.pad_token_id, tokenizer.start_token_id) if own
                else ()}

    # ---- training --------------------------------------------------------------------------

    def call(self, texts):
        import tensorflow as tf

        ids = self.tokenizer.tokenize(as_string_tensor("texts", texts))  # ragged (B, None)
        stops = self.tokenizer.end_token_ids
        if stops and tuple(self.tokenizer.suffix_ids[-1:]) != stops[:1]:
            end = tf.fill([ids.nrows(), 1], tf.constant(stops[0], tf.int32))
            ids = tf.concat([ids, tf.RaggedTensor.from_tensor(end)], axis=1)
        ids = ids[:, :self.sequence_length + 1]
        pad = self.generation_ids()["pad_id"]
        shape = [None, self.sequence_length + 1]
        dense = ids.to_tensor(default_value=pad, shape=shape)  # (B, L + 1)
        real = tf.sequence_mask(ids.row_lengths(), self.sequence_length + 1)  # (B, L + 1)
        x = {"token_ids": dense[:, :-1], "padding_mask": real[:, :-1]}
        return x, dense[:, 1:], tf.cast(real[:, 1:], tf.float32)

    # ---- generation ------------------------------------------------------------------------

    def apply_chat_template(self, conversations, add_generation_prompt: bool = True,
                            **variables) -> list[str]:
        """The prompt text of conversations, rendered by the tokenizer's chat template as
        transformers' `apply_chat_template(..., tokenize=False)` renders it
        (`keras_attn.preprocessing.chat`).

        Args:
            conversations: a conversation (a list of dicts with `"role"` and `"content"`) or
                a list of them.
            add_generation_prompt: bool, end with the assistant's header. Defaults to `True`.
            **variables: more template variables (e.g. `date_string`).

        Returns:
            list of str, one per conversation; tokenize them with `add_special_tokens=False`
            (`generate_preprocess(..., add_special_tokens=False)`).

        Raises:
            ValueError: the tokenizer has no chat template, a message has no `"role"`, or the
                template refused the conversation.
        """
        template = self.tokenizer.chat_template
        if template is None:
            raise ValueError(
                "Argument `inputs` is a conversation, but this tokenizer has no chat template "
                "(a checkpoint's `chat_template` in tokenizer_config.json or "
                "chat_template.jinja). Give the prompt as a string instead. Received: "
                f"tokenizer={type(self.tokenizer).__name__}")
        return template.render(conversations, add_generation_prompt, **variables)

    def generate_preprocess(self, texts, max_length: int, max_new_tokens,
                            add_special_tokens: bool = True):
        """The prompts as the model reads them when generating up to `max_length` ids.

        A prompt keeps its most recent tokens, as many as leave room for `max_new_tokens` new
        ones, but at least half of the positions; with `max_new_tokens=None` a prompt that
        leaves room for one new token is kept whole (a longer one keeps its end). An empty
        prompt of a tokenizer without a template starts from its start id. With
        `add_special_tokens=False` (prompts rendered by a chat template, which writes its own
        special tokens) the tokenizer's template is left out.

        Args:
            texts: strings `(B,)`.
            max_length: int, the positions: template, prompt and new tokens.
            max_new_tokens: int, int32 scalar tensor (at most `2**31 - 1`) or None.
            add_special_tokens: bool, whether the tokenizer's template (start and end ids)
                wraps each prompt. Defaults to `True`.

        Returns:
            dict: `token_ids` int32 `(B, P)` right-padded with the padding id, `lengths` int32
            `(B,)`, `truncated` bool `(B,)` (the prompt lost its beginning), `context`
            strings `(B,)` (the prompt as read).
        """
        import tensorflow as tf

        tokenizer = self.tokenizer
        texts = as_string_tensor("prompt", texts)
        prefix, suffix = ((tokenizer.prefix_ids, tokenizer.suffix_ids) if add_special_tokens
                          else ((), ()))
        template = len(prefix) + len(suffix)
        if max_length < template + 3:
            raise ValueError(
                f"Argument `max_length` must leave room for the template's {template} ids, a "
                f"prompt token and a new one. Received: max_length={max_length}")
        if not tf.executing_eagerly():  # inside the caller's graph (an exported generator)
            return self._generate_preprocess(texts, max_length, max_new_tokens,
                                             add_special_tokens, prefix, suffix)
        # Eagerly, one traced graph per static setting (not op by op, ~10 ms a call).
        whole = max_new_tokens is None
        # `max_length` an argument too: a new length traces nothing.
        function = self._traced(
            ("preprocess", whole, bool(add_special_tokens)),
            lambda t, n, m: self._generate_preprocess(t, m, None if whole else n,
                                                      add_special_tokens, prefix, suffix),
            tf.TensorSpec([None], tf.string), tf.TensorSpec([], tf.int32),
            tf.TensorSpec([], tf.int32))
        return function(texts, tf.constant(0, tf.int32) if whole
                        else tf.cast(max_new_tokens, tf.int32),
                        tf.constant(int(max_length), tf.int32))

    def _generate_preprocess(self, texts, max_length, max_new_tokens, add_special_tokens,
                             prefix, suffix):
        import tensorflow as tf

        tokenizer = self.tokenizer
        batch = tf.shape(texts)[0]
        body = tokenizer.tokenize(texts, add_special_tokens=False)  # ragged (B, None)
        template = len(prefix) + len(suffix)
        if max_new_tokens is None:  # the whole prompt when it fits, as transformers keeps it
            room = 1
        else:
            room = tf.minimum(tf.cast(max_new_tokens, tf.int32), (max_length - 1) // 2)
        kept = max_length - room - template  # >= 1
        truncated = body.row_lengths() > tf.cast(kept, tf.int64)
        body = body[:, -kept:]

        def rows(values):
            tiled = tf.tile(tf.constant(values, tf.int32, shape=[1, len(values)]),
                            tf.stack([batch, 1]))
            return tf.RaggedTensor.from_tensor(tiled)

        ids = tf.concat([rows(prefix), body, rows(suffix)], axis=1)
        start = tokenizer.start_token_id
        if not template and start is not None and add_special_tokens:  # empty: from <bos>
            empty = tf.cast(ids.row_lengths() == 0, tf.int64)
            starts = tf.RaggedTensor.from_row_lengths(
                tf.fill([tf.reduce_sum(empty)], tf.constant(start, tf.int32)), empty)
            ids = tf.concat([starts, ids], axis=1)
        pad = self.generation_ids()["pad_id"]
        return {"token_ids": ids.to_tensor(default_value=pad),
                "lengths": tf.cast(ids.row_lengths(), tf.int32), "truncated": truncated,
                "context": tokenizer.detokenize(ids)}

    def generate_postprocess(self, tokens, lengths, limits=None, stop_ids=None,
                             keep_prompt: bool = False):
        """The text of the continuations in `tokens` `(B, L)` whose prompts have `lengths`
        `(B,)`: from the end of the prompt to the first stop id (excluded; default the
        tokenizer's end ids) or `limits` `(B,)`; special tokens dropped. With `keep_prompt`,
        the text of the prompt and its continuation detokenized as one sequence (so a
        word-level tokenizer's separator joins them). Strings `(B,)`."""
        import tensorflow as tf

        tokens = tf.convert_to_tensor(keras.ops.convert_to_numpy(tokens) if not tf.is_tensor(
            tokens) else tokens)
        tokens = tf.cast(tokens, tf.int32)
        lengths = tf.cast(lengths, tf.int32)
        stop_ids = tuple(int(i) for i in (self.tokenizer.end_token_ids if stop_ids is None
                                          else stop_ids))
        if limits is None:
            limits = tf.fill(tf.shape(lengths), tf.shape(tokens)[1])
        limits = tf.cast(limits, tf.int32)
        if not tf.executing_eagerly():
            return self._generate_postprocess(tokens, lengths, limits, stop_ids, keep_prompt)
        function = self._traced(
            ("postprocess", stop_ids, bool(keep_prompt)),
            lambda t, n, m: self._generate_postprocess(t, n, m, stop_ids, keep_prompt),
            tf.TensorSpec([None, None], tf.int32), tf.TensorSpec([None], tf.int32),
            tf.TensorSpec([None], tf.int32))
        return function(tokens, lengths, limits)

    def _generate_postprocess(self, tokens, lengths, limits, stop_ids, keep_prompt):
        import tensorflow as tf

        length = tf.shape(tokens)[1]
        positions = tf.range(length)[None, :]  # (1, L)
        new = (positions >= lengths[:, None]) & (positions < limits[:, None])  # (B, L)
        stops = tf.constant(stop_ids, tf.int32, shape=[len(stop_ids)])
        ends = tf.reduce_any(tokens[:, :, None] == stops[None, None, :], axis=-1)
        ended = tf.cumsum(tf.cast(ends & new, tf.int32), axis=1) > 0  # the end and after
        kept = (positions < limits[:, None]) if keep_prompt else new  # (B, L)
        return self.tokenizer.detokenize(tf.ragged.boolean_mask(tokens, kept & ~ended))

    def _traced(self, key, function, *signature):
        """`function` traced once per `key` for the tensors of `signature`."""
        return self._functions.get(key, function, *signature)

    def __call__(self, texts):
        # Strings are TensorFlow tensors whatever the backend: no conversion to the backend's.
        return self.call(texts)

    def get_config(self):
        config = super().get_config()
        config.update({"tokenizer": keras.layers.serialize(self.tokenizer),
                       "sequence_length": self.sequence_length})
        return config
