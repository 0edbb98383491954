"""The special ids of decoding, derived in one place from the model and what the caller says:
the ids that end a row, the prompts' padding, the id written after a row's end, the start
token of a sequence-to-sequence decoder, and the ids never generated.

`keras_attn.decoding.generate` calls `special_ids`; so does anything that prepares prompts for
it (a preprocessor), so that both read the same ids.
"""

from __future__ import annotations

from keras_attn._checks import check_int
from keras_attn.decoding import checks, compiled
from keras_attn.tokens import BOS_ID, EOS_ID, PAD_ID


def _decoder_layer(model):
    """`model`'s layer `"decoder"`, or None (no model, or a model without one: the contract
    checks say so where it is decoded)."""
    if model is None or not compiled.has_layer(model, "decoder"):
        return None
    return model.get_layer("decoder")


def _token_tuple(name: str, value, vocab_size) -> tuple:
    ids = tuple(value) if isinstance(value, (tuple, list)) else None
    if ids is None or not all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i and (
                vocab_size is None or i < vocab_size) for i in ids):
        raise ValueError(
            f"Received an invalid value for argument `{name}`, expected None or a tuple of "
            f"token ids in [0, {vocab_size}). Received: {name}={value!r}")
    return ids


def special_ids(model=None, *, stop_token_ids=EOS_ID, pad_id: int | None = None,
                bos_id: int = BOS_ID, suppressed_ids=None) -> dict:
    """The special ids of decoding `model`, checked.

    Args:
        model: the model decoded (its layer `"decoder"` gives the padding id, `pad_id`, and
            the vocabulary size, `vocabulary_size`), or None: keras_attn's ids
            (`keras_attn.tokens`). Defaults to `None`.
        stop_token_ids: the ids that end a row: an int, a tuple (a checkpoint's several end
            ids) or None (no id ends a row). Each must be a token the model can emit. Defaults
            to keras_attn's `<eos>` (`keras_attn.tokens.EOS_ID`, 3).
        pad_id: optional int, the id that right-pads prompts and follows a row's end (a
            checkpoint's own; it may be a real token, e.g. its end id). Defaults to `None`:
            the model's own (`decoder.pad_id`; keras_attn's 0 for a decoder without the
            attribute), which may be None: no id is padding.
        bos_id: int, the start token (fed first to a sequence-to-sequence decoder; never
            generated while there is a padding id). Defaults to `keras_attn.tokens.BOS_ID`
            (2).
        suppressed_ids: optional tuple of ids never generated. Defaults to `None`: the
            padding id and `bos_id` (keras_attn's reserved ids), nothing without a padding
            id.

    Returns:
        dict: `stop_token_ids` (a tuple of ints, or None), `pad_id` (int, or None: every
        prompt position is a token), `fill_id` (int, written after a row's end: the padding
        id, else the first stop id, else 0), `bos_id` (int) and `suppressed_ids` (tuple).

    Raises:
        ValueError: naming the argument: an id out of the vocabulary, a stop id that is
            never generated.

    Example:
    >>> special_ids(model)  # a keras_attn model
    {'stop_token_ids': (3,), 'pad_id': 0, 'fill_id': 0, 'bos_id': 2, 'suppressed_ids': (0, 2)}
    >>> special_ids(llama, stop_token_ids=(128001, 128009), pad_id=128001,
    ...             suppressed_ids=())  # a checkpoint's (`checkpoints.generation_ids`)
    """
    decoder = _decoder_layer(model)
    vocab_size = None if decoder is None else checks.vocabulary_size(decoder)
    check_int("bos_id", bos_id, 0)
    if pad_id is not None:
        check_int("pad_id", pad_id, 0)
        padding = int(pad_id)
    else:
        own = PAD_ID if decoder is None else getattr(decoder, "pad_id", PAD_ID)
        padding = None if own is None else int(own)
    if suppressed_ids is None:
        suppressed = () if padding is None else (padding, int(bos_id))
    else:
        suppressed = _token_tuple("suppressed_ids", suppressed_ids, vocab_size)
    stops = checks.stop_tokens(stop_token_ids, vocab_size, suppressed)
    fill = padding if padding is not None else stops[0] if stops else PAD_ID
    return {"stop_token_ids": stops, "pad_id": padding, "fill_id": fill,
            "bos_id": int(bos_id), "suppressed_ids": suppressed}
