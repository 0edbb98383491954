"""The tensor functions behind the samplers (`keras_attn.decoding.samplers`): how a step's
logits are reshaped into the distribution the next token is drawn from, and the draw.

In the usual order (Holtzman et al., 2020; Hugging Face's logits processors): a repetition
penalty on the raw logits, then `logits / temperature`, then the filters (top-k, top-p, min-p),
each leaving the tokens it removes at `NEG`; the token is drawn from what remains, renormalized.
Every parameter may be a scalar tensor (so one compiled program serves every value, and a
SavedModel can take it as an input), and the draw is stateless: the same `seed` gives the same
tokens, step after step, on one backend.
"""

from __future__ import annotations

import keras
from keras import ops

# Logits of tokens that may not be chosen: far below any real logit, yet finite.
NEG = -1e9
# The smallest temperature divided by (a temperature of 0 chooses the most likely token).
COLDEST = 1e-6


def scale(logits, temperature):
    """`logits / temperature` (float32), a temperature of 0 read as `COLDEST`; logits at
    `NEG` or below (tokens that may not be chosen) stay there, so that no temperature, however
    high, lifts them to the real tokens' level."""
    logits = ops.cast(logits, "float32")
    scaled = logits / ops.maximum(ops.cast(temperature, "float32"), COLDEST)
    return ops.where(logits <= NEG, ops.minimum(logits, NEG), scaled)


def top_k_filter(logits, k):
    """The `k` most likely tokens of each row of `(B, V)` logits kept, the others at `NEG`.

    Tokens tied with the k-th largest logit are all kept; `k` 0 or at least `V` keeps every
    token. `k` is an int or a scalar int tensor.
    """
    vocab = ops.shape(logits)[-1]
    k = ops.cast(k, "int32")
    k = ops.where(ops.logical_and(k > 0, k < vocab), k, vocab)
    ascending = ops.sort(logits, axis=-1)  # (B, V)
    kth = _take_column(ascending, vocab - k)  # (B, 1): the k-th largest logit
    return ops.where(logits >= kth, logits, NEG)


def top_p_filter(logits, p):
    """Nucleus filter of `(B, V)` logits: a token is kept when the probability of the tokens
    more likely than it is below `p` (so the token that crosses `p` is kept, and so is the most
    likely one); `p = 1` keeps every token."""
    probs = ops.softmax(logits, axis=-1)
    descending = ops.flip(ops.sort(probs, axis=-1), axis=-1)  # (B, V)
    before = ops.cumsum(descending, axis=-1) - descending  # mass of the more likely tokens
    kept = ops.sum(ops.cast(before < ops.cast(p, "float32"), "int32"), axis=-1)  # (B,)
    smallest = _take_column(descending, ops.maximum(kept, 1) - 1)  # (B, 1): least likely kept
    return ops.where(probs >= smallest, logits, NEG)


def min_p_filter(logits, min_p):
    """Min-p filter of `(B, V)` logits (Nguyen et al., 2024): a token is kept when its
    probability is at least `min_p` times the most likely token's (that one always is);
    `min_p = 0` keeps every token. As `transformers`' `MinPLogitsWarper`."""
    probs = ops.softmax(logits, axis=-1)
    threshold = ops.cast(min_p, "float32") * ops.max(probs, axis=-1, keepdims=True)  # (B, 1)
    return ops.where(probs >= threshold, logits, NEG)


def repetition_penalty(logits, token_ids, index, penalty):
    """Logits of the tokens already in each sequence divided by `penalty` where positive,
    multiplied by it where negative (Keskar et al., 2019; `transformers`'
    `RepetitionPenaltyLogitsProcessor`).

    Args:
        logits: float32 `(B, V)`.
        token_ids: int `(B, L)`: the sequences; positions `0..index` count (the prompt
            included), the later ones are ignored.
        index: scalar int, the last position that counts.
        penalty: float or scalar tensor > 0; 1 changes nothing.

    Returns:
        float32 `(B, V)`.
    """
    batch, length = ops.shape(token_ids)[0], ops.shape(token_ids)[1]
    token_ids = ops.cast(token_ids, "int32")
    counts = ops.arange(length, dtype="int32")[None, :] <= ops.cast(index, "int32")  # (1, L)
    # Positions that do not count name the first token instead (it always counts), so every
    # write below marks a token of the sequence, whatever a backend does with duplicates.
    ids = ops.where(counts, token_ids, token_ids[:, :1])  # (B, L)
    rows = ops.broadcast_to(ops.arange(batch, dtype="int32")[:, None], (batch, length))
    indices = ops.reshape(ops.stack([rows, ids], axis=-1), (-1, 2))  # (B L, 2)
    seen = ops.scatter(indices, ops.ones((batch * length,), "float32"),
                       tuple(ops.shape(logits))) > 0  # (B, V)
    penalty = ops.cast(penalty, "float32")
    penalized = ops.where(logits < 0, logits * penalty, logits / penalty)
    return ops.where(seen, penalized, logits)


def _take_column(x, column):
    """`x[b, column[b]]` as `(B, 1)`, for `x` `(B, V)` and `column` int `(B,)` or scalar."""
    column = ops.cast(column, "int32")
    column = ops.broadcast_to(ops.reshape(column, (-1, 1)), (ops.shape(x)[0], 1))
    return ops.take_along_axis(x, column, axis=-1)


def filter_logits(logits, temperature=1.0, top_k=0, top_p=1.0):
    """`logits / temperature`, then the top-k filter, then the nucleus filter (keras_attn
    0.2's sampling; `samplers.TopP(p, k, temperature)` draws from it).

    Args:
        logits: float32 `(B, V)`.
        temperature: float or scalar tensor > 0.
        top_k: int or scalar int tensor; 0 keeps every token.
        top_p: float or scalar tensor in (0, 1]; 1 keeps every token.

    Returns:
        float32 `(B, V)`.
    """
    return top_p_filter(top_k_filter(scale(logits, temperature), top_k), top_p)


def uniform(shape, seed, step):
    """Uniform numbers in (0, 1) of `shape`, a function of the integers `seed` and `step`
    (tensors) alone: TensorFlow's and JAX's stateless generators, or a torch generator seeded
    from both (run eagerly, also inside a compiled step). TensorFlow's draws differ with XLA (`jit_compile=True`):
    its stateless generator orders its stream otherwise there."""
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
        return _torch_draws()(tuple(int(d) for d in shape), seed, step, tiny)
    raise ValueError(f"Sampling is not implemented for the {backend!r} backend.")


_TORCH_DRAWS = []


def _torch_draws():
    """torch's draws of `uniform`: a CPU generator seeded from `seed` and `step`, run eagerly
    even inside a compiled decoding step (`torch.compiler.disable`: reading the seed's value
    is a graph break TorchDynamo would otherwise split the step at)."""
    if not _TORCH_DRAWS:
        import torch

        @torch.compiler.disable
        def draws(shape, seed, step, tiny):
            generator = torch.Generator(device="cpu")
            generator.manual_seed(int(seed) * 1_000_003 + int(step))
            return ops.convert_to_tensor(
                tiny + (1.0 - tiny) * torch.rand(shape, generator=generator))

        _TORCH_DRAWS.append(draws)
    return _TORCH_DRAWS[0]


def sample(logits, seed, step):
    """One token per row drawn from `softmax(logits)` (Gumbel-max: `argmax(logits + G)`)."""
    gumbel = -ops.log(-ops.log(uniform(ops.shape(logits), seed, step)))
    return ops.cast(ops.argmax(logits + gumbel, axis=-1), "int32")


def greedy(logits):
    """The most likely token of each row."""
    return ops.cast(ops.argmax(logits, axis=-1), "int32")
