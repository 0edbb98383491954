"""Sliding-window multi-head attention in O(T · w): each query sees the keys near it.

The layer is `MultiHead` with a `sliding_window` and the `"local"` kernel
(`keras_attn.ops.kernels.local`), which computes the band blockwise in O(T · window), plus
global tokens.
"""

from __future__ import annotations

import keras

from keras_attn._checks import as_int, check_one_of, warn_deprecated
from keras_attn.layers.config import AttentionConfig
from keras_attn.layers.multi_head import MultiHead


@keras.saving.register_keras_serializable(package="keras_attn")
class LocalMultiHead(MultiHead):
    """Multi-head sliding-window attention: `MultiHead` whose heads see a band of keys.

    The query at position p sees the keys j with |p - j| < `sliding_window` (with
    `use_causal_mask=True`, the `sliding_window` keys p - sliding_window + 1 … p: Keras' and
    Hugging Face Mistral's meaning), plus the first `num_global` global tokens, which attend
    everywhere. With `implementation="local"` (the default) it is computed blockwise in
    O(T · window); `"chunked"` runs the blockwise kernel, which skips the key blocks outside
    the band; `"dense"` applies the band as a `(T, S)` mask.

    Calls that need the `(T, S)` scores run the dense kernel with the band in the mask (same
    numbers, O(T · S); `keras_attn.ops.kernel_for`): an explicit `attention_mask`, per-query
    `(B, T)` valid_lens, `attention_bias`, `return_attention_scores=True`, and the decoding
    `cache`.

    Args:
        num_heads: int, number of heads `H`.
        key_dim: int, size of each head for query and key.
        sliding_window: int >= 1, the width `w` above (keyword-only, as every argument after
            `key_dim`). Required (or the deprecated `window`).
        num_global: int >= 0, number of leading global tokens. Defaults to `0`.
        implementation: `"local"`, `"chunked"` or `"dense"`. Defaults to `"local"` (unless
            an `attention` configuration names another).
        window: deprecated, `window=d` is `sliding_window=d + 1` (|p - j| <= d), the spelling
            of earlier releases; their `.keras` files load.
        **kwargs: the other `MultiHead` arguments (`value_dim`, `output_dim`, `dropout`,
            `use_bias`, initializers, `seed`, `chunk_size`, `num_key_value_heads`,
            `position_encoding`, ...), except `add_bias_kv` and `add_zero_attn` (an appended
            key has no place in the window).

    Call arguments:
        As `MultiHead`; with the local kernel `key` and `value` have the query's length
        (aligned positions).

    Returns:
        `(B, T, output_dim)`; with a `cache`, `(outputs, cache)`; with
        `return_attention_scores=True`, also the weights `(B, H, T, S)`.

    Example:
    >>> layer = LocalMultiHead(num_heads=4, key_dim=16, sliding_window=65)
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
        *,
        sliding_window: int | None = None,
        num_global: int = 0,
        implementation: str | None = None,
        window: int | None = None,
        **kwargs,
    ):
        if window is not None:
            window = as_int("window", window, 0)
            if sliding_window is not None and sliding_window != window + 1:
                raise ValueError(
                    "Arguments `window` (deprecated, |p - j| <= window) and `sliding_window` "
                    "(|p - j| < sliding_window) disagree; give `sliding_window`. Received: "
                    f"window={window}, sliding_window={sliding_window}"
                )
            warn_deprecated(
                "LocalMultiHead(window=d) is deprecated: use sliding_window=d + 1 (the query "
                "at p sees keys j with |p - j| < sliding_window, as in Keras).")
            sliding_window = window + 1
        attention = kwargs.get("attention")
        attention = None if attention is None else AttentionConfig.coerce(attention)
        if implementation is None and (attention is None or attention.implementation == "auto"):
            implementation = "local"  # the default here (a configuration's "auto" is unsaid)
        if sliding_window is None and (attention is None or attention.sliding_window is None):
            raise ValueError(
                "Argument `sliding_window` is required: the query at position p sees the keys "
                "j with |p - j| < sliding_window. Received: sliding_window=None"
            )
        super().__init__(num_heads=num_heads, key_dim=key_dim, sliding_window=sliding_window,
                         implementation=implementation, **kwargs)
        self.num_global = as_int("num_global", num_global, 0)

    def check_implementation(self, config: AttentionConfig) -> None:
        check_one_of("implementation", config.implementation, self.implementations)
        for option in ("add_bias_kv", "add_zero_attn"):
            if getattr(config, option):
                raise ValueError(
                    f"Argument `{option}` is not supported by LocalMultiHead (an appended key "
                    f"has no position in the window). Received: {option}=True"
                )

    def _window(self) -> dict:
        return {"window": self.sliding_window - 1, "num_global": self.num_global}

    @property
    def window(self) -> int:
        """Deprecated: `sliding_window - 1`, the band's half-width (|p - j| <= window)."""
        return self.sliding_window - 1

    def get_config(self):
        config = super().get_config()
        # Said explicitly: this layer's default kernel is "local", the configuration's "dense".
        config["attention"].pop("implementation", None)
        config["implementation"] = self.implementation
        config["num_global"] = self.num_global
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        window = config.pop("window", None)  # keras_attn 0.1's: loads without a warning
        if window is not None:
            config["sliding_window"] = as_int("window", window, 0) + 1
        return super().from_config(config)
