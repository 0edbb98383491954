"""AttentionMask: every way a mask arrives, checked once, kept structured, asked for tiles."""

import numpy as np
import pytest
import reference as ref
from backend_utils import examples, to_np
from hypothesis import given, settings
from hypothesis import strategies as st

from keras_attn import ops as attn_ops
from keras_attn.ops import AttentionMask


@st.composite
def mask_parts(draw):
    batch, query_len, key_len = draw(st.integers(1, 3)), draw(st.integers(1, 8)), draw(
        st.integers(1, 9))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    parts = draw(st.sets(st.sampled_from(
        ["lens", "lens2d", "causal", "window", "dense", "key_mask", "query_mask"])))
    build, spec = {}, {}
    if "lens2d" in parts:
        build["valid_lens"] = spec["lens"] = rng.integers(0, key_len + 1, (batch, query_len))
    elif "lens" in parts:
        build["valid_lens"] = spec["lens"] = rng.integers(0, key_len + 1, (batch,))
    if "causal" in parts:
        build["use_causal_mask"] = spec["causal"] = True
    offset = draw(st.integers(-2, 4))
    build["causal_offset"] = spec["offset"] = offset
    if "window" in parts:
        build["window"] = spec["window"] = draw(st.integers(0, 3))
        build["num_global"] = spec["num_global"] = draw(st.integers(0, 2))
    if "dense" in parts:
        build["attention_mask"] = spec["dense"] = rng.random((batch, query_len, key_len)) < 0.6
    if "key_mask" in parts:
        build["key_mask"] = spec["key_valid"] = rng.random((batch, key_len)) < 0.7
    query_valid = rng.random((batch, query_len)) < 0.7 if "query_mask" in parts else None
    if query_valid is not None:
        build["query_mask"] = query_valid
    return batch, query_len, key_len, build, spec, query_valid


@settings(max_examples=examples(80), deadline=None)
@given(mask_parts(), st.data())
def test_tiles_equal_the_definition_and_key_ranges_hold_every_visible_key(parts, data):
    batch, query_len, key_len, build, spec, query_valid = parts
    mask = AttentionMask.build(query_len, key_len, batch, **build)
    want = ref.combined_mask(batch, query_len, key_len, **spec)  # the keys' rules, queries apart
    block = mask.block()
    got = np.ones_like(want) if block is None else np.broadcast_to(to_np(block) > 0, want.shape)
    np.testing.assert_array_equal(got, want)
    if query_valid is not None:
        np.testing.assert_array_equal(to_np(mask.query_valid) > 0, query_valid)
    # Any tile is the same slice of the whole.
    row_start = data.draw(st.integers(0, query_len - 1))
    rows = data.draw(st.integers(1, query_len - row_start))
    col_start = data.draw(st.integers(0, key_len - 1))
    cols = data.draw(st.integers(1, key_len - col_start))
    tile = mask.block(row_start, rows, col_start, cols)
    piece = want[:, row_start:row_start + rows, col_start:col_start + cols]
    got = np.ones_like(piece) if tile is None else np.broadcast_to(to_np(tile) > 0, piece.shape)
    np.testing.assert_array_equal(got, piece)
    # The key range of those rows covers every key any of them may see.
    first, end = (int(to_np(x)) for x in mask.key_range(row_start, rows))
    visible = np.nonzero(want[:, row_start:row_start + rows].any(axis=(0, 1)))[0]
    if visible.size:
        assert first <= visible.min() and visible.max() < end
    # Keys reported invisible are seen by no query.
    key_visible = mask.key_visible()
    if key_visible is not None:
        hidden = ~(to_np(key_visible) > 0)
        assert not np.any(want & hidden[:, None, :])


def test_padding_hides_the_padded_keys_and_queries():
    mask = AttentionMask.build(5, 6, 2, valid_lens=np.array([6, 3]), use_causal_mask=True,
                               attention_mask=np.ones((2, 5, 6), bool))
    padded = mask.padded(3, 2)  # (8, 8)
    tile = to_np(padded.block()) > 0
    np.testing.assert_array_equal(tile[:, :5, :6], ref.combined_mask(2, 5, 6, np.array([6, 3]), True))
    assert not tile[:, :, 6:].any() and not tile[:, 5:].any()


def test_appended_keys_are_visible_to_every_query():
    mask = AttentionMask.build(4, 5, 2, valid_lens=np.array([5, 0]), use_causal_mask=True,
                               query_mask=np.array([[True] * 4, [True, False, True, True]]))
    appended = mask.append_keys(2)
    tile = to_np(appended.block()) > 0
    assert tile.shape[-1] == 7 and tile[..., 5:].all()
    np.testing.assert_array_equal(tile[..., :5], ref.combined_mask(2, 4, 5, np.array([5, 0]), True))
    assert appended.query_valid is mask.query_valid


def test_compatibility_helpers_agree_with_the_representation():
    lens = np.array([3, 1])
    np.testing.assert_array_equal(to_np(attn_ops.valid_lens_mask(lens, 2, 4)) > 0,
                                  ref.combined_mask(2, 1, 4, lens))
    merged = attn_ops.merge_masks(2, 4, valid_lens=lens, use_causal_mask=True,
                                  query_mask=np.array([[True, False], [True, True]]))
    want = ref.combined_mask(2, 2, 4, lens, True, query_valid=np.array([[True, False], [True, True]]))
    np.testing.assert_array_equal(np.broadcast_to(to_np(merged) > 0, want.shape), want)
    np.testing.assert_array_equal(to_np(attn_ops.causal_mask(3, 5, offset=1)) > 0,
                                  ref.combined_mask(1, 3, 5, causal=True, offset=1)[0])
    band = to_np(attn_ops.local_attention_mask(6, 6, 1, causal=True, num_global=1)) > 0
    np.testing.assert_array_equal(band, ref.combined_mask(1, 6, 6, causal=True, window=1,
                                                num_global=1)[0])


@pytest.mark.parametrize(
    "kwargs,arg,words",
    [({"attention_mask": np.ones((2, 4, 5), "float32")}, "attention_mask", "attention_bias"),
     ({"attention_mask": np.array([[0, 2, 1, 1, 1]] * 4)}, "attention_mask", "0 and 1"),
     ({"attention_mask": np.ones((3, 4, 5), bool)}, "attention_mask", "batch_size"),
     ({"attention_mask": np.ones((2, 3, 5), bool)}, "attention_mask", "query_len"),
     ({"attention_mask": np.ones((5,), bool)}, "attention_mask", "shape"),
     ({"valid_lens": np.array([1, 2, 3])}, "valid_lens", "batch_size"),
     ({"valid_lens": np.array([[1, 2], [3, 4]])}, "valid_lens", "query_len"),
     ({"valid_lens": np.array([-1, 2])}, "valid_lens", r"\[0, key_len=5\]"),
     ({"valid_lens": np.array([6, 2])}, "valid_lens", r"\[0, key_len=5\]"),
     ({"valid_lens": np.array([1.5, 2.0])}, "valid_lens", "integer"),
     ({"query_mask": np.ones((2, 5), bool)}, "query_mask", "query_len"),
     ({"key_mask": np.ones((1, 5), bool)}, "key_mask", "batch_size"),
     ({"key_mask": np.ones((2, 5, 1), bool)}, "key_mask", "shape"),
     ({"window": -1}, "window", "non-negative"),
     ({"num_global": 1.5}, "num_global", "integer"),
     ({"causal_offset": "two"}, "causal_offset", "integer")],
)
def test_bad_masks_name_the_argument_and_what_came_in(kwargs, arg, words):
    with pytest.raises(ValueError, match=f"`{arg}`.*{words}|{words}.*`{arg}`"):
        AttentionMask.build(4, 5, 2, **kwargs)


def test_a_float_mask_is_never_cast_and_the_message_says_how_to_pass_it():
    with pytest.raises(ValueError) as error:
        AttentionMask.build(2, 2, attention_mask=np.zeros((2, 2), "float32"))
    message = str(error.value)
    assert "attention_bias" in message and "mask > 0.5" in message and "True = attend" in message
