"""`Seq2SeqLM`: a translator as one object — strings in, strings out, `fit` on pairs of
strings, the search set once or per call, `.keras` and SavedModel export. Autoregressive
(`transformer_seq2seq`, `bahdanau_seq2seq`: a sampler, greedy or beam search) and
non-autoregressive (`nat_seq2seq`: Mask-Predict) backbones."""

from __future__ import annotations

import keras
import numpy as np

from keras_attn._checks import check_int
from keras_attn.preprocessing.seq2seq_lm import Seq2SeqLMPreprocessor
from keras_attn.tasks.task import DEFAULT_BATCH_SIZE, Task, is_text
from keras_attn.tokens import PAD_ID


def _backbone(backbone) -> tuple[keras.Model, bool]:
    """`backbone` and whether it is non-autoregressive; anything but a two-input functional
    seq2seq model of keras_attn's builders is a ValueError naming it."""
    names = {layer.name for layer in getattr(backbone, "layers", [])}
    if not isinstance(backbone, keras.Model) or len(backbone.inputs or []) != 2 or not (
            {"encoder", "decoder"} <= names):
        raise ValueError(
            "Argument `backbone` must be a sequence-to-sequence model of "
            "keras_attn.models (transformer_seq2seq, bahdanau_seq2seq or nat_seq2seq: inputs "
            "(source_ids, target ids), layers 'encoder' and 'decoder'). "
            f"Received: backbone={backbone!r:.200}")
    return backbone, "length_predictor" in names


def _is_pairs(x) -> bool:
    """Whether `x` is a non-empty list of `(source, target)` strings."""
    return isinstance(x, (list, tuple)) and bool(x) and all(
        isinstance(p, (tuple, list)) and len(p) == 2
        and all(isinstance(s, str) for s in p) for p in x)


def _text_pairs(x, y):
    """`(sources, targets)` as two flat lists of str from `x=[(source, target), ...]` or
    `x=sources, y=targets`."""
    if y is None:  # pairs (`_is_pairs`)
        return [p[0] for p in x], [p[1] for p in x]
    sources = [x] if isinstance(x, str) else list(x)
    targets = [y] if isinstance(y, str) else list(y)
    if len(sources) != len(targets):
        raise ValueError("Arguments `x` and `y` must hold one target per source. Received: "
                         f"{len(sources)} sources, {len(targets)} targets")
    return sources, targets


@keras.saving.register_keras_serializable(package="keras_attn")
class Seq2SeqLM(Task):
    """A translator with its preprocessor and search (keras-hub's `Seq2SeqLM`).

    The model takes `(source_ids (B, S), target ids (B, T))` int32 and returns the backbone's
    outputs: float32 logits `(B, T, target_vocabulary_size)` (autoregressive), or token and
    length logits (`nat_seq2seq`). `generate` / `translate` decode with
    `keras_attn.decoding.generate` (the sampler: greedy, beam, sampling) or
    `keras_attn.decoding.mask_predict` (non-autoregressive); with a preprocessor they take and
    return strings and `fit` trains on pairs of strings.

    Args:
        backbone: a model of `keras_attn.models.transformer_seq2seq`, `bahdanau_seq2seq` or
            `nat_seq2seq`.
        preprocessor: optional `keras_attn.preprocessing.Seq2SeqLMPreprocessor` (the two
            vocabularies, the text normalization). Defaults to `None` (ids in and out).
        sampler: how an autoregressive model chooses tokens: a name (`"greedy"`,
            `"beam"`, ...), a config or a sampler of `keras_attn.decoding.samplers`;
            `compile(sampler=...)` and `generate(..., sampler=...)` replace it. A
            non-autoregressive model takes none. Defaults to `"greedy"`.
        iterations: int, Mask-Predict rounds of a non-autoregressive model. Defaults to `10`.
        compile: bool, compile with the task's defaults (`compile()`) when made, as
            keras-hub's tasks are. Defaults to `True`.

    Example:
    >>> data = load_dates_translation()
    >>> translator = Seq2SeqLM(transformer_seq2seq(data.source_vocab_size,
    ...                                            data.target_vocab_size),
    ...                        Seq2SeqLMPreprocessor.from_data(data))
    >>> translator.compile(sampler=Beam(4))
    >>> translator.fit(data.train, epochs=10)   # (source, target) strings
    >>> translator.translate(["march 3rd, 2021"])   # ['2021-03-03']
    """

    def __init__(self, backbone, preprocessor: Seq2SeqLMPreprocessor | None = None,
                 sampler="greedy", iterations: int = 10, compile: bool = True,
                 **kwargs):
        backbone, non_autoregressive = _backbone(backbone)
        if preprocessor is not None and not isinstance(preprocessor, Seq2SeqLMPreprocessor):
            raise ValueError(
                "Argument `preprocessor` must be a Seq2SeqLMPreprocessor or None. Received: "
                f"preprocessor={preprocessor!r:.200}")
        check_int("iterations", iterations, 1)
        if non_autoregressive and sampler not in ("greedy", None):
            raise ValueError(
                "A non-autoregressive (nat_seq2seq) Seq2SeqLM decodes with Mask-Predict, not "
                f"a sampler: give `iterations`. Received: sampler={sampler!r}")
        inputs = [keras.Input((None,), dtype="int32", name="source_ids"),
                  keras.Input((None,), dtype="int32", name="target_ids")]
        kwargs.setdefault("name", "seq2seq_lm")
        super().__init__(inputs, backbone(inputs), **kwargs)
        self.backbone, self.preprocessor = backbone, preprocessor
        self.non_autoregressive, self.iterations = non_autoregressive, int(iterations)
        self.sampler = None if non_autoregressive else _samplers().get(sampler or "greedy")
        self._compile_by_default(compile)

    def compile(self, optimizer="auto", loss="auto", *, sampler=None, **kwargs):
        """`keras.Model.compile` with defaults (`"auto"`): Adam (1e-3) and the masked sequence
        loss with masked accuracy (autoregressive), or Mask-Predict's losses (`compile_cmlm`'s);
        `sampler` sets how `generate` chooses tokens."""
        if optimizer == "auto":
            optimizer = keras.optimizers.Adam(1e-3)
        if sampler is not None:
            if self.non_autoregressive:
                raise ValueError("A non-autoregressive Seq2SeqLM takes no sampler (it decodes "
                                 f"with Mask-Predict). Received: sampler={sampler!r}")
            self.sampler = _samplers().get(sampler)
        if self.non_autoregressive and loss == "auto":
            from keras_attn.models.nat import cmlm_losses

            return super().compile(optimizer=optimizer, **{**cmlm_losses(), **kwargs})
        if loss == "auto":
            from keras_attn.metrics import MaskedAccuracy, MaskedSequenceLoss

            loss = MaskedSequenceLoss()
            kwargs.setdefault("metrics", [MaskedAccuracy()])
        return super().compile(optimizer=optimizer, loss=loss, **kwargs)

    def _preprocess(self, x, y, batch_size, method: str, shuffle: bool = False):
        """Pairs of strings (`x=[(source, target), ...]` or `x=sources, y=targets`) through
        the preprocessor; anything else (ids, datasets of ids) as given."""
        pairs = _is_pairs(x)
        if not pairs and not is_text(x):
            return super()._preprocess(x, y, batch_size, method)
        if not pairs and not is_text(y):
            raise ValueError(f"`{method}` on text needs the targets: give (source, target) "
                             f"pairs or `x=sources, y=targets`. Received: y={y!r:.100}")
        if self.preprocessor is None:
            raise ValueError(f"`{method}` was given text, but this Seq2SeqLM has no "
                             "preprocessor: give ids, or build it with one.")
        size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        return self._text_dataset(x, y, size, shuffle), None, None

    def fit(self, x=None, y=None, batch_size=None, validation_data=None, **kwargs):
        """`keras.Model.fit`; pairs of strings go through the preprocessor (in batches of
        `batch_size`, 32 by default), `validation_data` too."""
        if _is_pairs(validation_data) or (
                isinstance(validation_data, tuple) and len(validation_data) == 2
                and is_text(validation_data[0])):
            given = (validation_data, None) if _is_pairs(validation_data) else validation_data
            validation_data = self._preprocess(*given, batch_size, "fit")[0]
        if _is_pairs(x) or is_text(x):  # shuffled every epoch, as Keras shuffles arrays
            x, y, batch_size = self._preprocess(x, y, batch_size, "fit",
                                                shuffle=kwargs.get("shuffle", True))
            kwargs["shuffle"] = False  # done in the dataset (Keras cannot shuffle one)
        return super().fit(x, y, batch_size=batch_size, validation_data=validation_data,
                           **kwargs)

    def _text_dataset(self, x, y, batch_size, shuffle: bool = False):
        import tensorflow as tf

        sources, targets = _text_pairs(x, y)
        (source, target_in), target_out = self.preprocessor(sources, targets)
        if not self.non_autoregressive:
            dataset = tf.data.Dataset.from_tensor_slices(((source, target_in), target_out))
            if shuffle:
                dataset = dataset.shuffle(len(sources), reshuffle_each_iteration=True)
            return dataset.batch(batch_size).prefetch(2)
        from keras_attn.data.nat import cmlm_example
        from keras_attn.tokens import EOS_ID, PAD_ID, mask_id

        target = tf.where(target_out == EOS_ID, PAD_ID, target_out)  # y, no <eos>
        token_mask_id = mask_id(self.preprocessor.target_vocabulary_size)
        seeds = tf.data.Dataset.random(seed=0, rerandomize_each_iteration=True).batch(2)

        def example(pair, seed):
            return cmlm_example(*pair, seed, token_mask_id)

        pairs = tf.data.Dataset.from_tensor_slices((source, target))
        if shuffle:
            pairs = pairs.shuffle(len(sources), reshuffle_each_iteration=True)
        dataset = tf.data.Dataset.zip((pairs, seeds))
        return dataset.map(example).batch(batch_size).prefetch(2)

    # ---- generation ----------------------------------------------------------------------------

    def generate(self, inputs, max_length: int | None = None, *, sampler=None,
                 iterations: int | None = None):
        """Translate sources: strings for strings, target ids for source ids.

        Args:
            inputs: a str or a list of str (needs the preprocessor), or int source ids
                `(B, S)`, 0-padded.
            max_length: int, the target positions (`decoding.generate`'s meaning). Defaults to
                the preprocessor's target length (source ids without one: required).
            sampler: optional sampler for this call (autoregressive models). Defaults to the
                model's.
            iterations: optional int, Mask-Predict rounds for this call (non-autoregressive
                models). Defaults to the model's.

        Returns:
            A str for a str, a list of str for a list; for ids, int32 `(B, max_length)`.
        """
        from keras_attn import decoding

        if self.non_autoregressive and sampler is not None:
            raise ValueError("A non-autoregressive Seq2SeqLM takes `iterations`, not a "
                             f"sampler. Received: sampler={sampler!r}")
        if not self.non_autoregressive and iterations is not None:
            raise ValueError("`iterations` (Mask-Predict rounds) applies to a "
                             f"non-autoregressive Seq2SeqLM. Received: iterations={iterations!r}")
        text = is_text(inputs)
        if text and self.preprocessor is None:
            raise ValueError("`generate` was given text, but this Seq2SeqLM has no "
                             "preprocessor: give source ids, or build it with one.")
        if max_length is None:
            if self.preprocessor is None:
                raise ValueError("Argument `max_length` is required without a preprocessor.")
            max_length = self.preprocessor.target_length
        check_int("max_length", max_length, 1)
        single = isinstance(inputs, (str, bytes))
        ids = self.preprocessor.encode_source(inputs).numpy() if text else inputs
        if self.non_autoregressive:
            iterations = self.iterations if iterations is None else iterations
            check_int("iterations", iterations, 1)
            tokens, _ = decoding.mask_predict(self.backbone, ids, max_length=int(max_length),
                                              iterations=int(iterations))
        else:
            sampler = self.sampler if sampler is None else _samplers().get(sampler)
            tokens = decoding.generate(self.backbone, ids, int(max_length), sampler=sampler)
        if not text:
            return tokens
        texts = self.preprocessor.decode(tokens)
        # A source with no token (empty, whitespace only) translates to "", as the exported
        # `translate` answers it: an all-padding source holds nothing to translate.
        empty = ~np.any(np.asarray(ids) != PAD_ID, axis=1)  # (B,)
        texts = ["" if blank else t for blank, t in zip(empty, texts)]
        return texts[0] if single else texts

    def translate(self, texts, max_length: int | None = None, **options):
        """`generate` on strings: a str gives a str, a list of str a list."""
        if not is_text(texts):
            raise ValueError("Argument `texts` must be a string or a list of strings. "
                             f"Received: texts={texts!r:.200}")
        return self.generate(texts, max_length, **options)

    def export(self, path: str, beam_size: int | None = None, length_penalty: float | None = None,
               length_beam: int = 1, format: str = "tf_saved_model",
               max_length: int | None = None) -> str:
        """Write a SavedModel whose `translate` signature takes strings and returns
        `translation`, `score` and `truncated` (`keras_attn.export.export_translator` /
        `export_nat_translator`): normalization, vocabularies, encoder, the search and
        detokenization in the graph, served by TensorFlow alone (+ tensorflow-text's op for
        SentencePiece vocabularies). An autoregressive model also gets
        `translate_with_settings` (`text`, `beam_size`: 1 for greedy or `beam_size`): the
        search is a request setting. TensorFlow backend only.

        Args:
            path: str, a new or empty directory.
            beam_size: optional int, the export's beam width. Defaults to the sampler's
                (`Beam(k)`: k; greedy: 1).
            length_penalty: optional float, GNMT's alpha of the scores. Defaults to the
                sampler's (`Beam`), else 0.6.
            length_beam: int, candidate lengths of a non-autoregressive model. Defaults to 1.
            format: `"tf_saved_model"` (the above) or `"onnx"`: source and target ids, the
                loop outside the graph: `encoder` (the decoding state of the source ids) and
                `decode_step` (one target token through the static cache) with an
                `export.json` (`keras_attn.export_decoding`);
                `keras_attn.export_steps.greedy(path, source_ids)` translates with them as
                `generate` does greedily (NumPy and onnxruntime only). Autoregressive models.
                Defaults to `"tf_saved_model"`.
            max_length: optional int (ONNX), the output positions. Defaults to the
                preprocessor's target length (required without a preprocessor).
        """
        from keras_attn.export_decoding import check_format

        check_format("Seq2SeqLM", format, ("tf_saved_model", "onnx"))
        if format != "tf_saved_model":
            return self._export_steps(path, format, max_length, beam_size, length_penalty)
        self._check_exportable()
        from keras_attn import export

        pre = self.preprocessor
        text = {"standardize": pre.standardize, "joiner": pre.joiner,
                "word_start": pre.word_start}
        if self.non_autoregressive:
            if beam_size is not None or length_penalty is not None:
                raise ValueError("A non-autoregressive Seq2SeqLM exports Mask-Predict: "
                                 "`beam_size` and `length_penalty` do not apply.")
            return export.export_nat_translator(
                self.backbone, pre.source_vectorizer, pre.target_vectorizer, path,
                max_length=pre.target_length, iterations=self.iterations,
                length_beam=length_beam, **text)
        if length_beam != 1:
            raise ValueError("`length_beam` applies to a non-autoregressive Seq2SeqLM. "
                             f"Received: length_beam={length_beam!r}")
        config = self.sampler.get_config()
        if beam_size is None:
            beam_size = config.get("num_beams", 1)
        if length_penalty is None:
            length_penalty = config.get("length_penalty", 0.6)
        return export.export_translator(
            self.backbone, pre.source_vectorizer, pre.target_vectorizer, path,
            max_length=pre.target_length, beam_size=beam_size,
            length_penalty=length_penalty, **text)

    def _export_steps(self, path, format, max_length, beam_size, length_penalty) -> str:
        """`export(path, format="onnx")`: the encoder and the decode step
        (`keras_attn.export_decoding.export_seq2seq`)."""
        from keras_attn.decoding import special_ids
        from keras_attn.export_decoding import export_seq2seq

        if self.non_autoregressive:
            raise ValueError("A non-autoregressive Seq2SeqLM decodes with Mask-Predict, which "
                             f"has no one-token decode step: export it with "
                             f"format='tf_saved_model'. Received: format={format!r}")
        for name, value in (("beam_size", beam_size), ("length_penalty", length_penalty)):
            if value is not None:
                raise ValueError(f"Argument `{name}` applies to the SavedModel's search; the "
                                 f"format={format!r} export is searched outside the graph. "
                                 f"Received: {name}={value!r}")
        max_length = self._steps_max_length(max_length, format, "target_length", 1)
        return export_seq2seq(self.backbone, path, format, max_length,
                              special_ids(self.backbone))

    def get_config(self):
        config = super().get_config()
        config["iterations"] = self.iterations
        if not self.non_autoregressive:
            config["sampler"] = _samplers().serialize(self.sampler)
        return config


def _samplers():
    from keras_attn.decoding import samplers

    return samplers

