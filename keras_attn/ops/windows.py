"""The grid operations of window attention (Swin, Liu et al., 2021), on `(B, H, W, C)` token
grids of static size: the cyclic shift, the split into `M × M` windows and back, the relative
position index of a window's bias table, and the mask of a shifted grid's windows."""

from __future__ import annotations

import numpy as np
from keras import ops


def cyclic_shift(x, shift: int, height: int, width: int):
    """`keras.ops.roll(x, (shift, shift), axis=(1, 2))` on a `(B, H, W, C)` grid of static
    size, as two gathers at fixed indices: LiteRT has no builtin roll (its converter falls back
    to the Flex delegate, `FlexRoll`)."""
    rows = (np.arange(height) - shift) % height  # out[i] = x[(i - shift) mod H]
    cols = (np.arange(width) - shift) % width
    return ops.take(ops.take(x, rows, axis=1), cols, axis=2)  # (B, H, W, C)


def window_partition(x, window_size: int):
    """`(B, H, W, C)` -> `(B · nW, M², C)`, windows in row-major order, batch-major."""
    _, height, width, channels = ops.shape(x)
    m = window_size
    x = ops.reshape(x, (-1, height // m, m, width // m, m, channels))  # (B, H/M, M, W/M, M, C)
    x = ops.transpose(x, (0, 1, 3, 2, 4, 5))  # (B, H/M, W/M, M, M, C)
    return ops.reshape(x, (-1, m * m, channels))  # (B · nW, M², C)


def window_reverse(windows, window_size: int, height: int, width: int):
    """`(B · nW, M², C)` -> `(B, H, W, C)`, the inverse of `window_partition`."""
    m = window_size
    channels = ops.shape(windows)[-1]
    x = ops.reshape(windows, (-1, height // m, width // m, m, m, channels))
    x = ops.transpose(x, (0, 1, 3, 2, 4, 5))  # (B, H/M, M, W/M, M, C)
    return ops.reshape(x, (-1, height, width, channels))  # (B, H, W, C)


def relative_position_index(window_size: int) -> np.ndarray:
    """`(M², M²)` index into the `(2M - 1)²` bias table: the relative offset `(dy, dx)` of two
    tokens of a window, each shifted to `[0, 2M - 2]`, flattened row-major."""
    m = window_size
    coords = np.stack(np.meshgrid(np.arange(m), np.arange(m), indexing="ij")).reshape(2, -1)
    relative = coords[:, :, None] - coords[:, None, :] + (m - 1)  # (2, M², M²)
    return relative[0] * (2 * m - 1) + relative[1]


def shifted_window_mask(height: int, width: int, window_size: int, shift_size: int) -> np.ndarray:
    """`(nW, M², M²)` boolean mask (True = attend) of the windows of a grid shifted by
    `-shift_size`: a token attends to another of its window only if both come from the same
    region of the unshifted grid (no wrap-around neighbours)."""
    labels = np.zeros((height, width), np.int32)
    if shift_size:
        m, s = window_size, shift_size
        regions = (slice(0, -m), slice(-m, -s), slice(-s, None))
        for i, rows in enumerate(regions):
            for j, cols in enumerate(regions):
                labels[rows, cols] = 3 * i + j
    windows = labels.reshape(height // window_size, window_size, width // window_size,
                             window_size)
    windows = windows.transpose(0, 2, 1, 3).reshape(-1, window_size * window_size)  # (nW, M²)
    return windows[:, :, None] == windows[:, None, :]
