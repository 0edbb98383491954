"""The arguments of `CausalLM.generate` checked: token-id prompts (keras-hub's dict form
included), stop strings and the speculative-decoding options."""

from __future__ import annotations

import keras
import numpy as np

from keras_attn._checks import check_bool


def speculation(draft, draft_tokens, return_acceptance, stream, sampler) -> dict | None:
    """The speculative decoding options of `generate` (None without a draft), checked where
    `generate` alone can say what is wrong: a draft beside `stream` or beam search, or the
    options without a draft (`keras_attn.decoding.speculative` checks the rest)."""
    check_bool("return_acceptance", return_acceptance)
    if draft is None:
        if draft_tokens is not None or return_acceptance:
            raise ValueError(
                "Arguments `draft_tokens` and `return_acceptance` apply to speculative "
                f"decoding: give a `draft` model too. Received: draft_tokens={draft_tokens!r}, "
                f"return_acceptance={return_acceptance!r}, draft=None")
        return None
    if not isinstance(draft, keras.Model):
        raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
            "Argument `draft` must be a CausalLM (or a keras_attn causal model) with this "
            f"model's vocabulary. Received: draft={draft!r:.200}")
    if stream:
        raise ValueError("Argument `draft` does not apply with `stream=True` (speculative "
                         "decoding returns its text whole). Received: stream=True, "
                         f"draft={draft.name!r}")
    beam = sampler.beam()
    if beam is not None and beam.num_beams > 1:
        raise ValueError("Argument `draft` does not apply to beam search: speculative "
                         f"decoding verifies one sequence per row. Received: sampler={sampler!r}")
    return {"draft": draft, "draft_tokens": draft_tokens,
            "return_acceptance": bool(return_acceptance)}


def stop_strings(stop_strings) -> tuple[str, ...]:
    """`stop_strings` as a tuple of non-empty str; anything else is a ValueError naming it."""
    if stop_strings is None:
        return ()
    stops = (stop_strings,) if isinstance(stop_strings, str) else stop_strings
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
        raise ValueError("Argument `stop_strings` must be a non-empty str or a list of them. "
                         f"Received: stop_strings={stop_strings!r:.200}")
    return tuple(stops)


def prompt_ids(inputs):
    """Token-id prompts as `(token_ids (B, P), lengths (B,) or None)`; anything that is
    neither text nor a rank-2 batch of ids is a ValueError naming `inputs`."""
    if isinstance(inputs, dict) and set(inputs) == {"token_ids", "padding_mask"}:
        token_ids = np.asarray(keras.ops.convert_to_numpy(inputs["token_ids"]))
        mask = np.asarray(keras.ops.convert_to_numpy(inputs["padding_mask"]))
        if mask.dtype.kind not in "biu" or mask.shape != token_ids.shape or mask.ndim != 2 or (
                mask.dtype.kind != "b" and not np.isin(mask, (0, 1)).all()):
            raise ValueError(
                "Argument `inputs[\"padding_mask\"]` must be booleans of the token ids' shape "
                f"{token_ids.shape}. Received: padding_mask with dtype {mask.dtype} and shape "
                f"{mask.shape}")
        mask = mask.astype(bool)
        lengths = mask.sum(axis=1)
        prefix = np.arange(mask.shape[1])[None, :] < lengths[:, None]  # (B, P)
        bad = np.flatnonzero((mask != prefix).any(axis=1) | (lengths == 0))
        if bad.size:
            raise ValueError(
                "Argument `inputs[\"padding_mask\"]` must mark a right-padded prompt: each row "
                "True for its tokens (at least one), then False. Received: padding_mask["
                f"{bad[0]}]={mask[bad[0]].tolist()!r:.200}")
        return token_ids, lengths.astype("int32")
    if isinstance(inputs, (list, tuple)) and np.asarray(inputs, dtype=object).dtype == object and (
            any(isinstance(t, (str, bytes)) for t in np.ravel(np.asarray(inputs, dtype=object)))):
        raise ValueError("Argument `inputs` must be a string or a flat list of strings (one "
                         f"prompt each). Received: inputs={inputs!r:.200}")
    shape = getattr(inputs, "shape", None)
    if shape is None and isinstance(inputs, (list, tuple)):
        shape = np.shape(inputs) if all(isinstance(row, (list, tuple)) for row in inputs) else ()
    if shape is None or len(shape) != 2:
        raise ValueError(
            "Argument `inputs` must be a string, a list of strings, int token ids (B, P) or a "
            f"dict with `token_ids` and `padding_mask`. Received: inputs={inputs!r:.200}")
    return inputs, None
