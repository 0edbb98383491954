"""Swin Transformer pieces: (shifted) window attention over a 2D token grid (Liu et al., 2021).

Tokens live on a `(B, H, W, C)` grid. `WindowAttention` is multi-head self-attention inside
non-overlapping `M × M` windows with a learned relative position bias; `SwinBlock` wraps it
pre-LN with an MLP and, when `shift_size > 0`, cyclically shifts the grid by `shift_size` first
(so windows straddle the previous block's window borders) with a mask that keeps the tokens that
wrapped around apart. `PatchEmbedding` and `PatchMerging` build and downsample the grid. The grid operations
(shift, windows, their mask and bias index) are `keras_attn.ops.windows`.
"""

from __future__ import annotations

import keras
from keras import ops

from keras_attn import ops as attn_ops
from keras_attn.layers import legacy
from keras_attn.layers.activations import gelu_erf
from keras_attn.layers.base import BaseAttention, check_positive_int, check_rate
from keras_attn.layers.ffn import FFN
from keras_attn.layers.initializers import sublayer_initializer
from keras_attn.layers.quantization import QuantizedSublayers
from keras_attn.ops.dispatch import weights_request
from keras_attn.ops.windows import (
    cyclic_shift,
    relative_position_index,
    shifted_window_mask,
    window_partition,
    window_reverse,
)


@keras.saving.register_keras_serializable(package="keras_attn")
class WindowAttention(QuantizedSublayers, BaseAttention):
    """Multi-head self-attention inside one `M × M` window, with relative position bias.

    `softmax(Q Kᵀ / √d + B) V` per head, where `B[i, j] = table[index(i, j), head]` and the
    learned table holds one value per relative offset `(dy, dx) ∈ [-(M-1), M-1]²` and head.
    Inputs are windows already flattened to `M²` tokens (see `window_partition`).

    Args:
        num_heads: int, number of heads `H`.
        window_size: int, window side `M`; inputs have `M²` tokens.
        key_dim: int, size of each head. Defaults to `channels // num_heads`.
        use_bias: bool, whether the projections have biases. Defaults to `True`.
        dropout: float in [0, 1), dropout on the attention weights. Defaults to `0.0`.
        kernel_initializer: initializer of the projection kernels. Defaults to
            `"glorot_uniform"`.
        seed: optional int seed for the dropout. Defaults to `None`.

    Call arguments:
        query: `(B · nW, M², C)`.
        key, value: default to `query` (self-attention); must also have `M²` tokens.
        attention_mask: optional boolean `(B · nW, M², M²)`, e.g. the shifted-window mask.
        valid_lens, use_causal_mask, return_attention_scores, training: as in every keras_attn
            attention layer.

    Returns:
        `(B · nW, M², C)`; with `return_attention_scores=True`, also the weights
        `(B · nW, H, M², M²)`.

    Example:
    >>> windows = keras.ops.ones((8, 16, 32))  # 8 windows of 4 × 4 tokens
    >>> WindowAttention(num_heads=4, window_size=4)(windows).shape  # (8, 16, 32)

    References:
        Liu et al., 2021, "Swin Transformer: Hierarchical Vision Transformer using Shifted
        Windows", https://arxiv.org/abs/2103.14030
    """

    def __init__(
        self,
        num_heads: int,
        window_size: int,
        key_dim: int | None = None,
        use_bias: bool = True,
        dropout: float = 0.0,
        kernel_initializer="glorot_uniform",
        seed: int | None = None,
        **kwargs,
    ):
        super().__init__(dropout=dropout, seed=seed, **kwargs)
        check_positive_int("num_heads", num_heads)
        check_positive_int("window_size", window_size)
        check_positive_int("key_dim", key_dim, allow_none=True)
        if not isinstance(use_bias, bool):
            raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
                "Received an invalid value for argument `use_bias`, expected a bool. "
                f"Received: use_bias={use_bias!r}"
            )
        self.num_heads = num_heads
        self.window_size = window_size
        self.key_dim = key_dim
        self.use_bias = use_bias
        self.kernel_initializer = keras.initializers.get(kernel_initializer)
        self.index = relative_position_index(window_size).reshape(-1)  # (M⁴,) constant

    def build(self, query_shape, key_shape=None, value_shape=None):
        key_shape = query_shape if key_shape is None else key_shape
        value_shape = key_shape if value_shape is None else value_shape
        self.check_inputs(query_shape, key_shape, value_shape)
        tokens = self.window_size**2
        for name, shape in (("query", query_shape), ("key", key_shape), ("value", value_shape)):
            if len(shape) != 3 or shape[-1] is None or shape[1] not in (None, tokens):
                raise ValueError(
                    f"Argument `{name}` must have shape (num_windows, window_size**2={tokens}, "
                    f"channels). Received: {name}.shape={tuple(shape)}"
                )
        channels = query_shape[-1]
        if self.key_dim is None and channels % self.num_heads:
            raise ValueError(
                f"Argument `num_heads` must divide the channels ({channels}) when `key_dim` is "
                f"None. Received: num_heads={self.num_heads}"
            )
        self.head_dim = self.key_dim or channels // self.num_heads
        width = self.num_heads * self.head_dim

        def dense(units, name):  # each projection draws its own kernel
            return keras.layers.Dense(
                units, use_bias=self.use_bias, name=name, dtype=self.dtype_policy,
                kernel_initializer=sublayer_initializer(self.kernel_initializer, name))

        self.query_dense = dense(width, "query_dense")
        self.key_dense = dense(width, "key_dense")
        self.value_dense = dense(width, "value_dense")
        self.output_dense = dense(channels, "output_dense")
        self.query_dense.build(query_shape)
        self.key_dense.build(key_shape)
        self.value_dense.build(value_shape)
        self.output_dense.build(tuple(query_shape[:-1]) + (width,))
        self.relative_position_bias_table = self.add_weight(
            name="relative_position_bias_table",
            shape=((2 * self.window_size - 1) ** 2, self.num_heads),
            initializer=keras.initializers.TruncatedNormal(stddev=0.02),
        )

    def relative_position_bias(self):
        """The `(H, M², M²)` bias added to every window's scores."""
        tokens = self.window_size**2
        bias = ops.take(self.relative_position_bias_table, self.index, axis=0)  # (M⁴, H)
        return ops.transpose(ops.reshape(bias, (tokens, tokens, self.num_heads)), (2, 0, 1))

    def attend(self, query, key, value, mask, training, need_weights=True):
        q = attn_ops.split_heads(self.query_dense(query), self.num_heads)  # (B · nW, H, M², d)
        k = attn_ops.split_heads(self.key_dense(key), self.num_heads)
        v = attn_ops.split_heads(self.value_dense(value), self.num_heads)
        context, weights = attn_ops.dot_product_attention(
            q, k, v, mask, dropout_rate=self.dropout, training=bool(training),
            seed=self.seed_generator, bias=self.relative_position_bias()[None],
            return_weights=weights_request(need_weights, training),
        )  # (B · nW, H, M², d), (B · nW, H, M², M²)
        return self.output_dense(attn_ops.merge_heads(context)), weights

    def weights_shape(self, query_shape, key_shape) -> tuple:
        return (query_shape[0], self.num_heads, query_shape[1], key_shape[1])

    def compute_output_shape(self, query_shape, key_shape=None, value_shape=None):
        return tuple(query_shape)

    def get_config(self):
        config = super().get_config()
        config["dtype"] = self.dtype_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "window_size": self.window_size,
                "key_dim": self.key_dim,
                "use_bias": self.use_bias,
                "kernel_initializer": keras.initializers.serialize(self.kernel_initializer),
            }
        )
        return config


def _check_grid(name: str, shape, divisor: int, divisor_name: str) -> None:
    if len(shape) != 4 or None in shape[1:]:
        raise ValueError(
            f"Argument `{name}` must have shape (batch_size, height, width, channels) with known "
            f"height, width and channels. Received: {name}.shape={tuple(shape)}"
        )
    if shape[1] % divisor or shape[2] % divisor:
        raise ValueError(
            f"Argument `{name}` must have height and width divisible by {divisor_name}="
            f"{divisor}. Received: {name}.shape={tuple(shape)}"
        )


@keras.saving.register_keras_serializable(package="keras_attn")
class SwinBlock(QuantizedSublayers, keras.layers.Layer):
    """One Swin Transformer block: (shifted) window attention and an MLP, pre-LN.

    `h = x + R⁻¹(WindowAttention(R(LayerNorm(x)), mask))`, `y = h + MLP(LayerNorm(h))`, where
    `R` cyclically shifts the grid by `-shift_size` (`keras.ops.roll`) and cuts it into windows.
    With `shift_size > 0` the mask of `shifted_window_mask` keeps tokens that wrapped around
    apart. Alternate `shift_size=0` and `window_size // 2` in consecutive blocks.

    Args:
        num_heads: int, number of attention heads.
        window_size: int, window side `M`; height and width must be multiples of it.
        shift_size: int in `[0, window_size)`, the cyclic shift. Defaults to `0`.
        mlp_ratio: float, MLP hidden size over channels. Defaults to `4.0`.
        dropout: float in [0, 1), dropout on the attention weights and the MLP hidden layer.
            Defaults to `0.0`.
        epsilon: float, LayerNorm epsilon. Defaults to `1e-5`.
        seed: optional int seed for the dropouts. Defaults to `None`.

    Call arguments:
        inputs: `(B, H, W, C)` token grid.
        training: bool, whether dropout is active.
        return_attention_scores: bool, also return the attention weights.

    Returns:
        `(B, H, W, C)`; with `return_attention_scores=True`, also the weights
        `(B, nW, num_heads, M², M²)` of the (shifted) windows in row-major order.

    Example:
    >>> block = SwinBlock(num_heads=2, window_size=4, shift_size=2)
    >>> block(keras.ops.ones((2, 8, 8, 32))).shape  # (2, 8, 8, 32)

    References:
        Liu et al., 2021, "Swin Transformer: Hierarchical Vision Transformer using Shifted
        Windows", https://arxiv.org/abs/2103.14030
    """

    def __init__(
        self,
        num_heads: int,
        window_size: int,
        shift_size: int = 0,
        mlp_ratio: float = 4.0,
        dropout: float = 0.0,
        epsilon: float = 1e-5,
        seed: int | None = None,
        **kwargs,
    ):
        super().__init__(**kwargs)
        check_positive_int("num_heads", num_heads)
        check_positive_int("window_size", window_size)
        if (isinstance(shift_size, bool) or not isinstance(shift_size, int)
                or not 0 <= shift_size < window_size):
            raise ValueError(
                "Received an invalid value for argument `shift_size`, expected an integer in "
                f"[0, window_size={window_size}). Received: shift_size={shift_size!r}"
            )
        for name, value in (("mlp_ratio", mlp_ratio), ("epsilon", epsilon)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ValueError(
                    f"Received an invalid value for argument `{name}`, expected a positive "
                    f"float. Received: {name}={value!r}"
                )
        check_rate("dropout", dropout)
        self.num_heads = num_heads
        self.window_size = window_size
        self.shift_size = shift_size
        self.mlp_ratio = mlp_ratio
        self.dropout = dropout
        self.epsilon = epsilon
        self.seed = seed

    def build(self, input_shape):
        _check_grid("inputs", input_shape, self.window_size, "window_size")
        _, self.height, self.width, channels = input_shape
        if channels % self.num_heads:
            raise ValueError(
                f"Argument `num_heads` must divide the channels ({channels}). "
                f"Received: num_heads={self.num_heads}"
            )
        windows_shape = (None, self.window_size**2, channels)
        self.norm1 = keras.layers.LayerNormalization(epsilon=self.epsilon, name="norm1",
                                                     dtype=self.dtype_policy)
        self.attention = WindowAttention(self.num_heads, self.window_size, dropout=self.dropout,
                                         seed=self.seed, name="attention",
                                         dtype=self.dtype_policy)
        self.norm2 = keras.layers.LayerNormalization(epsilon=self.epsilon, name="norm2",
                                                     dtype=self.dtype_policy)
        self.mlp = FFN(max(1, round(channels * self.mlp_ratio)), activation=gelu_erf,
                       dropout=self.dropout, seed=self.seed, name="mlp", dtype=self.dtype_policy)
        self.norm1.build(input_shape)
        self.attention.build(windows_shape)
        self.norm2.build(input_shape)
        self.mlp.build(input_shape)

    def call(self, inputs, training=None, return_attention_scores=False):
        s, m = self.shift_size, self.window_size
        h = self.norm1(inputs)
        if s:
            h = cyclic_shift(h, -s, self.height, self.width)  # (B, H, W, C)
        windows = window_partition(h, m)  # (B · nW, M², C)
        mask = None
        if s:
            mask = ops.convert_to_tensor(shifted_window_mask(self.height, self.width, m, s))
            mask = ops.tile(mask, (ops.shape(inputs)[0], 1, 1))  # (B · nW, M², M²)
        h = self.attention(windows, attention_mask=mask, training=training,
                           return_attention_scores=return_attention_scores)
        h, weights = h if return_attention_scores else (h, None)  # weights only when asked
        h = window_reverse(h, m, self.height, self.width)  # (B, H, W, C)
        if s:
            h = cyclic_shift(h, s, self.height, self.width)
        x = inputs + h
        outputs = x + self.mlp(self.norm2(x), training=training)  # (B, H, W, C)
        if not return_attention_scores:
            return outputs
        num_windows = (self.height // m) * (self.width // m)
        weights = ops.reshape(weights, (-1, num_windows, self.num_heads, m * m, m * m))
        return outputs, weights

    def compute_output_shape(self, input_shape):
        return tuple(input_shape)

    def get_config(self):
        config = super().get_config()
        config["dtype"] = self.dtype_config()
        config.update(
            {
                "num_heads": self.num_heads,
                "window_size": self.window_size,
                "shift_size": self.shift_size,
                "mlp_ratio": self.mlp_ratio,
                "dropout": self.dropout,
                "epsilon": self.epsilon,
                "seed": self.seed,
            }
        )
        return config


@keras.saving.register_keras_serializable(package="keras_attn")
class PatchEmbedding(QuantizedSublayers, keras.layers.Layer):
    """Cuts an image into `p × p` patches and embeds each linearly: a grid of tokens.

    A `Conv2D` with kernel and stride `p` (one dense map per patch), then LayerNorm.

    Args:
        patch_size: int, patch side `p`; image height and width must be multiples of it.
        hidden_dim: int, size of each token `C`.
        use_norm: bool, LayerNorm after the projection. Defaults to `True`.
        layer_norm_epsilon: float, LayerNorm epsilon. Defaults to `1e-5`.

    Call arguments:
        inputs: `(B, H, W, channels)` images.

    Returns:
        `(B, H / p, W / p, hidden_dim)`.

    Example:
    >>> PatchEmbedding(patch_size=2, hidden_dim=32)(keras.ops.ones((4, 8, 8, 1))).shape
    (4, 4, 4, 32)

    References:
        Dosovitskiy et al., 2020, "An Image is Worth 16x16 Words",
        https://arxiv.org/abs/2010.11929
    """

    @legacy.records_given
    def __init__(self, patch_size: int, hidden_dim: int | None = None, use_norm: bool = True,
                 layer_norm_epsilon: float = 1e-5, **kwargs):
        renamed = legacy.rename(kwargs, "PatchEmbedding", {
            "embed_dim": "hidden_dim", "epsilon": "layer_norm_epsilon"},
            warn=not kwargs.pop("_loading", False), said=legacy.said(
                PatchEmbedding.__init__, hidden_dim=hidden_dim,
                layer_norm_epsilon=layer_norm_epsilon))
        hidden_dim = renamed.get("hidden_dim", hidden_dim)
        layer_norm_epsilon = renamed.get("layer_norm_epsilon", layer_norm_epsilon)
        super().__init__(**kwargs)
        check_positive_int("patch_size", patch_size)
        check_positive_int("hidden_dim", hidden_dim)
        if not isinstance(use_norm, bool):
            raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
                "Received an invalid value for argument `use_norm`, expected a bool. "
                f"Received: use_norm={use_norm!r}"
            )
        self.patch_size = patch_size
        self.hidden_dim = hidden_dim
        self.use_norm = use_norm
        self.layer_norm_epsilon = layer_norm_epsilon

    def build(self, input_shape):
        _check_grid("inputs", input_shape, self.patch_size, "patch_size")
        self.projection = keras.layers.Conv2D(self.hidden_dim, self.patch_size,
                                              strides=self.patch_size, name="projection",
                                              dtype=self.dtype_policy)
        self.projection.build(input_shape)
        if self.use_norm:
            self.norm = keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon,
                                                        name="norm",
                                                        dtype=self.dtype_policy)
            self.norm.build(self.compute_output_shape(input_shape))

    def call(self, inputs):
        tokens = self.projection(inputs)  # (B, H/p, W/p, C)
        return self.norm(tokens) if self.use_norm else tokens

    def compute_output_shape(self, input_shape):
        p = self.patch_size
        return (input_shape[0], input_shape[1] // p, input_shape[2] // p, self.hidden_dim)

    def get_config(self):
        config = super().get_config()
        config["dtype"] = self.dtype_config()
        config.update({"patch_size": self.patch_size, "hidden_dim": self.hidden_dim,
                       "use_norm": self.use_norm, "layer_norm_epsilon": self.layer_norm_epsilon})
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config, _loading=True)  # keras_attn 0.2's names load without a warning


@keras.saving.register_keras_serializable(package="keras_attn")
class PatchMerging(QuantizedSublayers, keras.layers.Layer):
    """Halves the grid: concatenates each 2 × 2 group of tokens, LayerNorm, linear map.

    The four tokens of a group are concatenated in the order (0, 0), (1, 0), (0, 1), (1, 1)
    (row, column offsets), as in the reference implementation, giving `4C` features, mapped to
    `output_dim` without bias.

    Args:
        output_dim: int, size of the merged tokens. Defaults to `2 * channels`.
        epsilon: float, LayerNorm epsilon. Defaults to `1e-5`.

    Call arguments:
        inputs: `(B, H, W, C)` with even `H` and `W`.

    Returns:
        `(B, H / 2, W / 2, output_dim)`.

    Example:
    >>> PatchMerging()(keras.ops.ones((4, 8, 8, 32))).shape  # (4, 4, 4, 64)

    References:
        Liu et al., 2021, "Swin Transformer: Hierarchical Vision Transformer using Shifted
        Windows", https://arxiv.org/abs/2103.14030
    """

    def __init__(self, output_dim: int | None = None, epsilon: float = 1e-5, **kwargs):
        super().__init__(**kwargs)
        check_positive_int("output_dim", output_dim, allow_none=True)
        self.output_dim = output_dim
        self.epsilon = epsilon

    def build(self, input_shape):
        _check_grid("inputs", input_shape, 2, "2")
        merged = tuple(input_shape[:1]) + (input_shape[1] // 2, input_shape[2] // 2,
                                           4 * input_shape[3])
        self.norm = keras.layers.LayerNormalization(epsilon=self.epsilon, name="norm",
                                                    dtype=self.dtype_policy)
        self.reduction = keras.layers.Dense(self.output_dim or 2 * input_shape[3],
                                            use_bias=False, name="reduction",
                                            dtype=self.dtype_policy)
        self.norm.build(merged)
        self.reduction.build(merged)

    def call(self, inputs):
        groups = [inputs[:, 0::2, 0::2], inputs[:, 1::2, 0::2], inputs[:, 0::2, 1::2],
                  inputs[:, 1::2, 1::2]]  # 4 x (B, H/2, W/2, C)
        return self.reduction(self.norm(ops.concatenate(groups, axis=-1)))  # (B, H/2, W/2, ·)

    def compute_output_shape(self, input_shape):
        return (input_shape[0], input_shape[1] // 2, input_shape[2] // 2,
                self.output_dim or 2 * input_shape[3])

    def get_config(self):
        config = super().get_config()
        config["dtype"] = self.dtype_config()
        config.update({"output_dim": self.output_dim, "epsilon": self.epsilon})
        return config
