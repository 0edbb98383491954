"""Sliding-window multi-head attention in O(n·w): each query sees keys within `window` positions.

The layer is `MultiHead` whose mask carries a window; the `"local"` kernel
(`keras_attn.ops.kernels.local`) computes it blockwise in O(T · window).
"""

from __future__ import annotations

import keras

from keras_attn._checks import check_int
from keras_attn.layers.multi_head import MultiHead


@keras.saving.register_keras_serializable(package="keras_attn")
class LocalMultiHead(MultiHead):
    """Multi-head sliding-window attention: `MultiHead` whose heads see a band of keys.

    Each query attends to keys within `window` positions (with `use_causal_mask=True`, the
    `window` positions before it and itself), plus the first `num_global` global tokens, which
    attend everywhere. With `implementation="local"` (the default) it is computed blockwise in
    O(T·window); `"chunked"` runs the blockwise kernel, which skips the key blocks outside the
    band; `"dense"` applies the band as a `(T, S)` mask.

    A few calls need the `(T, S)` scores and run the dense kernel with the band in the mask
    (same numbers, O(T·S)): an explicit `attention_mask`, per-query `(B, T)` valid_lens,
    `attention_bias`, `return_attention_scores=True`, and the decoding `cache` (a query at
    position `cache_update_index` against the cache).

    Args:
        num_heads: int, number of heads `H`.
        key_dim: int, size of each head for query and key.
        window: int >= 0, half-width of the band.
        num_global: int >= 0, number of leading global tokens. Defaults to `0`.
        value_dim: int, size of each head for value. Defaults to `key_dim`.
        output_dim: int, size of the output. Defaults to the last dimension of the query.
        dropout: float in [0, 1), dropout on the attention weights. Defaults to `0.0`.
        use_bias: bool, whether the four projections have biases. Defaults to `True`.
        kernel_initializer: initializer of the projection kernels. Defaults to
            `"glorot_uniform"`.
        bias_initializer: initializer of the projection biases. Defaults to `"zeros"`.
        seed: optional int seed for the dropout. Defaults to `None`.
        implementation: `"local"`, `"chunked"` or `"dense"`. Defaults to `"local"`.
        chunk_size: optional int, keys per block when chunked. Defaults to `None`.

    Call arguments:
        As `MultiHead`; with the local kernel `key` and `value` have the query's length
        (aligned positions).

    Returns:
        `(B, T, output_dim)`; with a `cache`, `(outputs, cache)`; with
        `return_attention_scores=True`, also the weights `(B, H, T, S)`.

    Example:
    >>> layer = LocalMultiHead(num_heads=4, key_dim=16, window=64)
    >>> layer(keras.ops.ones((2, 8192, 64)), use_causal_mask=True).shape  # (2, 8192, 64)

    References:
        Beltagy et al., 2020, "Longformer: The Long-Document Transformer",
        https://arxiv.org/abs/2004.05150
    """

    implementations = ("local", "chunked", "dense")

    def __init__(
        self,
        num_heads: int,
        key_dim: int,
        window: int,
        num_global: int = 0,
        value_dim: int | None = None,
        output_dim: int | None = None,
        dropout: float = 0.0,
        use_bias: bool = True,
        kernel_initializer="glorot_uniform",
        bias_initializer="zeros",
        seed: int | None = None,
        implementation: str = "local",
        chunk_size: int | None = None,
        **kwargs,
    ):
        for option in ("add_bias_kv", "add_zero_attn", "sliding_window"):
            if kwargs.pop(option, None):
                raise ValueError(
                    f"Argument `{option}` is not supported by LocalMultiHead (an appended key "
                    "has no position in the window; the window is `window`). Received: "
                    f"{option}=True"
                )
        super().__init__(
            num_heads=num_heads,
            key_dim=key_dim,
            value_dim=value_dim,
            output_dim=output_dim,
            dropout=dropout,
            use_bias=use_bias,
            kernel_initializer=kernel_initializer,
            bias_initializer=bias_initializer,
            seed=seed,
            implementation=implementation,
            chunk_size=chunk_size,
            **kwargs,
        )
        check_int("window", window, 0)
        check_int("num_global", num_global, 0)
        self.window = window
        self.num_global = num_global

    def _window(self) -> dict:
        return {"window": self.window, "num_global": self.num_global}

    def get_config(self):
        config = super().get_config()
        for name in ("add_bias_kv", "add_zero_attn", "sliding_window"):  # never set here
            config.pop(name)
        config.update({"window": self.window, "num_global": self.num_global})
        return config
