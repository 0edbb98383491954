"""One initializer per sublayer, as Keras' own layers draw them.

A Keras initializer object is stateless: handed to several `Dense` layers of the same shape it
gives each the same numbers (query and key projections that start equal). Every composite
layer of keras_attn therefore gives each sublayer its own initializer, made afresh from the
configured one's config:

- an unseeded initializer is cloned, and the clone draws its own seed (from Python's random
  state, so `keras.utils.set_random_seed` makes the whole model reproducible);
- an initializer with an integer seed is cloned with a seed derived from that seed and the
  sublayer's name, so a seeded layer is reproducible and its sublayers still differ; composite
  layers derive again for their own sublayers (a stack per block, a block per attention and
  FFN, an attention layer per projection), so every kernel of a model gets its own seed.
"""

from __future__ import annotations

import zlib

import keras


def sublayer_initializer(initializer, name: str):
    """A fresh initializer for the sublayer `name`, from `initializer`'s config.

    Args:
        initializer: a Keras initializer, its name or its config (anything
            `keras.initializers.get` takes).
        name: the sublayer's name, e.g. `"query_dense"` (distinct among siblings).

    Returns:
        A new initializer object of the same class and configuration; a fixed integer seed is
        replaced by one derived from it and `name`. A plain function (no config) is returned as
        it is.

    Example:
    >>> init = keras.initializers.GlorotUniform(seed=3)
    >>> q = sublayer_initializer(init, "query_dense")
    >>> k = sublayer_initializer(init, "key_dense")   # q((4, 4)) != k((4, 4)), both reproducible
    """
    initializer = keras.initializers.get(initializer)
    if not isinstance(initializer, keras.initializers.Initializer):
        return initializer
    config = initializer.get_config()
    seed = config.get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool):
        config["seed"] = zlib.crc32(f"{seed}/{name}".encode()) % (2**31 - 1)
    return initializer.__class__.from_config(config)
