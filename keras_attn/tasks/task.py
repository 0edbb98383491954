"""What every task model shares (keras-hub's `Task`): a `keras.Model` that owns its backbone
and an optional preprocessor, trains with `fit` on raw text through the preprocessor, and saves
to `.keras` with both (the tokenizer's files in the archive's assets)."""

from __future__ import annotations

import keras
import numpy as np

from keras_attn._checks import check_int

# Rows per batch when `fit` / `evaluate` / `predict` are given a list of strings.
DEFAULT_BATCH_SIZE = 32


def is_text(x) -> bool:
    """Whether `x` is raw text: a str, a list/tuple/array of str, a string tensor, or a
    `tf.data.Dataset` whose elements (or first element) are strings."""
    if isinstance(x, (str, bytes)):
        return True
    if isinstance(x, (list, tuple)) and x and all(isinstance(t, (str, bytes)) for t in x):
        return True
    if isinstance(x, np.ndarray) and x.dtype.kind in "US":
        return True
    if type(x).__module__.startswith("tensorflow"):
        import tensorflow as tf

        if isinstance(x, tf.data.Dataset):
            spec = x.element_spec
            first = spec[0] if isinstance(spec, tuple) else spec
            return isinstance(first, tf.TensorSpec) and first.dtype == tf.string
        return tf.is_tensor(x) and x.dtype == tf.string
    return False


class Task(keras.Model):
    """A backbone, an optional preprocessor, and `fit` / `evaluate` / `predict` on text.

    Subclasses build the functional graph in `__init__` (then call `Task.__init__` with
    `inputs` and `outputs`), set `backbone` and `preprocessor`, and implement
    `_text_dataset(x, y, batch_size)`: a `tf.data.Dataset` of preprocessed batches for raw text.
    """

    def _compile_by_default(self, compile: bool) -> None:
        """keras-hub's default: a task is compiled with its own defaults when it is made
        (`compile=False` leaves it uncompiled); `compile(...)` again changes them."""
        if not isinstance(compile, bool):
            raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
                f"Argument `compile` must be a bool. Received: compile={compile!r}")
        if compile:
            self.compile()

    def _check_exportable(self) -> None:
        """An export writes a TensorFlow SavedModel that takes strings: it needs the
        TensorFlow backend and a preprocessor (a ValueError says which is missing)."""
        name = type(self).__name__
        if keras.backend.backend() != "tensorflow":
            raise ValueError(f"{name}.export writes a TensorFlow SavedModel: run it with "
                             "KERAS_BACKEND=tensorflow (save a .keras file on "
                             f"{keras.backend.backend()} and load it there).")
        if self.preprocessor is None:
            raise ValueError(f"{name}.export takes strings: the model needs a preprocessor.")

    def _steps_max_length(self, max_length, format: str, default: str, minimum: int) -> int:
        """The `max_length` of an ONNX or LiteRT export: as given (checked, at least
        `minimum`), else the preprocessor's attribute `default`."""
        if max_length is None:
            if self.preprocessor is None:
                raise ValueError(f"Argument `max_length` is required to export to "
                                 f"format={format!r} without a preprocessor.")
            max_length = getattr(self.preprocessor, default)
        check_int("max_length", max_length, minimum)
        return int(max_length)

    def _text_dataset(self, x, y, batch_size):  # pragma: no cover - every task has one
        raise NotImplementedError

    def _preprocess(self, x, y, batch_size, method: str):
        """`(x, y, batch_size)` for Keras: raw text through the preprocessor (a tf.data
        pipeline of batches), anything else as given."""
        if not is_text(x):
            return x, y, batch_size
        if self.preprocessor is None:
            raise ValueError(
                f"`{method}` was given raw text, but this {type(self).__name__} has no "
                "preprocessor: give token ids, or build it with one (e.g. from_pretrained).")
        size = DEFAULT_BATCH_SIZE if batch_size is None else batch_size
        return self._text_dataset(x, y, size), None, None

    def fit(self, x=None, y=None, batch_size=None, validation_data=None, **kwargs):
        """`keras.Model.fit`; raw text goes through the preprocessor (in batches of
        `batch_size`, 32 by default), `validation_data` too."""
        check_not_empty(x)
        x, y, batch_size = self._preprocess(x, y, batch_size, "fit")
        if validation_data is not None:
            pair = validation_data if isinstance(validation_data, tuple) else (
                validation_data, None)
            if is_text(pair[0]):
                validation_data = self._preprocess(pair[0], pair[1] if len(pair) > 1 else None,
                                                   None, "fit")[0]
        return super().fit(x, y, batch_size=batch_size, validation_data=validation_data,
                           **kwargs)

    def evaluate(self, x=None, y=None, batch_size=None, **kwargs):
        """`keras.Model.evaluate`; raw text goes through the preprocessor."""
        check_not_empty(x)
        x, y, batch_size = self._preprocess(x, y, batch_size, "evaluate")
        return super().evaluate(x, y, batch_size=batch_size, **kwargs)

    def predict(self, x, batch_size=None, **kwargs):
        """`keras.Model.predict`; raw text goes through the preprocessor."""
        x, _, batch_size = self._preprocess(x, None, batch_size, "predict")
        return super().predict(x, batch_size=batch_size, **kwargs)

    def compile_from_config(self, config):
        """Compile a loaded model as it was saved (Keras skips models whose `compile` is
        their own), so that training continues with the same optimizer and loss."""
        self.compile(**keras.saving.deserialize_keras_object(config))
        if self.built:
            self.optimizer.build(self.trainable_variables)

    def get_config(self):
        return {
            "backbone": keras.layers.serialize(self.backbone),
            "preprocessor": (None if self.preprocessor is None
                             else keras.layers.serialize(self.preprocessor)),
            "name": self.name,
        }

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for part in ("backbone", "preprocessor"):
            if isinstance(config.get(part), dict):
                config[part] = keras.layers.deserialize(config[part])
        return cls(**config)


def check_not_empty(x) -> None:
    """A ValueError naming `x` for an empty list, tuple or array of examples (Keras would fail
    deep inside its data adapters)."""
    if isinstance(x, (list, tuple, np.ndarray)) and len(x) == 0:
        raise ValueError("Argument `x` holds no examples: give at least one text (or row of "
                         f"token ids). Received: x={x!r:.100}")
