"""Speculative decoding (`keras_attn.decoding.speculative`, `generate(..., draft=...)`): greedy
output equal, token for token, to the target's own greedy decoding (recomputed here by full
forward passes, no cache), from ids and from strings, prompts of different lengths; sampled
tokens distributed as the target's filtered distribution (exact, on a tiny vocabulary); bad
input refused with a ValueError naming the argument."""

import numpy as np
import pytest
from keras import ops

import keras_attn as ka
from keras_attn.decoding import generate, samplers
from keras_attn.preprocessing import CausalLMPreprocessor, CharacterTokenizer
from keras_attn.tasks import CausalLM
from keras_attn.tokens import BOS_ID, EOS_ID, PAD_ID, RESERVED_TOKENS

SUPPRESSED = (PAD_ID, BOS_ID)  # never generated (`special_ids`)
MAX_LENGTH = 11


def _model(vocabulary_size, num_layers, seed):
    return ka.models.causal_lm(vocabulary_size, num_layers=num_layers, hidden_dim=16,
                               num_heads=2, intermediate_dim=32, seed=seed)


@pytest.fixture(scope="module")
def lms():
    """A 2-layer target and a 1-layer draft with their own random weights, one tokenizer."""
    tokenizer = CharacterTokenizer(list(RESERVED_TOKENS) + list("abcdefgh "))
    preprocessor = CausalLMPreprocessor(tokenizer, sequence_length=MAX_LENGTH)
    target = CausalLM(_model(tokenizer.vocabulary_size, 2, seed=1), preprocessor)
    draft = CausalLM(_model(tokenizer.vocabulary_size, 1, seed=7), preprocessor)
    return target, draft


def _greedy_reference(lm, prompt_ids, lengths, max_length, stop_id=EOS_ID):
    """The target's greedy continuation by full forward passes over the whole sequence (no
    cache): `(B, max_length)`, the prompt, the tokens up to the stop id, then padding. Every
    pass reads `(B, max_length)` ids (the causal model's logits at a position do not depend
    on the ids after it), so each backend runs one shape."""
    lengths = np.array(lengths)
    tokens = np.full((len(lengths), max_length), PAD_ID, "int32")
    tokens[:, :prompt_ids.shape[1]] = prompt_ids
    done = np.zeros(len(lengths), bool)
    for _ in range(max_length - lengths.min()):
        logits = ops.convert_to_numpy(lm.backbone(tokens))  # (B, L, V)
        for row in np.flatnonzero(~done & (lengths < max_length)):
            last = logits[row, lengths[row] - 1]
            last[list(SUPPRESSED)] = -np.inf
            tokens[row, lengths[row]] = np.argmax(last)
            done[row] = tokens[row, lengths[row]] == stop_id
            lengths[row] += 1
    return tokens


# Prompts of different lengths, as ids and as the strings the tokenizer reads as these ids
# (`<bos>` then a=4, b=5, ...).
PROMPT_IDS = np.array([[BOS_ID, 5, 9, 6, 11, 4], [BOS_ID, 8, PAD_ID, PAD_ID, PAD_ID, PAD_ID]],
                      "int32")
PROMPT_LENGTHS, PROMPT_TEXTS = [6, 2], ["bfcha", "e"]


@pytest.fixture(scope="module")
def expected(lms):
    return _greedy_reference(lms[0], PROMPT_IDS, PROMPT_LENGTHS, MAX_LENGTH)


@pytest.mark.parametrize("draft_tokens", [1, 3])
def test_greedy_equals_the_targets_greedy_from_ids(lms, expected, draft_tokens):
    target, draft = lms
    tokens, acceptance = target.generate(PROMPT_IDS, MAX_LENGTH, draft=draft,
                                         draft_tokens=draft_tokens, return_acceptance=True)
    np.testing.assert_array_equal(ops.convert_to_numpy(tokens), expected)
    assert 0.0 <= acceptance <= 1.0
    if draft_tokens == 1:  # the low-level function, on the models themselves: the same tokens
        np.testing.assert_array_equal(ops.convert_to_numpy(generate(
            target, PROMPT_IDS, MAX_LENGTH, draft=draft, draft_tokens=1)), expected)


def test_greedy_equals_the_targets_greedy_from_strings(lms, expected):
    target, draft = lms
    encoded = target.preprocessor.generate_preprocess(PROMPT_TEXTS, MAX_LENGTH, None)
    np.testing.assert_array_equal(encoded["token_ids"].numpy(), PROMPT_IDS)
    reference = target.preprocessor.generate_postprocess(expected, PROMPT_LENGTHS).numpy()
    texts, acceptance = target.generate(PROMPT_TEXTS, MAX_LENGTH, strip_prompt=True,
                                        draft=draft, draft_tokens=3, return_acceptance=True)
    assert texts == [t.decode("utf-8") for t in reference]
    assert 0.0 <= acceptance <= 1.0


# ---- sampling: the target's distribution -------------------------------------------------------

VOCAB, ROWS, PROMPT = 12, 4000, [BOS_ID, 5]
TOP_K, TEMPERATURE = 6, 1.0
SAMPLER = samplers.TopK(TOP_K, temperature=TEMPERATURE, seed=11)


def _filtered(logits):
    """`SAMPLER`'s distribution of float logits `(N, V)` (the ids never generated removed),
    in NumPy: the `TOP_K` most likely tokens after the temperature, renormalized."""
    logits = np.array(logits, "float64") / TEMPERATURE
    logits[:, list(SUPPRESSED)] = -np.inf
    kth = np.sort(logits, axis=-1)[:, -TOP_K:1 - TOP_K]
    logits = np.where(logits >= kth, logits, -np.inf)
    probs = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return probs / probs.sum(axis=-1, keepdims=True)


def _distributions(model):
    """`SAMPLER`'s exact distributions under `model` of the first token after `PROMPT`
    `(V,)` and of the second given the first `(V, V)`, from one forward pass."""
    prefixes = np.array([PROMPT + [token] for token in range(VOCAB)], "int32")
    logits = ops.convert_to_numpy(model(prefixes))  # (V, 3, V)
    return _filtered(logits[:1, 1])[0], _filtered(logits[:, 2])


def _total_variation(p, q):
    return 0.5 * float(np.abs(np.asarray(p) - np.asarray(q)).sum())


def test_sampled_tokens_follow_the_targets_distribution():
    target, draft = _model(VOCAB, 2, seed=4), _model(VOCAB, 1, seed=9)
    first, given = _distributions(target)
    second = first @ given  # the second token's marginal
    # The draft's own first-token distribution is far from the target's: a rule that kept
    # every drafted token would fail the bounds below.
    assert _total_variation(_distributions(draft)[0], first) > 0.25
    tokens, acceptance = generate(
        target, np.tile([PROMPT], (ROWS, 1)), 5, sampler=SAMPLER, stop_token_ids=None,
        draft=draft, draft_tokens=3, return_acceptance=True)
    tokens = ops.convert_to_numpy(tokens)
    assert 0.1 < acceptance < 0.9  # both the kept proposals and the redrawn tokens count
    # With 4000 draws, the total variation of the empirical distribution from the exact one
    # is about 0.015 (0.4 · Σ sqrt(p (1 - p) / N), over at most 10 tokens); the bound is 0.05.
    for position, exact in ((2, first), (3, second)):
        empirical = np.bincount(tokens[:, position], minlength=VOCAB) / ROWS
        assert _total_variation(empirical, exact) < 0.05, (position, empirical, exact)


# ---- bad input ----------------------------------------------------------------------------------

def test_bad_arguments_are_refused(lms):
    target, draft = lms
    prompts = np.array([[BOS_ID, 5, 9]])
    other = _model(VOCAB + 3, 1, seed=2)
    with pytest.raises(ValueError, match="draft"):  # another vocabulary
        target.generate(prompts, MAX_LENGTH, draft=other)
    with pytest.raises(ValueError, match="draft"):
        generate(target, prompts, MAX_LENGTH, draft=other)
    for bad in (0, -2, 2.0, "4", True, MAX_LENGTH):
        with pytest.raises(ValueError, match="draft_tokens"):
            target.generate(prompts, MAX_LENGTH, draft=draft, draft_tokens=bad)
    with pytest.raises(ValueError, match="draft"):  # beam search
        target.generate(prompts, MAX_LENGTH, draft=draft, sampler=samplers.Beam(2))
    with pytest.raises(ValueError, match="draft"):  # streaming
        next(iter(target.generate("abc", MAX_LENGTH, draft=draft, stream=True)))
    for bad in ("draft", prompts, draft.backbone):  # not a causal model
        with pytest.raises(ValueError, match="draft"):
            target.generate(prompts, MAX_LENGTH, draft=bad)
    with pytest.raises(ValueError, match="draft_tokens"):  # without a draft
        target.generate(prompts, MAX_LENGTH, draft_tokens=3)
    with pytest.raises(ValueError, match="return_acceptance"):
        generate(target, prompts, MAX_LENGTH, return_acceptance=True)
    with pytest.raises(ValueError, match="return_scores"):
        generate(target, prompts, MAX_LENGTH, draft=draft, return_scores=True)
    with pytest.raises(ValueError, match="sampler"):  # a sampler whose distribution is hidden
        generate(target, prompts, MAX_LENGTH, draft=draft, sampler=_Hidden())


class _Hidden(samplers.Sampler):
    def get_next_token(self, logits, token_ids, index):
        return ops.cast(ops.argmin(logits, axis=-1), "int32")
