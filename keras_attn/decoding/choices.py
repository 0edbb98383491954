"""How the next token is chosen from a step's logits: the most likely one, or a sample.

Sampling filters the distribution as is usual (Holtzman et al., 2020): the logits are divided
by `temperature`, then only the `top_k` most likely tokens are kept, then only the smallest set
of most likely tokens whose probability reaches `top_p`; the token is drawn from what remains,
renormalized. Every parameter may be a tensor (so a SavedModel can take it as an input), and the
draw is stateless: the same `seed` gives the same tokens, step after step, on one backend.
"""

from __future__ import annotations

import keras
from keras import ops

# Logits of tokens that may not be chosen: far below any real logit, yet finite.
NEG = -1e9


def filter_logits(logits, temperature=1.0, top_k=0, top_p=1.0):
    """`logits / temperature` with every token outside the top-k and the nucleus at `NEG`.

    Args:
        logits: float32 `(B, V)`.
        temperature: float or scalar tensor > 0.
        top_k: int or scalar int tensor; 0 keeps every token. Tokens tied with the k-th
            largest logit are all kept.
        top_p: float or scalar tensor in (0, 1]; 1 keeps every token. A token is kept when the
            probability of the tokens more likely than it is below `top_p` (so the token that
            crosses `top_p` is kept, and so is the most likely one).

    Returns:
        float32 `(B, V)`.
    """
    logits = logits / ops.cast(temperature, "float32")
    vocab = ops.shape(logits)[-1]
    ascending = ops.sort(logits, axis=-1)  # (B, V)
    top_k = ops.cast(top_k, "int32")
    k = ops.where(ops.logical_and(top_k > 0, top_k < vocab), top_k, vocab)
    kth = _take_column(ascending, vocab - k)  # (B, 1): the k-th largest logit
    logits = ops.where(logits >= kth, logits, NEG)
    # Nucleus: over the probabilities sorted from most likely down.
    probs = ops.softmax(logits, axis=-1)
    descending = ops.flip(ops.sort(probs, axis=-1), axis=-1)  # (B, V)
    before = ops.cumsum(descending, axis=-1) - descending  # mass of the more likely tokens
    kept = ops.sum(ops.cast(before < ops.cast(top_p, "float32"), "int32"), axis=-1)  # (B,)
    kept = ops.maximum(kept, 1)
    smallest = _take_column(descending, kept - 1)  # (B, 1): the least likely kept probability
    return ops.where(probs >= smallest, logits, NEG)


def _take_column(x, column):
    """`x[b, column[b]]` as `(B, 1)`, for `x` `(B, V)` and `column` int `(B,)` or scalar."""
    column = ops.cast(column, "int32")
    column = ops.broadcast_to(ops.reshape(column, (-1, 1)), (ops.shape(x)[0], 1))
    return ops.take_along_axis(x, column, axis=-1)


def uniform(shape, seed, step):
    """Uniform numbers in (0, 1) of `shape`, a function of the integers `seed` and `step`
    (tensors) alone: TensorFlow's and JAX's stateless generators, or a torch generator seeded
    from both (torch runs eagerly)."""
    backend = keras.backend.backend()
    tiny = 1e-7
    if backend == "tensorflow":
        import tensorflow as tf

        pair = tf.stack([tf.cast(seed, tf.int32), tf.cast(step, tf.int32)])
        return tf.random.stateless_uniform(shape, pair, minval=tiny, maxval=1.0)
    if backend == "jax":
        import jax

        key = jax.random.fold_in(jax.random.PRNGKey(ops.cast(seed, "int32")),
                                 ops.cast(step, "int32"))
        return jax.random.uniform(key, shape, minval=tiny, maxval=1.0)
    if backend == "torch":
        import torch

        generator = torch.Generator(device="cpu")
        generator.manual_seed(int(seed) * 1_000_003 + int(step))
        draws = torch.rand(tuple(int(d) for d in shape), generator=generator)
        return ops.convert_to_tensor(tiny + (1.0 - tiny) * draws)
    raise ValueError(f"Sampling is not implemented for the {backend!r} backend.")


def sample(logits, seed, step):
    """One token per row drawn from `softmax(logits)` (Gumbel-max: `argmax(logits + G)`)."""
    gumbel = -ops.log(-ops.log(uniform(ops.shape(logits), seed, step)))
    return ops.cast(ops.argmax(logits + gumbel, axis=-1), "int32")


def greedy(logits):
    """The most likely token of each row."""
    return ops.cast(ops.argmax(logits, axis=-1), "int32")
