"""Traced TensorFlow functions kept per static setting, for the eager calls of tokenizers and
preprocessors: one concrete function per key instead of op-by-op execution."""

from __future__ import annotations


class TracedFunctions:
    """`function`s traced once per key: a plain object, so that `tf.Module` tracks (and a
    SavedModel saves) none of them."""

    def __init__(self):
        self.functions = {}

    def get(self, key, function, *signature):
        """`function` traced for the tensors of `signature` (a concrete function: the cheapest
        call), the first time `key` is asked for."""
        import tensorflow as tf

        if key not in self.functions:
            self.functions[key] = tf.function(function, input_signature=signature,
                                              autograph=False).get_concrete_function()
        return self.functions[key]
