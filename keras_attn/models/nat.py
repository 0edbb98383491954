"""A non-autoregressive translator: the conditional masked language model of Mask-Predict.

Ghazvininejad et al., 2019, "Mask-Predict: Parallel Decoding of Conditional Masked Language
Models", https://arxiv.org/abs/1904.09324.

The target side is the plain target `y` (no `<bos>`, no `<eos>`): `N = |y|` tokens padded with 0
to `max_target_length`, its length `N` the class the length head learns. Some of the `N` tokens
are replaced by `<mask>` (`keras_attn.tokens.mask_id(target_vocab_size)`, the id one past the
vocabulary) and the decoder predicts them all at once from the source and the unmasked
tokens. Training data: `keras_attn.data.nat.make_cmlm_dataset`; losses: `compile_cmlm`;
decoding: `keras_attn.decoding.mask_predict`; export: `keras_attn.export.export_nat_translator`.
"""

from __future__ import annotations

import keras
import numpy as np

from keras_attn._checks import check_number, check_positive_int
from keras_attn.layers.config import AttentionConfig
from keras_attn.models.cmlm import CMLMDecoder, LengthPredictor
from keras_attn.models.transformer import seq2seq_stacks


def nat_seq2seq(
    source_vocabulary_size: int | None = None,
    target_vocabulary_size: int | None = None,
    num_layers: int = 2,
    hidden_dim: int = 128,
    num_heads: int = 4,
    intermediate_dim: int = 512,
    dropout: float = 0.1,
    max_target_length: int | None = None,
    normalize_first: bool = False,
    attention: AttentionConfig | None = None,
    name: str = "nat_seq2seq",
    **kwargs,
) -> keras.Model:
    """A conditional masked language model (Mask-Predict's CMLM) as a functional `keras.Model`.

    `token_logits = decoder(masked_target_ids, encoder(source_ids))` with a decoder WITHOUT
    causal mask (bidirectional self-attention over the target positions, padding hidden, and
    cross-attention to the encoder), and `length_logits = length_predictor(encoder(source))`
    (masked mean of the encoder states, then a linear layer over the lengths
    `0..max_target_length`). The encoder is the seq2seq Transformer's. The model contains the
    layers `"encoder"` (`TransformerEncoder`), `"decoder"` (`CMLMDecoder`) and
    `"length_predictor"` (`LengthPredictor`), which `keras_attn.decoding.mask_predict` calls.

    Ids: source and target ids are those of the data's vocabularies (0 = padding); the decoder
    also reads `<mask>`, id `target_vocabulary_size` (outside the vocabulary). The token logits
    never pick padding, `<bos>`, `<eos>` (logit -1e9) or `<mask>` (no column).

    Args:
        source_vocabulary_size: int, number of source ids.
        target_vocabulary_size: int, number of target ids (size of the token logits).
        num_layers: int, blocks in the encoder and in the decoder. Defaults to `2`.
        hidden_dim: int, model size `d`. Defaults to `128`.
        num_heads: int, attention heads; must divide `hidden_dim`. Defaults to `4`.
        intermediate_dim: int, hidden size of the feed-forward networks. Defaults to `512`.
        dropout: float in [0, 1). Defaults to `0.1`.
        max_target_length: int, required: the most target tokens (e.g.
            `TranslationData.target_length`); length classes are `0..max_target_length`.
        normalize_first: bool, pre-LN blocks instead of post-LN. Defaults to `False`.
        attention: optional `AttentionConfig` of both stacks; its fields may also be given
            here as keywords (`implementation`, `chunk_size`, `sliding_window`, ...), as
            `transformer_seq2seq` takes them. Defaults to `None`.
        name: str, the model name. Defaults to `"nat_seq2seq"`.
        **kwargs: the attention fields; the blocks' `activation`, `norm`,
            `layer_norm_epsilon`, `use_bias`; the stacks' `kernel_initializer`, `seed`,
            `pad_id`, as `transformer_seq2seq` takes them.

    Returns:
        An uncompiled `keras.Model` with inputs `source_ids` `(B, S)` and `masked_target_ids`
        `(B, T)` (int32, `T <= max_target_length`) and outputs float32
        `token_logits` `(B, T, target_vocabulary_size)` and `length_logits`
        `(B, max_target_length + 1)`.

    Example:
    >>> model = nat_seq2seq(100, 120, num_layers=1, hidden_dim=32, num_heads=4,
    ...                     intermediate_dim=64, max_target_length=8)
    >>> compile_cmlm(model, "adam")
    >>> tokens, length = model([keras.ops.array([[5, 6, 0]]),
    ...                         keras.ops.array([[120, 7, 120, 0, 0, 0, 0, 0]])])
    >>> tokens.shape, length.shape  # (1, 8, 120), (1, 9)

    References:
        Ghazvininejad et al., 2019, "Mask-Predict", https://arxiv.org/abs/1904.09324
    """
    check_positive_int("max_target_length", max_target_length)
    # One initializer per stack as transformer_seq2seq makes them: these stacks draw from the
    # given initializer as they are (the NAT's weights of keras_attn 0.2 stay reproducible).
    kernel_initializer = kwargs.pop("kernel_initializer", None)
    own = {} if kernel_initializer is None else {"kernel_initializer": kernel_initializer}
    encoder, decoder = seq2seq_stacks("nat_seq2seq", CMLMDecoder, dict(kwargs, **own), {
        "source_vocabulary_size": source_vocabulary_size,
        "target_vocabulary_size": target_vocabulary_size, "num_layers": num_layers,
        "hidden_dim": hidden_dim, "num_heads": num_heads, "intermediate_dim": intermediate_dim,
        "dropout": dropout, "normalize_first": normalize_first, "attention": attention},
        per_stack_initializer=False)
    length_predictor = LengthPredictor(max_target_length, name="length_predictor")
    source_ids = keras.Input(shape=(None,), dtype="int32", name="source_ids")
    masked_target_ids = keras.Input(shape=(None,), dtype="int32", name="masked_target_ids")
    encoder_outputs = encoder(source_ids)  # (B, S, d)
    source_mask = encoder.padding_mask(source_ids)  # (B, S)
    token_logits = decoder(masked_target_ids, encoder_outputs,
                           encoder_padding_mask=source_mask)  # (B, T, V)
    length_logits = length_predictor(encoder_outputs, source_mask)  # (B, max_length + 1)
    return keras.Model([source_ids, masked_target_ids], [token_logits, length_logits],
                       name=name)


def compile_cmlm(model: keras.Model, optimizer="adam", length_loss_weight: float = 0.1,
                 **kwargs) -> keras.Model:
    """Compile a `nat_seq2seq` model with the conditional masked-LM losses of Mask-Predict.

    - tokens: sparse cross-entropy of the token logits, weighted by the per-token sample
      weights of `make_cmlm_dataset` (1 at masked positions, 0 elsewhere) and divided by the
      sum of the weights (`reduction="mean_with_sample_weight"`): the mean over the masked
      tokens of the batch, the paper's loss. Unmasked and padding positions count nothing.
    - length: sparse cross-entropy of the length logits against the target length, mean over
      the batch, times `length_loss_weight`.

    The metrics are the token accuracy over the masked positions and the length accuracy.

    Args:
        model: a `nat_seq2seq` model.
        optimizer: a Keras optimizer or its name. Defaults to `"adam"`.
        length_loss_weight: float >= 0, weight of the length loss. Defaults to `0.1`.
        **kwargs: passed on to `model.compile` (e.g. `jit_compile`).

    Returns:
        `model`, compiled.
    """
    model.compile(optimizer=optimizer, **cmlm_losses(length_loss_weight), **kwargs)
    return model


def cmlm_losses(length_loss_weight: float = 0.1) -> dict:
    """The `loss`, `loss_weights` and `weighted_metrics` of `compile_cmlm`, as `compile`
    keywords (`keras_attn.tasks.Seq2SeqLM` compiles with them too)."""
    check_number("length_loss_weight", length_loss_weight, 0)
    return {
        "loss": [
            keras.losses.SparseCategoricalCrossentropy(
                from_logits=True, reduction="mean_with_sample_weight", name="token_loss"),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True, name="length_loss"),
        ],
        "loss_weights": [1.0, float(length_loss_weight)],
        "weighted_metrics": [[keras.metrics.SparseCategoricalAccuracy(name="token_accuracy")],
                             [keras.metrics.SparseCategoricalAccuracy(name="length_accuracy")]],
    }


# The stack options that must agree for one stack's weights to start another's (the config's
# values, the block's and its attention's included: `activation` as Keras serializes it).
_MATCHING_OPTIONS = ("vocabulary_size", "num_layers", "hidden_dim", "num_heads",
                     "intermediate_dim", "normalize_first", "activation", "layer_norm_epsilon")


def _options(stack) -> dict:
    """`_MATCHING_OPTIONS` of `stack`'s config, read in it, its `block` and its attention."""
    config = stack.get_config()
    block = config.get("block") or {}
    flat = {**(block.get("attention") or {}), **block, **config}
    return {option: flat.get(option) for option in _MATCHING_OPTIONS}


def initialize_from_seq2seq(model: keras.Model, seq2seq: keras.Model) -> dict:
    """Start a `nat_seq2seq` model from the weights of a trained `transformer_seq2seq`.

    The NAT's encoder is the seq2seq Transformer's encoder and its decoder differs from the
    autoregressive one only in its self-attention mask and one more embedding row (`<mask>`),
    so an autoregressive teacher's weights are a trained starting point for the NAT (its
    length predictor starts untrained). Copied: every encoder weight; the decoder's blocks,
    final norm and output head; the decoder's token embedding rows `0..V-1`. Kept as
    initialised: the `<mask>` row (id `V`) and the length predictor. Variables are copied as
    stored (float32 under a `mixed_*` policy).

    Args:
        model: a built `nat_seq2seq` model (not quantized), changed in place.
        seq2seq: a built `transformer_seq2seq` model (not quantized) with the same
            vocabularies, `num_layers`, `hidden_dim`, `num_heads`, `intermediate_dim`,
            `normalize_first`, `activation` and `layer_norm_epsilon`.

    Returns:
        A dict: `"copied"`, the number of variables copied, and `"kept"`, the paths of the
        NAT's variables left as they were (the length predictor's).

    Raises:
        ValueError: if `model` or `seq2seq` is not of its kind, or an option, a variable's
            shape or its dtype differs (the error names it and both values). Everything is
            checked before anything is assigned: a refused call leaves `model` unchanged.

    Example:
    >>> teacher = transformer_seq2seq(100, 120, num_layers=1, hidden_dim=32, num_heads=4,
    ...                               intermediate_dim=64)
    >>> nat = nat_seq2seq(100, 120, num_layers=1, hidden_dim=32, num_heads=4,
    ...                   intermediate_dim=64, max_target_length=8)
    >>> initialize_from_seq2seq(nat, teacher)["kept"]
    ['length_predictor/dense/kernel', 'length_predictor/dense/bias']
    """
    if not isinstance(model, keras.Model) or not _has_layers(model, ("encoder", "decoder",
                                                                     "length_predictor")):
        raise ValueError("Argument `model` must be a keras_attn.models.nat_seq2seq model. "
                         f"Received: model={model!r}")
    if not isinstance(seq2seq, keras.Model) or not _has_layers(seq2seq, ("encoder", "decoder")):
        raise ValueError("Argument `seq2seq` must be a keras_attn.models.transformer_seq2seq "
                         f"model. Received: seq2seq={seq2seq!r}")
    assignments = []  # every (variable, value), all checked before the first is assigned
    for part in ("encoder", "decoder"):
        ours, theirs = model.get_layer(part), seq2seq.get_layer(part)
        for stack, label in ((ours, "model"), (theirs, "seq2seq")):
            if not getattr(stack, "built", False) or not hasattr(stack, "blocks"):
                raise ValueError(f"Argument `{label}` must be built and hold a keras_attn "
                                 f"{part} stack. Received: {part}={stack!r}")
        mine_config, their_config = _options(ours), _options(theirs)
        for option in _MATCHING_OPTIONS:
            if mine_config[option] != their_config[option]:
                raise ValueError(
                    f"Argument `seq2seq` must have the NAT's {part} {option}="
                    f"{mine_config[option]!r}. Received: {option}={their_config[option]!r}")
        # The one variable whose shape differs: the NAT decoder's token table has the
        # `<mask>` row (id V) after the teacher's V rows.
        mask_table = ours.embedding.token_embedding.embeddings if part == "decoder" else None
        pairs = [(ours.embedding, theirs.embedding)]
        pairs += list(zip(ours.blocks, theirs.blocks))
        pairs += [(a, b) for a, b in ((ours.final_norm, theirs.final_norm),
                                      (ours.head, theirs.head)) if a is not None]
        for a, b in pairs:
            if b is None or len(a.weights) != len(b.weights):
                raise ValueError(
                    f"Argument `seq2seq` must have the NAT's {part} layout: {a.name} holds "
                    f"{len(a.weights)} variables. Received: "
                    f"{'none' if b is None else len(b.weights)} in the seq2seq's {part}")
            for mine, given in zip(a.weights, b.weights):
                if mine.dtype != given.dtype or "float" not in str(mine.dtype):
                    raise ValueError(
                        f"Argument `seq2seq` must store {mine.path} as {mine.dtype} floats "
                        f"(neither model quantized). Received: {given.path} as {given.dtype}")
                value = keras.ops.convert_to_numpy(given)
                shape = tuple(mine.shape)
                if mine is mask_table and value.shape == (shape[0] - 1,) + shape[1:]:
                    value = np.concatenate([value, keras.ops.convert_to_numpy(mine)[-1:]], 0)
                if value.shape != shape:
                    raise ValueError(
                        f"Argument `seq2seq` must have the NAT's shapes: {mine.path} is "
                        f"{shape}. Received: {given.path} of shape {tuple(given.shape)}")
                assignments.append((mine, value))
    for variable, value in assignments:
        variable.assign(value)
    done = {id(v) for part in ("encoder", "decoder") for v in model.get_layer(part).weights}
    kept = [v.path for v in model.weights if id(v) not in done]
    return {"copied": len(assignments), "kept": kept}


def _has_layers(model, names) -> bool:
    """Whether `model` has a layer of each of `names`."""
    return all(any(layer.name == name for layer in model.layers) for name in names)
