"""Transformer blocks, stacks and the seq2seq model: NumPy references, masks, cache, training."""


import functools

import keras
import numpy as np
import pytest
import reference as ref
from backend_utils import (
    assert_allclose,
    assert_array_equal,
    dtype_of,
    randomize,
    to_np,
)
from layer_test_utils import run_layer_test

from keras_attn import decoding
from keras_attn.layers import (
    AttentionConfig,
    BlockConfig,
    TransformerDecoderBlock,
    TransformerEncoderBlock,
)
from keras_attn.metrics import MaskedAccuracy, masked_sparse_categorical_crossentropy
from keras_attn.models import (
    TransformerDecoder,
    TransformerEncoder,
    transformer_seq2seq,
)

NORMS = [pytest.param(False, id="post_ln"), pytest.param(True, id="pre_ln")]


def small_model(normalize_first=False, num_layers=2, vocab=19, **kwargs):
    model = transformer_seq2seq(
        vocab, vocab + 3, num_layers=num_layers, hidden_dim=16, num_heads=4,
        intermediate_dim=32, dropout=0.0, normalize_first=normalize_first, **kwargs,
    )
    randomize(model)
    return model


# ---- NumPy references written from the formulas ------------------------------------------


np_layer_norm = functools.partial(ref.layer_norm, epsilon=1e-5)  # the blocks' epsilon


def np_softmax_masked(scores, mask):
    scores = np.where(mask, scores, -np.inf)
    row_max = np.max(scores, -1, keepdims=True)
    row_max = np.where(np.isfinite(row_max), row_max, 0.0)
    e = np.where(mask, np.exp(scores - row_max), 0.0)
    total = e.sum(-1, keepdims=True)
    return np.where(total > 0, e / np.where(total > 0, total, 1.0), 0.0)


def np_mha(mha, query, key, mask, num_heads):
    """Multi-head attention from its dense weights; mask (B, T, S), True = attend."""
    w = {d: [to_np(v) for v in getattr(mha, d).weights]
         for d in ("query_dense", "key_dense", "value_dense", "output_dense")}

    def heads(x, dense):
        kernel, bias = w[dense]
        y = x @ kernel + bias  # (B, T, H * dh)
        b, t, _ = y.shape
        return y.reshape(b, t, num_heads, -1).transpose(0, 2, 1, 3)  # (B, H, T, dh)

    q, k, v = heads(query, "query_dense"), heads(key, "key_dense"), heads(key, "value_dense")
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(q.shape[-1])  # (B, H, T, S)
    weights = np_softmax_masked(scores, mask[:, None])
    context = (weights @ v).transpose(0, 2, 1, 3)  # (B, T, H, dh)
    context = context.reshape(context.shape[0], context.shape[1], -1)
    kernel, bias = w["output_dense"]
    return context @ kernel + bias, weights


def np_ffn(ffn, x):
    w1, b1, w2, b2 = (to_np(v) for v in ffn.weights)
    return np.maximum(x @ w1 + b1, 0.0) @ w2 + b2


def np_norm(norm_layer):
    """(gamma, beta) of a LayerNormalization or of the LayerNorm inside an AddNorm."""
    norm_layer = getattr(norm_layer, "layer_norm", norm_layer)
    return to_np(norm_layer.gamma), to_np(norm_layer.beta)


def np_sublayer(block, norm_layer, x, fn):
    """Post-LN: LN(x + f(x)); pre-LN: x + f(LN(x))."""
    gamma, beta = np_norm(norm_layer)
    if block.normalize_first:
        return x + fn(np_layer_norm(x, gamma, beta))
    return np_layer_norm(x + fn(x), gamma, beta)


def np_encoder_block(block, x, pad):
    mask = pad[:, None, :] & pad[:, :, None]  # keys and queries
    x = np_sublayer(block, block.self_attention_norm, x,
                    lambda h: np_mha(block.self_attention, h, h, mask, block.num_heads)[0])
    return np_sublayer(block, block.ffn_norm, x, lambda h: np_ffn(block.ffn, h))


def np_decoder_block(block, x, enc, tgt_pad, src_pad):
    t = x.shape[1]
    causal = np.tril(np.ones((t, t), bool))[None] & tgt_pad[:, None, :] & tgt_pad[:, :, None]
    cross = tgt_pad[:, :, None] & src_pad[:, None, :]
    x = np_sublayer(block, block.self_attention_norm, x,
                    lambda h: np_mha(block.self_attention, h, h, causal, block.num_heads)[0])
    x = np_sublayer(block, block.cross_attention_norm, x,
                    lambda h: np_mha(block.cross_attention, h, enc, cross, block.num_heads)[0])
    return np_sublayer(block, block.ffn_norm, x, lambda h: np_ffn(block.ffn, h))


def lengths_mask(lengths, length):
    return np.arange(length)[None, :] < np.asarray(lengths)[:, None]


# ---- the layer contract ----------------------------------------------------------------------


@pytest.mark.parametrize("normalize_first", NORMS)
def test_encoder_block_contract(normalize_first, tmp_path):
    x = np.random.randn(2, 5, 8).astype("float32")
    pad = lengths_mask([5, 3], 5)
    run_layer_test(
        TransformerEncoderBlock,
        {"attention": AttentionConfig(num_heads=2), "intermediate_dim": 16, "dropout": 0.1,
         "normalize_first": normalize_first},
        {"inputs": x, "padding_mask": pad},
        (2, 5, 8),
        tmp_path,
    )


@pytest.mark.parametrize("normalize_first", NORMS)
def test_decoder_block_contract(normalize_first, tmp_path):
    x = np.random.randn(2, 4, 8).astype("float32")
    enc = np.random.randn(2, 6, 12).astype("float32")  # encoder size may differ
    run_layer_test(
        TransformerDecoderBlock,
        {"attention": AttentionConfig(num_heads=2), "intermediate_dim": 16, "dropout": 0.1,
         "normalize_first": normalize_first},
        {"inputs": x, "encoder_outputs": enc, "encoder_padding_mask": lengths_mask([6, 2], 6)},
        (2, 4, 8),
        tmp_path,
    )


def test_encoder_stack_contract(tmp_path):
    ids = np.array([[5, 6, 7, 0], [4, 0, 0, 0]], "int32")
    run_layer_test(
        TransformerEncoder,
        {"vocabulary_size": 9, "num_layers": 2, "hidden_dim": 8,
         "block": BlockConfig(AttentionConfig(num_heads=2), intermediate_dim=16, dropout=0.1,
                              normalize_first=True)},
        {"inputs": ids},
        (2, 4, 8),
        tmp_path,
    )


def test_decoder_stack_contract(tmp_path):
    ids = np.array([[2, 6, 7], [2, 5, 0]], "int32")
    enc = np.random.randn(2, 4, 8).astype("float32")
    run_layer_test(
        TransformerDecoder,
        {"vocabulary_size": 11, "num_layers": 2, "hidden_dim": 8,
         "block": BlockConfig(AttentionConfig(num_heads=2), intermediate_dim=16, dropout=0.1)},
        {"inputs": ids, "encoder_outputs": enc, "encoder_padding_mask": lengths_mask([4, 2], 4)},
        (2, 3, 11),
        tmp_path,
    )


@pytest.mark.parametrize(
    "cls, kwargs, name",
    [
        (TransformerEncoderBlock, {"attention": 0, "intermediate_dim": 4}, "num_heads"),
        (TransformerEncoderBlock, {"attention": 2, "intermediate_dim": 0}, "intermediate_dim"),
        (TransformerDecoderBlock, {"attention": 2, "intermediate_dim": 4, "dropout": 1.0},
         "dropout"),
        (TransformerDecoderBlock, {"attention": 2, "intermediate_dim": 4, "normalize_first": 1},
         "normalize_first"),
        (TransformerEncoderBlock, {"attention": 2, "intermediate_dim": 4, "activation": "nope"},
         "activation"),
        (TransformerEncoderBlock, {"attention": 2, "intermediate_dim": 4,
                                   "layer_norm_epsilon": 0}, "layer_norm_epsilon"),
        (TransformerEncoder, {"vocabulary_size": 0, "num_layers": 1, "hidden_dim": 8,
                              "block": BlockConfig(2, intermediate_dim=4)}, "vocabulary_size"),
        (TransformerDecoder, {"vocabulary_size": 5, "num_layers": 0, "hidden_dim": 8,
                              "block": BlockConfig(2, intermediate_dim=4)}, "num_layers"),
        (TransformerDecoder, {"vocabulary_size": 5, "num_layers": 1, "hidden_dim": 10,
                              "block": BlockConfig(4, intermediate_dim=4)}, "num_heads"),
    ],
)
def test_bad_arguments_name_the_argument(cls, kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}`.*Received: {name}="):
        cls(**kwargs)


@pytest.mark.parametrize("cls", [TransformerEncoderBlock, TransformerDecoderBlock])
def test_num_heads_must_divide_hidden_dim_at_build(cls):
    block = cls(AttentionConfig(num_heads=3), intermediate_dim=8)
    with pytest.raises(ValueError, match="num_heads=3"):
        block(np.zeros((1, 2, 10), "float32"), *([np.zeros((1, 2, 10), "float32")]
                                                  if cls is TransformerDecoderBlock else []))


# ---- numbers against NumPy -------------------------------------------------------------------


@pytest.mark.parametrize("normalize_first", NORMS)
def test_encoder_block_matches_numpy(normalize_first):
    block = TransformerEncoderBlock(AttentionConfig(num_heads=2), intermediate_dim=12,
                                    normalize_first=normalize_first)
    x = np.random.randn(3, 5, 8).astype("float32")
    pad = lengths_mask([5, 2, 4], 5)
    block.build(x.shape)
    randomize(block)
    out = to_np(block(x, padding_mask=pad))
    assert_allclose(out, np_encoder_block(block, x.astype("float64"), pad),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("normalize_first", NORMS)
def test_decoder_block_matches_numpy(normalize_first):
    block = TransformerDecoderBlock(AttentionConfig(num_heads=2), intermediate_dim=12,
                                    normalize_first=normalize_first)
    x = np.random.randn(3, 4, 8).astype("float32")
    enc = np.random.randn(3, 6, 8).astype("float32")
    tgt_pad, src_pad = lengths_mask([4, 3, 1], 4), lengths_mask([6, 2, 5], 6)
    block.build(x.shape, enc.shape)
    randomize(block)
    out, weights = block(x, enc, decoder_padding_mask=tgt_pad, encoder_padding_mask=src_pad,
                         return_attention_scores=True)
    expected = np_decoder_block(block, x.astype("float64"), enc.astype("float64"), tgt_pad,
                                src_pad)
    assert_allclose(to_np(out), expected, atol=1e-5, rtol=1e-5)
    assert weights.shape == (3, 2, 4, 6)
    assert_array_equal(to_np(weights)[:, :, :, :][~src_pad[:, None, None, :]
                                                             .repeat(2, 1).repeat(4, 2)], 0.0)


def np_positions(length, dim):
    i = np.arange(length)[:, None]
    angles = i / 10000 ** (np.arange(0, dim, 2)[None, :] / dim)  # (T, d/2)
    table = np.zeros((length, dim))
    table[:, 0::2], table[:, 1::2] = np.sin(angles), np.cos(angles)
    return table


@pytest.mark.parametrize("normalize_first", NORMS)
def test_stacks_match_numpy(normalize_first):
    model = small_model(normalize_first)
    encoder, decoder = model.get_layer("encoder"), model.get_layer("decoder")
    src = np.array([[4, 5, 6, 7, 0], [8, 9, 0, 0, 0]], "int32")
    tgt = np.array([[2, 5, 9, 11], [2, 13, 0, 0]], "int32")

    def embed(stack, ids):  # E[ids] · √d + P
        table = to_np(stack.token_embedding.embeddings).astype("float64")
        return table[ids] * np.sqrt(16) + np_positions(ids.shape[1], 16)[None]

    def finish(stack, x):
        return np_layer_norm(x, *np_norm(stack.final_norm)) if normalize_first else x

    x = embed(encoder, src)
    for block in encoder.blocks:
        x = np_encoder_block(block, x, src != 0)
    enc = finish(encoder, x)
    assert_allclose(to_np(encoder(src)), enc, atol=1e-4, rtol=1e-5)
    x = embed(decoder, tgt)
    for block in decoder.blocks:
        x = np_decoder_block(block, x, enc, tgt != 0, src != 0)
    kernel, bias = (to_np(w) for w in decoder.output_dense.weights)
    assert_allclose(to_np(model([src, tgt])), finish(decoder, x) @ kernel + bias,
                               atol=1e-4, rtol=1e-5)


def test_implicit_mask_equals_explicit_padding_mask():
    block = TransformerEncoderBlock(AttentionConfig(num_heads=2), intermediate_dim=12)
    ids = np.array([[3, 4, 5, 0, 0], [6, 7, 8, 9, 1]], "int32")
    embedded = keras.layers.Embedding(10, 8, mask_zero=True)(ids)  # carries the mask
    implicit = to_np(block(embedded))
    explicit = to_np(block(to_np(embedded), padding_mask=ids != 0))
    assert_allclose(implicit, explicit, atol=1e-6)
    without = to_np(block(to_np(embedded)))
    assert not np.allclose(without[0, :3], explicit[0, :3], atol=1e-3)  # the mask matters


def test_pre_and_post_ln_differ_and_pre_ln_has_final_norm():
    post, pre = small_model(normalize_first=False), small_model(normalize_first=True)
    assert [w.path for w in pre.weights if "final_norm" in w.path]
    assert not [w.path for w in post.weights if "final_norm" in w.path]
    assert [w.path for w in post.get_layer("encoder").weights
            if "block_0/self_attention_add_norm/" in w.path]
    src = np.array([[4, 5, 6]], "int32")
    tgt = np.array([[2, 7]], "int32")
    assert not np.allclose(to_np(post([src, tgt])), to_np(pre([src, tgt])), atol=1e-3)


# ---- masks at model level ---------------------------------------------------------------


@pytest.mark.parametrize("normalize_first", NORMS)
def test_causal_mask_hides_the_future(normalize_first):
    model = small_model(normalize_first)
    src = np.array([[4, 5, 6, 7, 0], [8, 9, 10, 0, 0]], "int32")
    tgt = np.array([[2, 5, 9, 11, 12, 7], [2, 13, 14, 15, 16, 17]], "int32")
    base = to_np(model([src, tgt]))
    for t in (1, 3, 5):
        changed = tgt.copy()
        changed[:, t] = 18
        out = to_np(model([src, changed]))
        assert_allclose(out[:, :t], base[:, :t], atol=1e-6)
        assert np.abs(out[:, t:] - base[:, t:]).max() > 1e-3  # the token does matter


@pytest.mark.parametrize("normalize_first", NORMS)
def test_source_padding_is_ignored(normalize_first):
    model = small_model(normalize_first)
    src_short = np.array([[4, 5, 6, 0], [8, 9, 0, 0]], "int32")
    src_long = np.pad(src_short, ((0, 0), (0, 5)))  # 5 more padding positions
    tgt = np.array([[2, 5, 9, 11], [2, 13, 14, 0]], "int32")
    base = to_np(model([src_short, tgt]))
    encoder = model.get_layer("encoder")
    enc_short, enc_long = to_np(encoder(src_short)), to_np(encoder(src_long))
    valid = src_short != 0
    assert_allclose(enc_long[:, :4][valid], enc_short[valid], atol=1e-5)
    # The padding embedding itself cannot reach the outputs either.
    table = encoder.token_embedding.embeddings
    table.assign(np.concatenate([np.full((1, 16), 50.0), to_np(table)[1:]]).astype("float32"))
    assert_allclose(to_np(model([src_long, tgt])), base, atol=1e-5)
    # ... while a real token there would.
    src_real = src_short.copy()
    src_real[1, 2] = 7
    assert np.abs(to_np(model([src_real, tgt])) - base).max() > 1e-3


# ---- cached decoding ------------------------------------------------------------------------


@pytest.mark.parametrize("normalize_first", NORMS)
def test_cached_steps_equal_full_forward(normalize_first):
    model = small_model(normalize_first, num_layers=3)
    encoder, decoder = model.get_layer("encoder"), model.get_layer("decoder")
    src = np.array([[4, 5, 6, 7, 0, 0], [8, 9, 10, 11, 12, 13], [14, 0, 0, 0, 0, 0]], "int32")
    tgt = np.random.randint(4, 22, size=(3, 7)).astype("int32")
    tgt[:, 0] = 2
    full, full_weights = decoder(tgt, encoder(src), encoder_padding_mask=src != 0,
                                 return_attention_scores=True)  # (B, T, V), (B, L, H, T, S)
    state = decoder.init_decode_state(encoder(src), src, max_length=9)
    shapes = [tuple(t.shape) for t in keras.tree.flatten(state)]
    assert (3, 4, 9, 4) in shapes  # (B, H, max_length, head_dim) self-attention caches
    for index in range(tgt.shape[1]):
        logits, state, attention = decoder.decode_step(tgt[:, index], index, state,
                                                       return_attention_scores=True)
        assert dtype_of(logits) == "float32" and attention.shape == (3, 3, 4, 6)
        assert_allclose(to_np(logits), to_np(full)[:, index], atol=1e-5)
        assert_allclose(to_np(attention), to_np(full_weights)[:, :, :, index],
                                   atol=1e-5)
        # Static shapes: the cache is updated in place, never grown.
        assert [tuple(t.shape) for t in keras.tree.flatten(state)] == shapes
    # The cache holds exactly the positions written so far.
    key_cache = to_np(state["self_attention_cache"][0][0])
    assert np.all(key_cache[:, :, tgt.shape[1]:] == 0.0)
    assert np.all(np.abs(key_cache[:, :, : tgt.shape[1]]).sum(-1) > 0)
    # Weights only when asked: the default step forms none.
    logits, _, attention = decoder.decode_step(tgt[:, 0], 0, decoder.init_decode_state(
        encoder(src), src, max_length=9))
    assert attention is None
    assert_allclose(to_np(logits), to_np(full)[:, 0], atol=1e-5)


# ---- the seq2seq model ---------------------------------------------------------------------


def test_model_structure_and_names():
    model = small_model()
    assert [i.name for i in model.inputs] == ["source_ids", "target_in_ids"]
    assert isinstance(model.get_layer("encoder"), TransformerEncoder)
    assert isinstance(model.get_layer("decoder"), TransformerDecoder)
    assert model.outputs[0].shape == (None, None, 22)


def test_save_load_identical_logits_and_greedy(tmp_path):
    model = small_model(normalize_first=True)
    randomize(model, seed=3)  # weights whose greedy output is not constant
    src = np.array([[4, 5, 6, 7, 0], [8, 9, 10, 11, 12]], "int32")
    tgt = np.array([[2, 5, 9, 11], [2, 13, 14, 0]], "int32")
    path = str(tmp_path / "transformer.keras")
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert_array_equal(to_np(loaded([src, tgt])), to_np(model([src, tgt])))
    greedy = to_np(decoding.generate(model, src, 6))
    assert_array_equal(to_np(decoding.generate(loaded, src, 6)), greedy)
    assert len(np.unique(greedy)) > 2  # not a degenerate constant output


def test_mixed_bfloat16_forward_gives_finite_float32_logits():
    keras.config.set_dtype_policy("mixed_bfloat16")
    model = small_model(normalize_first=False)
    assert dtype_of(model.outputs[0]) == "float32"
    assert model.get_layer("decoder").blocks[0].ffn.compute_dtype == "bfloat16"
    # The vocabulary projection runs in bfloat16 too; only its logits are cast to float32.
    assert model.get_layer("decoder").output_dense.compute_dtype == "bfloat16"
    src = np.array([[4, 5, 6, 7, 0], [8, 9, 10, 11, 12]], "int32")
    tgt = np.array([[2, 5, 9, 11], [2, 13, 14, 0]], "int32")
    logits = model([src, tgt])
    assert dtype_of(logits) == "float32" and np.all(np.isfinite(to_np(logits)))
    tokens = to_np(decoding.generate(model, src, 5))
    assert tokens.shape == (2, 5)


# ---- learning ----------------------------------------------------------------------------------


def copy_data(n, rng, length=5, symbols=8):
    """Source: random symbols 4..4+symbols, random lengths; target: the same, then <eos>."""
    src = np.zeros((n, length), "int32")
    tgt_in = np.zeros((n, length + 1), "int32")
    tgt_out = np.zeros((n, length + 1), "int32")
    for i in range(n):
        k = rng.integers(2, length + 1)
        seq = rng.integers(4, 4 + symbols, size=k)
        src[i, :k] = seq
        tgt_in[i, 0], tgt_in[i, 1:k + 1] = 2, seq
        tgt_out[i, :k], tgt_out[i, k] = seq, 3
    return src, tgt_in, tgt_out


@pytest.mark.parametrize(
    "normalize_first",
    [pytest.param(False, id="post_ln"), pytest.param(True, id="pre_ln", marks=pytest.mark.slow)],
)
def test_copy_task_learns(normalize_first):
    rng = np.random.default_rng(0)
    model = transformer_seq2seq(12, 12, num_layers=1, hidden_dim=32, num_heads=2,
                                intermediate_dim=64, dropout=0.0,
                                normalize_first=normalize_first)
    model.compile(keras.optimizers.Adam(3e-3), loss=masked_sparse_categorical_crossentropy,
                  metrics=[MaskedAccuracy()])
    src, tgt_in, tgt_out = copy_data(2000, rng)
    model.fit([src, tgt_in], tgt_out, batch_size=64, epochs=3, verbose=0)
    test_src, _, test_out = copy_data(200, rng)
    predicted = to_np(decoding.generate(model, test_src, 6)).astype("int32")
    valid = test_out != 0
    accuracy = np.mean(predicted[valid] == test_out[valid])
    assert accuracy >= 0.95, accuracy
