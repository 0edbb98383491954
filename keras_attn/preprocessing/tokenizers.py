"""Tokenizers as Keras layers: text to token ids and back with TensorFlow ops, saved with the
model that holds them.

Every tokenizer has the same small interface, which the preprocessors, the task models and the
exported SavedModels read:

- `tokenize(texts, add_special_tokens=True)`: strings `(B,)` -> `tf.RaggedTensor` int32
  `(B, None)`, with the template's special tokens (`prefix_ids`, `suffix_ids`) when asked;
- `detokenize(ids)`: int ids `(B, T)` (dense or ragged) -> strings `(B,)`, special tokens
  and padding dropped;
- `vocabulary_size`, `start_token_id` (or None), `end_token_ids` (a tuple, possibly empty),
  `pad_token_id` (or None): the special ids, derived once, here.

They compute with TensorFlow whatever the Keras backend (as keras-hub's tokenizers do): on JAX
and torch a task tokenizes eagerly and hands NumPy ids to the model. TensorFlow is imported
when a tokenizer first runs, not when this module is imported.

- `CharacterTokenizer`: a vocabulary of characters (or of whitespace-separated words) with
  keras_attn's reserved ids (`keras_attn.tokens`): the language models trained here.
- `PretrainedTokenizer`: a Hugging Face checkpoint's tokenizer files
  (`keras_attn.checkpoints.load_tokenizer`), kept in the `.keras` file's assets.
"""

from __future__ import annotations

import os

import keras

from keras_attn._checks import check_bool, check_int, check_one_of
from keras_attn.tokens import (
    BOS_ID,
    EOS_ID,
    FIRST_WORD_ID,
    PAD_ID,
    RESERVED_TOKENS,
    UNK_ID,
)

# The files of a Hugging Face tokenizer that `load_tokenizer` reads.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json",
                   "special_tokens_map.json", "vocab.txt", "vocab.json", "merges.txt",
                   "chat_template.jinja")


def _ids_tuple(name: str, ids, vocabulary_size: int) -> tuple:
    """`ids` (None, an int or a sequence of ints) as a tuple of ids below `vocabulary_size`."""
    if ids is None:
        return ()
    values = (ids,) if isinstance(ids, int) and not isinstance(ids, bool) else ids
    if not isinstance(values, (tuple, list)) or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocabulary_size
            for i in values):
        raise ValueError(
            f"Received an invalid value for argument `{name}`, expected None, an id or a "
            f"tuple of ids in [0, {vocabulary_size}). Received: {name}={ids!r}")
    return tuple(int(i) for i in values)


class Tokenizer(keras.layers.Layer):
    """What every tokenizer layer has (module docstring); subclasses implement `_tokenize`
    (no special tokens), `_detokenize`, `vocabulary_size` and the special ids."""

    prefix_ids: tuple = ()
    suffix_ids: tuple = ()
    # A `keras_attn.preprocessing.chat.ChatTemplate`, or None: the tokenizer has none.
    chat_template = None

    def __init__(self, **kwargs):
        kwargs.setdefault("trainable", False)
        super().__init__(**kwargs)
        self.built = True  # no weights

    def tokenize(self, texts, add_special_tokens: bool = True):
        """Token ids of `texts`.

        Args:
            texts: a str, a list of str or a string tensor `(B,)` (a scalar is a batch of
                one).
            add_special_tokens: bool, add the template's ids (`prefix_ids`, `suffix_ids`).
                Defaults to `True`.

        Returns:
            `tf.RaggedTensor` int32 `(B, None)`.
        """
        import tensorflow as tf

        texts = as_string_tensor("texts", texts)
        ids = self._tokenize(texts)
        if add_special_tokens and (self.prefix_ids or self.suffix_ids):
            batch = tf.shape(texts)[:1]
            rows = [tf.RaggedTensor.from_tensor(tf.tile(
                tf.constant(part, tf.int32, shape=[1, len(part)]), tf.concat([batch, [1]], 0)))
                for part in (self.prefix_ids, self.suffix_ids)]
            ids = tf.concat([rows[0], ids, rows[1]], axis=1)
        return ids

    def detokenize(self, ids):
        """The text of `ids` (int `(B, T)`, ragged `(B, None)` or nested lists), special
        tokens, padding and ids outside the vocabulary dropped: strings `(B,)`."""
        import tensorflow as tf

        if isinstance(ids, (list, tuple)):
            ids = tf.ragged.constant(ids, dtype=tf.int32, ragged_rank=1)
        elif not isinstance(ids, tf.RaggedTensor):
            ids = tf.convert_to_tensor(keras.ops.convert_to_numpy(ids) if not tf.is_tensor(
                ids) else ids)
            if ids.dtype.is_floating:
                raise ValueError(f"Argument `ids` must be integer token ids. Received: "
                                 f"ids.dtype={ids.dtype.name}")
            ids = tf.RaggedTensor.from_tensor(ids)
        return self._detokenize(tf.cast(ids, tf.int32))

    def __call__(self, texts, add_special_tokens: bool = True):
        return self.tokenize(texts, add_special_tokens)

    def resources(self) -> list:
        """The TensorFlow objects (lookup tables, modules) the tokenizer computes with: what a
        SavedModel holding it must track."""
        return []

    def compute_output_spec(self, *args, **kwargs):  # pragma: no cover - eager only
        raise NotImplementedError("Tokenizers run eagerly or inside tf.function.")


def as_tokenizer(tokenizer) -> Tokenizer:
    """`tokenizer` (a `Tokenizer` layer, or its config as a `.keras` file holds it) as a
    `Tokenizer`; anything else is a ValueError naming `tokenizer`."""
    if isinstance(tokenizer, dict):
        tokenizer = keras.layers.deserialize(tokenizer)
    if not isinstance(tokenizer, Tokenizer):
        raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
            "Argument `tokenizer` must be a keras_attn.preprocessing.Tokenizer "
            f"(CharacterTokenizer, PretrainedTokenizer). Received: tokenizer={tokenizer!r}")
    return tokenizer


def as_string_tensor(name: str, texts):
    """`texts` (a str, list of str, NumPy strings or a string tensor) as a string tensor of rank
    1; nested lists and numbers are a ValueError naming `name`."""
    import tensorflow as tf

    if isinstance(texts, (str, bytes)):
        texts = [texts]
    if isinstance(texts, (list, tuple)) and not all(isinstance(t, (str, bytes)) for t in texts):
        raise ValueError(f"Argument `{name}` must be a string or a list of strings. Received: "
                         f"{name}={texts!r:.200}")
    try:
        texts = tf.convert_to_tensor(texts, tf.string)
    except (TypeError, ValueError) as error:
        raise ValueError(f"Argument `{name}` must be strings. Received: {name}={texts!r:.200}"
                         ) from error
    if texts.shape.rank == 0:
        texts = texts[None]
    if texts.shape.rank != 1:
        raise ValueError(f"Argument `{name}` must be a batch of strings (rank 1). Received: "
                         f"{name}.shape={tuple(texts.shape)}")
    return texts


@keras.saving.register_keras_serializable(package="keras_attn")
class CharacterTokenizer(Tokenizer):
    """Characters (or whitespace-separated words) looked up in a vocabulary that starts with
    keras_attn's reserved tokens: padding 0, `[UNK]` 1, `<bos>` 2, `<eos>` 3
    (`keras_attn.tokens`). The template is `<bos>` text; generation ends at `<eos>`.

    Args:
        vocabulary: list of str, the token of every id; its first four are
            `keras_attn.tokens.RESERVED_TOKENS`.
        split: `"chars"` (each character a token) or `"whitespace"` (words). Defaults to
            `"chars"`.
        lowercase: bool, lowercase the text first. Defaults to `False`.
        replace: optional regular expression (RE2): every match becomes one space, after
            lowercasing (e.g. `"[^a-z]+"`). Defaults to `None`.
        standardize: optional function of a `(B,)` string tensor written with `tf.strings`
            ops, run after `lowercase` and `replace` (a registered Keras-serializable function
            saves with the layer; any other is for exports only). Defaults to `None`.

    Example:
    >>> tokenizer = CharacterTokenizer(list(keras_attn.tokens.RESERVED_TOKENS) + list("abc "))
    >>> tokenizer.tokenize(["abc"]).to_list()  # [[2, 4, 5, 6]]
    >>> tokenizer.detokenize([[2, 4, 5, 6, 3]]).numpy()  # [b"abc"]
    """

    prefix_ids = (BOS_ID,)

    def __init__(self, vocabulary, split: str = "chars", lowercase: bool = False,
                 replace: str | None = None, standardize=None, **kwargs):
        super().__init__(**kwargs)
        vocabulary = list(vocabulary) if isinstance(vocabulary, (list, tuple)) else vocabulary
        if not isinstance(vocabulary, list) or not all(isinstance(t, str) for t in vocabulary):
            raise ValueError("Received an invalid value for argument `vocabulary`, expected a "
                             f"list of str. Received: vocabulary={vocabulary!r:.200}")
        if tuple(vocabulary[:FIRST_WORD_ID]) != RESERVED_TOKENS:
            raise ValueError(
                f"Argument `vocabulary` must start with keras_attn's reserved tokens "
                f"{RESERVED_TOKENS}. Received: vocabulary[:4]={vocabulary[:FIRST_WORD_ID]!r}")
        if len(set(vocabulary)) != len(vocabulary):
            raise ValueError("Argument `vocabulary` has repeated tokens.")
        check_one_of("split", split, ("chars", "whitespace"))
        check_bool("lowercase", lowercase)
        if replace is not None and not isinstance(replace, str):
            raise ValueError("Received an invalid value for argument `replace`, expected None "
                             f"or a regular expression. Received: replace={replace!r}")
        if isinstance(standardize, (str, dict)):
            standardize = keras.saving.deserialize_keras_object(standardize)
        if standardize is not None and not callable(standardize):
            raise ValueError("Received an invalid value for argument `standardize`, expected "
                             f"None or a function. Received: standardize={standardize!r}")
        self.vocabulary, self.split = vocabulary, split
        self.lowercase, self.replace, self.standardize_fn = lowercase, replace, standardize
        self._table = None

    vocabulary_size = property(lambda self: len(self.vocabulary))
    start_token_id = BOS_ID
    end_token_ids = (EOS_ID,)
    pad_token_id = PAD_ID

    @property
    def joiner(self) -> str:
        return "" if self.split == "chars" else " "

    def _lookup(self):
        import tensorflow as tf

        if self._table is None:
            # Made eagerly even when first needed inside a function (a tf.data map, a
            # tf.function): a table made in that function's graph could not be used after it.
            with tf.init_scope():
                self._table = tf.lookup.StaticHashTable(
                    tf.lookup.KeyValueTensorInitializer(
                        tf.constant(self.vocabulary), tf.range(len(self.vocabulary),
                                                               dtype=tf.int32)),
                    default_value=UNK_ID)
                self._words = tf.constant(self.vocabulary)
        return self._table

    def standardize(self, texts):
        """The text as it is tokenized: lowercased, `replace` matches as one space."""
        import tensorflow as tf

        if self.lowercase:
            texts = tf.strings.lower(texts, encoding="utf-8")
        if self.replace is not None:
            texts = tf.strings.regex_replace(texts, self.replace, " ")
        if self.standardize_fn is not None:
            texts = self.standardize_fn(texts)
        return texts

    def resources(self) -> list:
        return [self._lookup()]

    def _tokenize(self, texts):
        import tensorflow as tf

        texts = self.standardize(texts)
        pieces = (tf.strings.unicode_split(texts, "UTF-8") if self.split == "chars"
                  else tf.strings.split(texts))  # ragged (B, None) strings
        return self._lookup().lookup(pieces)

    def _detokenize(self, ids):
        import tensorflow as tf

        self._lookup()
        kept = (ids >= FIRST_WORD_ID) & (ids < len(self.vocabulary)) | (ids == UNK_ID)
        pieces = tf.gather(self._words, tf.ragged.boolean_mask(ids, kept))
        return tf.strings.reduce_join(pieces, axis=-1, separator=self.joiner)

    def get_config(self):
        config = super().get_config()
        config.update({"vocabulary": list(self.vocabulary), "split": self.split,
                       "lowercase": self.lowercase, "replace": self.replace,
                       "standardize": None if self.standardize_fn is None else
                       keras.saving.serialize_keras_object(self.standardize_fn)})
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
class PretrainedTokenizer(Tokenizer):
    """A Hugging Face checkpoint's tokenizer (`keras_attn.checkpoints.load_tokenizer`: exactly
    the `tokenizers` library's ids, as TensorFlow and tensorflow-text ops), its files kept in
    the `.keras` file's assets.

    Args:
        directory: optional str, the checkpoint directory holding the tokenizer files
            (`tokenizer.json`, `tokenizer.model`, `vocab.txt`, ...). None when the files come
            from a `.keras` file's assets. Defaults to `None`.
        start_token_id, end_token_ids, pad_token_id: the checkpoint's generation ids (from
            its `config.json` / `generation_config.json`, as `CausalLM.from_pretrained` reads
            them); `None` (end ids: `None` or `()`) takes the tokenizer's own.

    Example:
    >>> tokenizer = PretrainedTokenizer("path/to/Llama-3.2-1B")
    >>> tokenizer.tokenize(["The Time Machine"]).to_list()  # [[128000, 791, 4212, 13257]]
    """

    def __init__(self, directory: str | None = None, start_token_id: int | None = None,
                 end_token_ids=None, pad_token_id: int | None = None, **kwargs):
        super().__init__(**kwargs)
        self._given = {"start_token_id": start_token_id, "end_token_ids": end_token_ids,
                       "pad_token_id": pad_token_id}
        self._files, self._tokenizer = {}, None
        if directory is not None:
            if not isinstance(directory, (str, os.PathLike)) or not os.path.isdir(directory):
                raise ValueError("Received an invalid value for argument `directory`, expected "
                                 f"a checkpoint directory. Received: directory={directory!r}")
            self.load_assets(directory)

    def load_assets(self, dir_path):
        """Read the tokenizer files of `dir_path` and build the tokenizer (also how a `.keras`
        file's assets come back)."""
        from keras_attn.checkpoints import load_tokenizer

        self._files = {}
        for name in TOKENIZER_FILES:
            path = os.path.join(dir_path, name)
            if os.path.isfile(path):
                with open(path, "rb") as file:
                    self._files[name] = file.read()
        self._use(load_tokenizer(str(dir_path)))

    def _use(self, tokenizer) -> None:
        """Compute with `tokenizer` (a `CheckpointTokenizer`) and take its special ids where
        none were given."""
        self._tokenizer = tokenizer
        size = self._tokenizer.vocab_size
        own = self._tokenizer
        given = self._given
        self.start_token_id = (own.bos_token_id if given["start_token_id"] is None
                               else given["start_token_id"])
        if self.start_token_id is not None:
            check_int("start_token_id", self.start_token_id, 0)
        self.end_token_ids = _ids_tuple("end_token_ids", given["end_token_ids"], size) or (
            _ids_tuple("end_token_ids", own.eos_token_id, size))
        self.pad_token_id = (own.pad_token_id if given["pad_token_id"] is None
                             else given["pad_token_id"])
        if self.pad_token_id is not None:
            check_int("pad_token_id", self.pad_token_id, 0)
        self.prefix_ids = tuple(own.prefix_ids)
        self.suffix_ids = tuple(own.suffix_ids)
        self._chat_template = "unread"

    @property
    def chat_template(self):
        """The checkpoint's chat template (`keras_attn.preprocessing.chat.ChatTemplate`, read
        from `chat_template.jinja` or `tokenizer_config.json`), or None when it has none."""
        if getattr(self, "_chat_template", "unread") == "unread":
            from keras_attn.preprocessing.chat import read_chat_template

            self._chat_template = read_chat_template(self._files)
        return self._chat_template

    @classmethod
    def from_tokenizer(cls, tokenizer, start_token_id=None, end_token_ids=None,
                       pad_token_id=None) -> PretrainedTokenizer:
        """A layer around a loaded `CheckpointTokenizer` (`keras_attn.checkpoints.
        load_tokenizer`) without its files: for exports, not for `.keras` files."""
        layer = cls(start_token_id=start_token_id, end_token_ids=end_token_ids,
                    pad_token_id=pad_token_id)
        layer._use(tokenizer)
        return layer

    def resources(self) -> list:
        return [self.tokenizer]

    def save_assets(self, dir_path):
        if not self._files:
            raise ValueError("This PretrainedTokenizer was made from a loaded tokenizer "
                             "without its files (`from_tokenizer`): give `directory` to save it.")
        for name, content in self._files.items():
            with open(os.path.join(dir_path, name), "wb") as file:
                file.write(content)

    @property
    def tokenizer(self):
        """The `CheckpointTokenizer` (TensorFlow ops)."""
        if self._tokenizer is None:
            raise ValueError("This PretrainedTokenizer has no files yet: give `directory`, or "
                             "load the `.keras` file that holds it.")
        return self._tokenizer

    vocabulary_size = property(lambda self: self.tokenizer.vocab_size)

    def _tokenize(self, texts):
        # The preprocessors lay sequences out themselves (as transformers generates).
        return self.tokenizer.encode(texts, add_special_tokens=False, truncate=False, pad=False)

    def _detokenize(self, ids):
        return self.tokenizer.decode(ids)

    def get_config(self):
        config = super().get_config()
        ids = self._given if self._tokenizer is None else {
            "start_token_id": self.start_token_id, "end_token_ids": list(self.end_token_ids),
            "pad_token_id": self.pad_token_id}
        config.update(ids)
        return config
