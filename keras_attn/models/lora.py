"""Low-rank adaptation (LoRA) of a whole model's attention projections, as keras-hub's
`Backbone.enable_lora(rank)` offers it: every weight frozen, then the query and value
projections of every attention layer given a trainable low-rank update.

A LoRA projection computes `y = x (W + (alpha / rank) · A B) + b` with `W` and `b` frozen and
only `A` `(d_in, rank)` and `B` `(rank, d_out)` trained (`B` starts at zero, so the model's
outputs do not change when LoRA is enabled). The update is Keras' own
(`keras.layers.Dense.enable_lora`, also on int8-quantized kernels: QLoRA).

Saved as `.keras`, a projection's file holds its merged kernel `W + (alpha / rank) · A B`
(Keras' `Dense.save_own_variables`): the loaded model gives the same outputs as an ordinary
model, without separate LoRA weights; `enable_lora` on it starts a new adaptation from there.
"""

from __future__ import annotations

from collections.abc import Iterable

import keras

from keras_attn._checks import check_int, check_number

DEFAULT_TARGETS = ("query", "value")


def _is_target(layer, target_names: tuple[str, ...]) -> bool:
    """`layer` is a `Dense`/`EinsumDense` named `name` or `name + "_dense"` (keras_attn's
    `MultiHead` names its projections `query_dense`, `key_dense`, ...; keras-hub names some
    `query`, `value`)."""
    if not isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense)):
        return False
    return any(layer.name in (name, f"{name}_dense") for name in target_names)


def _check_targets(target_names) -> tuple[str, ...]:
    if isinstance(target_names, str):
        target_names = (target_names,)
    if (not isinstance(target_names, Iterable) or isinstance(target_names, (bytes, dict))):
        target_names = None
    else:
        target_names = tuple(target_names)
    if not target_names or not all(isinstance(name, str) and name for name in target_names):
        raise ValueError(
            "Received an invalid value for argument `target_names`, expected a non-empty "
            "collection of layer names (e.g. (\"query\", \"value\")). Received: "
            f"target_names={target_names!r}"
        )
    return target_names


def enable_lora(model: keras.Layer, rank: int, target_names=DEFAULT_TARGETS,
                alpha: float | None = None) -> list[str]:
    """Freeze `model` and give its attention projections trainable low-rank updates (LoRA).

    Every weight of `model` becomes non-trainable; then each `Dense` or `EinsumDense` sublayer
    named in `target_names` (`"query"` matches `MultiHead`'s `query_dense`) gets Keras' LoRA
    kernels `A` `(d_in, rank)` and `B` `(rank, d_out)`, the only trainable weights (the
    projection's kernel and bias stay frozen). Compile the model after this call (the
    optimizer must see the new trainable weights). Calling it twice on one model is refused.

    Args:
        model: a built Keras model or layer, e.g. from `keras_attn.models.causal_lm`.
        rank: int > 0, the rank of the update.
        target_names: str or collection of str, the projections to adapt: names of sublayers
            (with or without the `_dense` suffix). Defaults to `("query", "value")`, as
            keras-hub's `Backbone.enable_lora`.
        alpha: optional float > 0, the update is scaled by `alpha / rank`. Defaults to `None`
            (`rank`: a scale of 1).

    Returns:
        The paths of the adapted layers, e.g. `["decoder/block_0/self_attention/query_dense",
        ...]`.

    Example:
    >>> model = keras_attn.models.causal_lm(1000, num_layers=2, hidden_dim=64, num_heads=4)
    >>> keras_attn.models.enable_lora(model, rank=4)[:1]
    ['decoder/block_0/self_attention/query_dense']
    >>> model.compile("adam", keras_attn.metrics.MaskedSequenceLoss())
    >>> model.fit(x, y)  # trains 2 layers x 2 projections x (A, B) only

    References:
        Hu et al., 2021, "LoRA: Low-Rank Adaptation of Large Language Models",
        https://arxiv.org/abs/2106.09685
    """
    if not isinstance(model, keras.Layer):
        raise ValueError(  # noqa: TRY004 (the project raises ValueError for bad arguments)
            "Received an invalid value for argument `model`, expected a Keras model or layer. "
            f"Received: model={type(model).__name__}"
        )
    check_int("rank", rank, 1)
    if alpha is not None:
        check_number("alpha", alpha, 0, strict=True)
    target_names = _check_targets(target_names)
    if not model.built:
        raise ValueError(
            f"Argument `model` must be built before `enable_lora` (call it once on inputs). "
            f"Received: model={model.name!r} (not built)"
        )
    sublayers = list(model._flatten_layers(include_self=False))
    targets = [layer for layer in sublayers if _is_target(layer, target_names)]
    if not targets:
        names = sorted({layer.name for layer in sublayers
                        if isinstance(layer, (keras.layers.Dense, keras.layers.EinsumDense))})
        raise ValueError(
            "Argument `target_names` names no Dense or EinsumDense layer of the model (its "
            f"projections: {names[:12]}{' ...' if len(names) > 12 else ''}). Received: "
            f"target_names={target_names!r}"
        )
    enabled = [layer.path for layer in targets if layer.lora_enabled]
    if enabled:
        raise ValueError(
            "Argument `model` already has LoRA enabled (a layer's LoRA is enabled once); "
            f"enable it on a fresh model or a loaded copy. Received: LoRA layers {enabled[:4]}"
        )
    model.trainable = True
    for layer in sublayers:
        layer.trainable = False
    for layer in targets:
        layer.trainable = True
        layer.enable_lora(int(rank), lora_alpha=None if alpha is None else float(alpha))
        if layer.bias is not None:
            layer.bias.trainable = False
    return sorted(layer.path for layer in targets)
