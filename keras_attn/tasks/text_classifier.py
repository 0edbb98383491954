"""`TextClassifier`: an encoder (BERT) with a classification head as one object — strings in,
class logits out, `fit` on `(strings, labels)`, `.keras` and SavedModel export."""

from __future__ import annotations

import keras
import numpy as np

from keras_attn._checks import as_int, check_new_directory, check_rate
from keras_attn.preprocessing import PretrainedTokenizer, TextClassifierPreprocessor
from keras_attn.tasks.task import Task, is_text

# Texts per call of the preprocessor when in-memory texts are tokenized up front.
TOKENIZE_CHUNK = 4096
# What a backbone takes (`keras_attn.checkpoints.build_model`'s BERT encoder).
INPUT_DTYPES = {"token_ids": "int32", "padding_mask": "bool", "segment_ids": "int32"}


def _backbone_outputs(backbone) -> tuple[list[str], str]:
    """The input names of `backbone` and the output its features come from."""
    inputs = getattr(backbone, "input", None) if isinstance(backbone, keras.Model) else None
    outputs = getattr(backbone, "output", None) if inputs is not None else None
    if not (isinstance(inputs, dict) and {"token_ids", "padding_mask"} <= set(inputs)
            <= set(INPUT_DTYPES) and isinstance(outputs, dict)
            and "sequence_output" in outputs):
        raise ValueError(
            "Argument `backbone` must be an encoder model taking {'token_ids', 'padding_mask'"
            "[, 'segment_ids']} and returning {'sequence_output'[, 'pooled_output']}, as "
            "keras_attn.checkpoints.build_model builds BERT (task 'encoder'). Received: "
            f"backbone={backbone!r}")
    return sorted(inputs), "pooled_output" if "pooled_output" in outputs else "first_token"


def _max_sequence_length(backbone) -> int | None:
    """The positions the backbone's embedding has (None: no bound)."""
    for layer in backbone.layers:
        embedding = getattr(layer, "embedding", None)
        if embedding is not None:
            return getattr(embedding, "max_sequence_length", None)
    return None


def _activation(activation):
    if activation in (None, "linear", keras.activations.linear):
        return None
    if activation in ("softmax", keras.activations.softmax):
        return "softmax"
    raise ValueError(
        "Received an invalid value for argument `activation`, expected None (logits) or "
        f"'softmax' (probabilities). Received: activation={activation!r}")


@keras.saving.register_keras_serializable(package="keras_attn")
class TextClassifier(Task):
    """An encoder with a classification head (keras-hub's `TextClassifier` /
    `BertTextClassifier`): dropout, then a `Dense` of `num_classes` on the backbone's pooled
    output — BERT's pooler (`tanh` of a dense layer on the `[CLS]` position) when the
    checkpoint has one, else the first position's hidden state (`[CLS]`) as it is.

    The model takes `{"token_ids": int32 (B, T), "padding_mask": bool (B, T), "segment_ids":
    int32 (B, T)}` (`segment_ids` when the backbone reads token types) and returns float32
    `(B, num_classes)`: logits, or probabilities with `activation="softmax"`. With a
    preprocessor it trains, evaluates and predicts on raw text: `fit(strings, labels)`,
    `fit((strings, labels))`, `fit(tf.data of (string, label))`, `predict(strings)`.

    Args:
        backbone: the encoder `keras.Model` of `keras_attn.checkpoints.build_model` for a
            BERT spec with task `"encoder"` (outputs `{"sequence_output", "pooled_output"}`;
            without a pooler, `{"sequence_output"}`).
        num_classes: int >= 2, the classes (labels are ids in `[0, num_classes)`).
        preprocessor: optional `keras_attn.preprocessing.TextClassifierPreprocessor`.
            Defaults to `None` (the model takes token ids only).
        activation: None (logits, keras-hub's default) or `"softmax"` (probabilities; the
            default loss then reads probabilities). Defaults to `None`.
        dropout: float in [0, 1), on the pooled features while training. Defaults to `0.1`.
        compile: bool, compile with the task's defaults (`compile()`) when made, as
            keras-hub's tasks are. Defaults to `True`.

    Attributes:
        pooling: `"pooled_output"` (BERT's pooler) or `"first_token"` (the first position's
            hidden state): what the head reads.

    Example:
    >>> classifier = TextClassifier.from_pretrained("path/to/bert", num_classes=2)
    >>> classifier.fit(["great movie", "boring"], [1, 0], epochs=3)
    >>> classifier.predict(["What a film!"])  # float32 (1, 2) logits
    """

    def __init__(self, backbone, num_classes: int, preprocessor=None, activation=None,
                 dropout: float = 0.1, compile: bool = True, **kwargs):
        names, pooling = _backbone_outputs(backbone)
        num_classes = as_int("num_classes", num_classes, 2)
        if preprocessor is not None and not isinstance(preprocessor,
                                                       TextClassifierPreprocessor):
            raise ValueError(
                "Argument `preprocessor` must be a TextClassifierPreprocessor or None. "
                f"Received: preprocessor={preprocessor!r}")
        activation = _activation(activation)
        check_rate("dropout", dropout)
        positions = _max_sequence_length(backbone)
        if preprocessor is not None and positions and preprocessor.sequence_length > positions:
            raise ValueError(
                "Argument `sequence_length` (the preprocessor's) must be at most the "
                f"backbone's {positions} positions. Received: "
                f"sequence_length={preprocessor.sequence_length}")
        inputs = {name: keras.Input((None,), dtype=INPUT_DTYPES[name], name=name)
                  for name in names}
        outputs = backbone(inputs)
        features = (outputs["pooled_output"] if pooling == "pooled_output"
                    else outputs["sequence_output"][:, 0, :])  # (B, D)
        output_dropout = keras.layers.Dropout(dropout, name="classifier_dropout",
                                              dtype=backbone.dtype_policy)
        output_dense = keras.layers.Dense(
            num_classes, activation=activation, name="logits", dtype=backbone.dtype_policy,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=0.02))
        scores = keras.ops.cast(output_dense(output_dropout(features)), "float32")  # (B, C)
        kwargs.setdefault("name", "text_classifier")
        super().__init__(inputs, scores, **kwargs)
        self.backbone, self.preprocessor = backbone, preprocessor
        self.output_dropout, self.output_dense = output_dropout, output_dense
        self.num_classes, self.activation, self.dropout = num_classes, activation, dropout
        self.pooling = pooling
        self._compile_by_default(compile)

    @classmethod
    def from_pretrained(cls, directory: str, num_classes: int, dtype: str | None = None,
                        sequence_length: int = 128, activation=None, dropout: float = 0.1,
                        **kernel) -> TextClassifier:
        """A Hugging Face BERT directory (`BertModel` or `BertForMaskedLM`: `config.json`,
        safetensors, `tokenizer.json` or `vocab.txt`) as a `TextClassifier` with a new head.

        A `BertModel` checkpoint's head reads its pooler; a `BertForMaskedLM` one has no
        pooler (its MLM head is left out): the head reads the `[CLS]` hidden state.

        Args:
            directory: str, the checkpoint directory.
            num_classes: int >= 2, the classes.
            dtype: optional `"float32"`, `"bfloat16"` or `"float16"`. Defaults to the stored
                weights'.
            sequence_length: int, ids per text, the template included; at most the
                checkpoint's positions (`max_position_embeddings`). Defaults to `128`.
            activation: None (logits) or `"softmax"`. Defaults to `None`.
            dropout: float, the head's dropout. Defaults to `0.1`.
            **kernel: attention kernel options (`implementation`, `chunk_size`,
                `flash_attention`; `keras_attn.checkpoints.build_model`).

        Returns:
            `TextClassifier` with a `TextClassifierPreprocessor` of the checkpoint's tokenizer.

        Example:
        >>> classifier = TextClassifier.from_pretrained("path/to/bert", num_classes=3)
        """
        from keras_attn.checkpoints import build_model, load_hf_checkpoint

        if not isinstance(directory, str):
            raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
                "Argument `directory` must be the path of a checkpoint directory. "
                f"Received: directory={directory!r}")
        as_int("num_classes", num_classes, 2)
        as_int("sequence_length", sequence_length, 3)
        _activation(activation)
        check_rate("dropout", dropout)
        spec, weights = load_hf_checkpoint(directory, dtype)
        if spec.architecture != "bert":
            raise ValueError(
                f"Argument `directory` must hold a BERT checkpoint for a TextClassifier; "
                f"{directory!r} holds a {spec.source} ({spec.task!r}). Causal language "
                "models: keras_attn.tasks.CausalLM.from_pretrained.")
        if spec.task == "masked_lm":  # the encoder alone: no pooler, the MLM head left out
            spec = spec.replace(task="encoder", pooler=False)
            weights = {k: v for k, v in weights.items() if not k.startswith("mlm_head/")}
        backbone = build_model(spec, weights, dtype=dtype, **kernel)
        preprocessor = TextClassifierPreprocessor(PretrainedTokenizer(directory),
                                                  sequence_length)
        return cls(backbone, num_classes, preprocessor, activation=activation, dropout=dropout)

    def compile(self, optimizer="auto", loss="auto", *, metrics="auto", **kwargs):
        """`keras.Model.compile` with keras-hub's `TextClassifier` defaults: Adam (learning
        rate 5e-5), sparse categorical cross-entropy (from logits unless `activation` is
        softmax) and sparse categorical accuracy (named `"accuracy"`)."""
        if optimizer == "auto":
            optimizer = keras.optimizers.Adam(5e-5)
        if loss == "auto":
            loss = keras.losses.SparseCategoricalCrossentropy(
                from_logits=self.activation is None)
        if metrics == "auto":
            metrics = [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
        super().compile(optimizer=optimizer, loss=loss, metrics=metrics, **kwargs)

    # ---- text in ---------------------------------------------------------------------------

    def _split(self, x, y):
        """`(x, y)` with `x=(texts, labels)` unpacked; anything that is neither text nor
        preprocessed inputs refused, naming `x`."""
        import tensorflow as tf

        if isinstance(x, np.ndarray) and x.dtype == object and x.size and all(
                isinstance(t, (str, bytes)) for t in x.ravel()):
            x = x.astype(str)  # e.g. a pandas column
        if (y is None and isinstance(x, tuple) and len(x) == 2 and is_text(x[0])
                and not isinstance(x[0], (str, bytes))):
            x, y = x
        if is_text(x) or isinstance(x, dict) or (
                isinstance(x, tf.data.Dataset) and _dataset_of_dicts(x)):
            return x, y
        raise ValueError(
            "Argument `x` must be texts (a list or array of str, a string tensor, a tf.data "
            "dataset of strings or of (string, label) pairs) or the preprocessed inputs "
            "{'token_ids', 'padding_mask', 'segment_ids'}. Received: "
            f"x={_short(x)}")

    def _preprocess(self, x, y, batch_size, method: str):
        """In-memory texts tokenized once, up front, into NumPy arrays that Keras batches
        and shuffles itself (`shuffle`, `validation_split`, `sample_weight` as usual); a
        tf.data dataset of texts is preprocessed batch by batch (`_text_dataset`)."""
        x, y = self._split(x, y)
        if self.preprocessor is None or not is_text(x) or _is_dataset(x):
            return super()._preprocess(x, y, batch_size, method)
        texts = [x] if isinstance(x, (str, bytes)) else x
        inputs = self._tokenize(texts)
        labels = None if y is None else self._check_labels(y, len(inputs["token_ids"]))
        return inputs, labels, batch_size

    def fit(self, x=None, y=None, batch_size=None, validation_data=None, **kwargs):
        """`keras.Model.fit`; raw text goes through the preprocessor: `fit(strings,
        labels)`, `fit((strings, labels))` (tokenized once, then batched and shuffled by
        Keras), or a tf.data dataset of `(string, label)` (batched by `batch_size`, 32 by
        default, when its elements are single examples); `validation_data` likewise."""
        if validation_data is not None:
            pair = validation_data
            if not (isinstance(pair, tuple) and 2 <= len(pair) <= 3):
                pair = (pair,)
            x_val, y_val, _ = self._preprocess(pair[0], pair[1] if len(pair) > 1 else None,
                                               None, "fit")
            validation_data = x_val if y_val is None else (x_val, y_val, *pair[2:])
        if _is_dataset(x):  # its own order (Keras warns that it ignores `shuffle`)
            kwargs.setdefault("shuffle", False)
        return super().fit(x, y, batch_size=batch_size, validation_data=validation_data,
                           **kwargs)

    def _tokenize(self, texts) -> dict:
        """The preprocessor's arrays of in-memory `texts`, in chunks (bounded memory)."""
        texts = texts if _is_tf_tensor(texts) else np.asarray(texts)
        count = int(texts.shape[0])
        chunks = [self.preprocessor(texts[i:i + TOKENIZE_CHUNK])
                  for i in range(0, max(count, 1), TOKENIZE_CHUNK)]
        return {name: np.concatenate([chunk[name].numpy() for chunk in chunks])
                for name in chunks[0]}

    def _text_dataset(self, x, y, batch_size):
        import tensorflow as tf

        if y is not None:
            raise ValueError("Argument `y` must be None when `x` is a tf.data dataset (its "
                             f"elements hold the labels). Received: y={_short(y)}")
        spec = x.element_spec
        first = spec[0] if isinstance(spec, tuple) else spec
        if first.shape.rank == 0:  # one example per element
            x = x.batch(batch_size)
        if isinstance(spec, tuple) and len(spec) > 1:
            x = x.map(self._checked_labels)
        return x.map(self.preprocessor, num_parallel_calls=tf.data.AUTOTUNE).prefetch(2)

    def _check_labels(self, y, count: int) -> np.ndarray:
        """In-memory labels as int32 `(count,)`, every one a class id."""
        labels = np.asarray(keras.ops.convert_to_numpy(y) if not isinstance(
            y, (list, tuple)) else y)
        if labels.dtype.kind not in "iu" or labels.shape != (count,):
            raise ValueError(
                f"Argument `y` must be integer class ids, one per text: shape ({count},). "
                f"Received: y with dtype {labels.dtype} and shape {labels.shape}")
        bad = (labels < 0) | (labels >= self.num_classes)
        if bad.any():
            raise ValueError(
                f"Argument `y` must hold class ids in [0, {self.num_classes}) (num_classes="
                f"{self.num_classes}). Received: y[{int(np.argmax(bad))}]="
                f"{labels[np.argmax(bad)]}")
        return labels.astype("int32")

    def _checked_labels(self, texts, labels, *rest):
        """A dataset's labels, checked inside the pipeline (their values come one batch at a
        time): the iteration fails naming `y` at a label outside `[0, num_classes)`."""
        import tensorflow as tf

        if not labels.dtype.is_integer:
            raise ValueError("The dataset's labels (`y`) must be integer class ids. Received: "
                             f"dtype {labels.dtype.name}")
        message = f"`y` must hold class ids in [0, {self.num_classes})"
        with tf.control_dependencies([
                tf.debugging.assert_non_negative(labels, message=message),
                tf.debugging.assert_less(labels, tf.cast(self.num_classes, labels.dtype),
                                         message=message)]):
            labels = tf.identity(labels)
        return (texts, labels, *rest)

    # ---- export ----------------------------------------------------------------------------

    def export(self, filepath: str, verbose: bool = False) -> str:
        """Write a SavedModel whose `classify` signature takes strings: `text` tf.string
        `[None]` -> `logits` float32 `[None, num_classes]` (probabilities with
        `activation="softmax"`) and `label` int32 `[None]` (the class with the highest
        score), the tokenizer inside the graph. A consumer needs TensorFlow, and
        tensorflow-text's ops registered (`import tensorflow_text`) for a checkpoint's
        tokenizer; neither Keras nor keras_attn. TensorFlow backend only.

        Args:
            filepath: str, the SavedModel directory to write: a new or empty directory
                (nothing already there is replaced).
            verbose: bool, print Keras' export summary. Defaults to `False`.

        Returns:
            `filepath`.

        Example:
        >>> classifier.export("runs/classifier/saved_model")
        >>> served = tf.saved_model.load("runs/classifier/saved_model")
        >>> served.signatures["classify"](text=tf.constant(["Bonjour !"]))["label"]
        """
        import tensorflow as tf

        filepath = check_new_directory("filepath", filepath)
        if self.preprocessor is None:
            raise ValueError("TextClassifier.export writes a signature that takes strings: it "
                             "needs the preprocessor (build the classifier with one, e.g. "
                             "from_pretrained); keras.Model.export writes the ids signature.")
        if keras.backend.backend() != "tensorflow":
            raise ValueError("TextClassifier.export needs the TensorFlow backend (the "
                             f"SavedModel's graph). Received: backend={keras.backend.backend()}"
                             "; save a .keras file here and export it under TensorFlow.")
        self.preprocessor(["warm-up"])  # builds lookup tables created on first use

        def classify(text):
            scores = tf.cast(self(self.preprocessor(text), training=False), tf.float32)
            return {"logits": scores,
                    "label": tf.argmax(scores, axis=-1, output_type=tf.int32)}

        archive = keras.export.ExportArchive()
        archive.track(self)
        for resource in self.preprocessor.tokenizer.resources():
            archive.track(resource)
        archive.add_endpoint(name="classify", fn=classify, input_signature=[
            tf.TensorSpec([None], tf.string, name="text")])
        archive.write_out(filepath, verbose=verbose)
        return filepath

    def get_config(self):
        config = super().get_config()
        config.update({"num_classes": self.num_classes, "activation": self.activation,
                       "dropout": self.dropout})
        return config


def _is_tf_tensor(x) -> bool:
    return type(x).__module__.startswith("tensorflow") and hasattr(x, "dtype")


def _is_dataset(x) -> bool:
    return type(x).__module__.startswith("tensorflow") and hasattr(x, "element_spec")


def _dataset_of_dicts(dataset) -> bool:
    spec = dataset.element_spec
    return isinstance(spec[0] if isinstance(spec, tuple) else spec, dict)


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 120 else text[:117] + "..."
