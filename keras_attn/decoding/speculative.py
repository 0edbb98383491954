"""Speculative decoding of causal language models (Leviathan et al., 2023; Chen et al., 2023):
a small draft model proposes `draft_tokens` tokens, one at a time over its own cache, and the
target model scores all of them in one pass over its cache (the decoder step with `k + 1`
query positions, as a prompt is run); the longest prefix the target agrees with is kept, then
the target's own token.

- Greedy (`Greedy`, or any sampler that takes the most likely token of its `process_logits`):
  a drafted token is kept when it is the target's most likely token; the output is the
  target's own greedy output, token for token.
- Sampling (`Random`, `TopK`, `TopP`, `MinP`, alone or in a `RepetitionPenalty`): with `p` and
  `q` the target's and the draft's distributions after the sampler's own temperature and
  filters (`Sampler.process_logits`), a drafted token `x` is kept with probability
  `min(1, p(x) / q(x))`; at the first one rejected the token is drawn from
  `normalize(max(0, p - q))`, and after `k` kept ones from `p`: every token is a draw from the
  target's distribution.

Each round works on a window of `k + 1` positions `[s, s + k]` starting at the last position
`pos` that every row has settled (`s = min(pos, max_length - 1 - k)`, so that the window stays
inside the buffer near its end); positions up to `pos` and inside a row's prompt are forced
(kept as they are). A batch advances by the fewest tokens any of its unfinished rows settled
(one scalar cache index serves the whole batch); what another row settled beyond is drawn
again in the next round. Keeping fewer tokens than a row settled keeps draws from the target's
distribution: each kept token is, given the tokens before it, a draw from the target, and
where a row is cut depends only on the other rows. Every round draws fresh numbers (numbered
by the round and the window position).

Caches are overwritten by position: the cached attention is causal with the offset of its
call, so keys a round wrote past the settled length (drafts then rejected) are never attended
to before a later round writes those positions again.

References:
    Leviathan et al., 2023, "Fast Inference from Transformers via Speculative Decoding",
    https://arxiv.org/abs/2211.17192
    Chen et al., 2023, "Accelerating Large Language Model Decoding with Speculative Sampling",
    https://arxiv.org/abs/2302.01318
"""

from __future__ import annotations

from keras import ops

from keras_attn.decoding import (
    causal_lm,
    checks,
    choices,
    compiled,
    contract,
    loops,
    stepwise,
)
from keras_attn.decoding.samplers import Random, Sampler

DEFAULT_DRAFT_TOKENS = 4


def check_draft(model, draft):
    """The draft's decoder layer: `draft` a causal language model (a `CausalLM`, or a model
    whose layer `"decoder"` keeps the decoding contract) with the vocabulary of `model`'s."""
    try:
        layer = causal_lm.decoder(draft)
    except ValueError as error:
        raise ValueError(
            "Argument `draft` must be a keras_attn causal language model (a CausalLM, or a "
            "model with a layer named 'decoder' that keeps the decoding contract). Received: "
            f"draft={draft!r}") from error
    target, own = (checks.vocabulary_size(causal_lm.decoder(model)),
                   checks.vocabulary_size(layer))
    if target != own:
        raise ValueError(
            f"Argument `draft` must have the target's vocabulary of {target} tokens (the "
            f"target checks its tokens by id). Received: draft with vocabulary_size={own}")
    return layer


def check_draft_tokens(draft_tokens, max_length: int) -> int:
    """`draft_tokens` as an int in `[1, max_length - 1]` (the window of a round is
    `draft_tokens + 1` positions of the cache)."""
    if isinstance(draft_tokens, bool) or not isinstance(draft_tokens, int) or not (
            1 <= draft_tokens < max_length):
        raise ValueError(
            "Received an invalid value for argument `draft_tokens`, expected an int in "
            f"[1, max_length - 1 = {max_length - 1}]. Received: draft_tokens={draft_tokens!r}")
    return draft_tokens


def rule(sampler: Sampler) -> str:
    """`"greedy"` or `"random"`: how `sampler`'s tokens are verified; a ValueError naming
    `sampler` for one whose distribution cannot be read (beam search, a sampler of its own
    choosing in `get_next_token`)."""
    beam = sampler.beam()
    if beam is not None and beam.num_beams > 1:
        raise ValueError(
            "Argument `draft` does not apply to beam search: speculative decoding verifies one "
            f"sequence per row. Received: sampler={sampler!r}")
    inner = _innermost(sampler)
    if isinstance(inner, Random):
        return "random"
    if type(inner).get_next_token is Sampler.get_next_token:
        return "greedy"
    raise ValueError(
        "Argument `sampler` must take the most likely token of its `process_logits` or draw "
        "from them (a Random, TopK, TopP or MinP) for speculative decoding, which reads their "
        f"distribution. Received: sampler={sampler!r}")


def _innermost(sampler: Sampler) -> Sampler:
    """The sampler a wrapper (`RepetitionPenalty`) ends at."""
    while sampler.children:
        sampler = getattr(sampler, sampler.children[0])
    return sampler


def _speculate(model, prompt_ids, lengths, max_new_tokens, *numbers, draft, draft_tokens,
               sampler, max_length, stop_token_ids, fill_id, suppressed_ids):
    """The whole speculative generation for one batch of prompts: `(tokens (B, L), accepted,
    proposed, rounds)`, the last three int32 scalars (drafted tokens kept and proposed in
    unfinished rows, target passes)."""
    layer, draft_layer = causal_lm.decoder(model), causal_lm.decoder(draft)
    k, length = draft_tokens, max_length
    sampler = sampler.bind(numbers)
    greedy = rule(sampler) == "greedy"
    seed = None if greedy else _innermost(sampler)._number("seed")
    prompt_ids = ops.cast(prompt_ids, "int32")
    batch, prompt_len = ops.shape(prompt_ids)[0], ops.shape(prompt_ids)[1]
    lengths = ops.cast(lengths, "int32")  # (B,)
    tokens = ops.concatenate(
        [prompt_ids, ops.full((batch, length - prompt_len), fill_id, "int32")], axis=1)  # (B, L)
    limits = lengths + ops.minimum(max_new_tokens, length - lengths)  # (B,)
    fill = contract.step_function(layer, False, return_logits=False)
    target_state = fill(prompt_ids, 0, layer.init_decode_state(batch, length))[1]
    draft_state = contract.step_function(draft_layer, False, return_logits=False)(
        prompt_ids, 0, draft_layer.init_decode_state(batch, length))[1]
    target_step = contract.step_function(layer, False)
    draft_step = contract.step_function(draft_layer, False)

    def distribution(logits, window, index):
        """The sampler's logits of a step, the ids never emitted ruled out first."""
        return sampler.process_logits(loops._masked_logits(logits, suppressed_ids), window,
                                      index)

    def draw(logits, step):
        return choices.greedy(logits) if greedy else choices.sample(logits, seed, step)

    def propose(j, window, draft_state, draft_logits, start, step, forced):
        """The draft's step at position `start + j`: it proposes position `start + j + 1`
        (the last of the `k + 1` steps only fills its cache)."""
        at = start + j + 1
        logits, draft_state, _ = draft_step(loops.column(window, at - 1), at - 1, draft_state)
        logits = distribution(logits, window, at - 1)  # (B, V)
        here = ops.minimum(at, length - 1)
        token = ops.where(loops.column(forced, ops.minimum(j, k - 1)),
                          loops.column(window, here), draw(logits, 3 * (step + j)))
        window = loops.write(window, at, token)  # a no-op past the buffer
        return window, draft_state, loops.write(draft_logits, j, logits)  # (B, k, V)

    def advance(pos, rounds, tokens, finished, accepted, proposed, target_state, draft_state):
        start = ops.minimum(pos, length - 1 - k)
        step = rounds * (k + 1)  # numbers the draws: 3 streams per window position
        offsets = ops.arange(k + 1, dtype="int32")  # (k + 1,)
        # The drafted positions start + 1 .. start + k: forced up to `pos` and in the prompts.
        forced = ops.logical_or(start + offsets[None, 1:] <= pos,
                                start + offsets[None, 1:] < lengths[:, None])  # (B, k)

        def body(j, window, draft_state, draft_logits):
            window, draft_state, draft_logits = propose(j, window, draft_state, draft_logits,
                                                        start, step, forced)
            return j + 1, window, draft_state, draft_logits

        vocab = checks.vocabulary_size(layer)
        _, window, draft_state, draft_logits = ops.while_loop(
            lambda j, *rest: j <= k, body,
            (ops.convert_to_tensor(0, "int32"), tokens, draft_state,
             ops.zeros((batch, k, vocab), "float32")))
        drafted = ops.take(window, start + offsets, axis=1)  # (B, k + 1)
        # The target's one pass over the window: logits[:, j] predict position start + j + 1.
        logits, target_state, _ = target_step(drafted, start, target_state)
        target_logits = ops.stack([distribution(logits[:, j], window, start + j)
                                   for j in range(k + 1)], axis=1)  # (B, k + 1, V)
        proposals = drafted[:, 1:]  # (B, k)
        if greedy:
            agrees = ops.equal(choices.greedy(target_logits[:, :k]), proposals)
        else:
            p = _probability(target_logits[:, :k], proposals)  # (B, k)
            q = _probability(draft_logits, proposals)
            u = choices.uniform(ops.shape(proposals), seed, 3 * step + 1)
            agrees = u * q < p  # u < p(x) / q(x): kept with probability min(1, p / q)
        kept = ops.logical_or(forced, agrees)  # (B, k)
        count = ops.sum(ops.cumprod(ops.cast(kept, "int32"), axis=1), axis=1)  # (B,) kept first
        # The target's token after them: at the first rejection, or after all k (a bonus).
        if greedy:
            chosen = choices.greedy(ops.take_along_axis(
                target_logits, count[:, None, None], axis=1)[:, 0])
        else:
            residuals = ops.concatenate([_residual(target_logits[:, :k], draft_logits),
                                         target_logits[:, k:]], axis=1)  # (B, k + 1, V)
            chosen = choices.sample(ops.take_along_axis(
                residuals, count[:, None, None], axis=1)[:, 0], seed, 3 * step + 2)
        last = ops.minimum(start + count + 1, length - 1)  # (B,): each row's settled end
        new_pos = ops.min(ops.where(finished, length - 1, last))
        live = ops.logical_not(finished)[:, None]
        free = ops.logical_and(live, ops.logical_not(forced))  # (B, k): drafted, not forced
        proposed = proposed + _count(free)
        accepted = accepted + _count(ops.logical_and(free, offsets[None, 1:] <= count[:, None]))
        for j in range(1, k + 2):  # settle positions pos + 1 .. new_pos, in order
            at = start + j
            token = chosen if j == k + 1 else ops.where(j <= count, proposals[:, j - 1], chosen)
            active = ops.logical_and(at > pos, at <= new_pos)
            tokens, finished = _settle(tokens, finished, active, ops.minimum(at, length - 1),
                                       token, lengths, limits, stop_token_ids, fill_id)
        return (new_pos, rounds + 1, tokens, finished, accepted, proposed, target_state,
                draft_state)

    def cond(pos, rounds, tokens, finished, *rest):
        return ops.logical_and(pos < length - 1, ops.logical_not(ops.all(finished)))

    zero = ops.convert_to_tensor(0, "int32")
    _, rounds, tokens, _, accepted, proposed, _, _ = stepwise.while_loop(
        cond, advance, (ops.min(lengths) - 1, zero, tokens, ops.zeros((batch,), "bool"), zero,
                        zero, target_state, draft_state))
    return tokens, accepted, proposed, rounds


def _count(flags):
    """How many of the boolean `flags` are True, an int32 scalar."""
    return ops.cast(ops.sum(ops.cast(flags, "int32")), "int32")


def _probability(logits, token):
    """`softmax(logits)[..., token]`: float32 `(B, k)` for logits `(B, k, V)`, tokens `(B, k)`."""
    probs = ops.softmax(logits, axis=-1)
    return ops.take_along_axis(probs, ops.expand_dims(token, -1), axis=-1)[..., 0]


def _residual(target_logits, draft_logits):
    """The logits of `normalize(max(0, p - q))`, or of `p` where `p` equals `q` (the residual
    is then empty, and never drawn from: a token is always kept there)."""
    p, q = ops.softmax(target_logits, axis=-1), ops.softmax(draft_logits, axis=-1)
    residual = ops.maximum(p - q, 0.0)
    empty = ops.sum(residual, axis=-1, keepdims=True) <= 0
    residual = ops.where(empty, p, residual)
    return ops.where(residual > 0, ops.log(ops.maximum(residual, 1e-30)), choices.NEG)


def _settle(tokens, finished, active, at, chosen, lengths, limits, stop_token_ids, fill_id):
    """Position `at` of the rows where `active`: the prompt's token, the fill after a row's
    end or limit, else `chosen`; a row ends at a stop id (`loops.token_loop`'s rules)."""
    forced = at < lengths
    ended = ops.logical_or(finished, ops.logical_and(
        active, ops.logical_and(ops.logical_not(forced), at >= limits)))
    token = ops.where(forced, loops.column(tokens, at), ops.where(ended, fill_id, chosen))
    live = ops.logical_and(active, ops.logical_not(ops.logical_or(forced, ended)))
    finished = ops.where(active, ops.logical_or(
        ended, ops.logical_and(live, loops._ends(token, stop_token_ids))), finished)
    return loops.write(tokens, at, ops.where(active, token, loops.column(tokens, at))), finished


def run(model, draft, prompt_ids, max_length: int, sampler, ids: dict, max_new_tokens,
        prompt_lengths, draft_tokens, jit_compile: bool | None) -> tuple:
    """`generate(..., draft=...)` for a causal language model: `(tokens (B, max_length),
    acceptance)`, `acceptance` the share of drafted tokens the target kept (a float; NaN when
    none was drafted)."""
    checks.length("max_length", max_length, 2)
    check_draft(model, draft)
    draft_tokens = check_draft_tokens(
        DEFAULT_DRAFT_TOKENS if draft_tokens is None else draft_tokens, max_length)
    rule(sampler)
    prompt_ids, prompt_lengths = causal_lm.prompts(model, prompt_ids, max_length, ids,
                                                   prompt_lengths)
    max_new_tokens = causal_lm.new_tokens(max_new_tokens, max_length)
    options = {"draft": draft, "draft_tokens": draft_tokens, "sampler": sampler,
               "max_length": int(max_length), "stop_token_ids": ids["stop_token_ids"],
               "fill_id": ids["fill_id"], "suppressed_ids": ids["suppressed_ids"]}
    arrays = (prompt_ids, prompt_lengths, max_new_tokens) + sampler.tensors()
    tokens, accepted, proposed, _ = compiled.run(_speculate, model, arrays, options,
                                                 jit_compile, companions=(draft,),
                                                 autograph=False)
    accepted, proposed = (int(ops.convert_to_numpy(n)) for n in (accepted, proposed))
    return tokens, accepted / proposed if proposed else float("nan")
