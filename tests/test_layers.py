"""The seven core layers: contract (via run_layer_test), NumPy references from the formulas,
equivalence with keras.layers.MultiHeadAttention and torch.nn.MultiheadAttention, masks."""

import keras
import numpy as np
import pytest
import reference as ref
from backend_utils import assert_allclose, dense_weights, dtype_of, rand, to_np
from layer_test_utils import run_layer_test

import keras_attn as ka


def lens_mask(lens, t, s):
    return np.broadcast_to(ref.length_mask(lens, t, s), (len(lens), t, s))


def mha_weights(layer) -> dict:
    return {name: dense_weights(getattr(layer, f"{name}_dense"))
            for name in ("query", "key", "value", "output")}


# ---------------------------------------------------------------- contract, every layer

LENS = np.array([3, 5], "int32")
CONTRACT_CASES = [
    ("nw_scalar", ka.NWPooling, {}, {"query": rand(2, 4), "key": rand(2, 5),
                                     "value": rand(2, 5)}, (2, 4), {}),
    ("nw_vector_learnable", ka.NWPooling, {"learnable": True},
     {"query": rand(2, 4, 3), "key": rand(2, 5, 3), "value": rand(2, 5, 2),
      "valid_lens": LENS}, (2, 4, 2), {}),
    ("additive", ka.AdditiveAttention, {"units": 8, "dropout": 0.1},
     {"query": rand(2, 1, 20), "key": rand(2, 5, 2), "value": rand(2, 5, 4),
      "valid_lens": LENS}, (2, 1, 4), {}),
    ("scaled_dot", ka.ScaledDotAttention, {"dropout": 0.1},
     {"query": rand(2, 3, 6), "key": rand(2, 5, 6), "value": rand(2, 5, 4),
      "valid_lens": LENS}, (2, 3, 4), {}),
    ("multi_head", ka.MultiHead, {"num_heads": 2, "key_dim": 4, "value_dim": 3,
                                  "output_shape": 7, "dropout": 0.1},
     {"query": rand(2, 3, 6), "key": rand(2, 5, 5), "value": rand(2, 5, 4),
      "valid_lens": LENS}, (2, 3, 7), {}),
    ("multi_head_causal_bias_kv_zero_attn", ka.MultiHead,
     {"num_heads": 2, "key_dim": 4, "add_bias_kv": True, "add_zero_attn": True},
     {"query": rand(2, 5, 6)}, (2, 5, 6), {"use_causal_mask": True}),
    ("position_encoding", ka.SinusoidalPositionEncoding, {"max_wavelength": 1000,
                                                          "dropout": 0.1},
     {"inputs": rand(2, 7, 6)}, (2, 7, 6), {}),
    ("ffn", ka.FFN, {"intermediate_dim": 8, "output_dim": 5, "activation": "gelu",
                     "dropout": 0.1},
     {"inputs": rand(2, 3, 6)}, (2, 3, 5), {}),
    ("add_norm", ka.AddNorm, {"dropout": 0.1, "epsilon": 1e-6},
     {"inputs": rand(2, 3, 6), "sublayer_output": rand(2, 3, 6)}, (2, 3, 6), {}),
]


@pytest.mark.parametrize(
    "layer_cls,init_kwargs,inputs,expected_shape,call_kwargs",
    [case[1:] for case in CONTRACT_CASES],
    ids=[case[0] for case in CONTRACT_CASES],
)
def test_layer_contract(layer_cls, init_kwargs, inputs, expected_shape, call_kwargs, tmp_path):
    run_layer_test(layer_cls, init_kwargs, inputs, expected_shape, tmp_path,
                   call_kwargs=call_kwargs)


# ---------------------------------------------------------------- NumPy references

@pytest.mark.parametrize("learnable", [False, True])
def test_nw_pooling_matches_formula(learnable):
    layer = ka.NWPooling(learnable=learnable)
    xq, xk, y = rand(2, 4), rand(2, 6), rand(2, 6)
    layer.build(xq.shape, xk.shape, y.shape)
    w = 1.0
    if learnable:
        layer.width.assign(1.7)
        w = 1.7
    out, weights = layer(xq, xk, y, return_attention_scores=True)
    scores = -0.5 * ((xq[:, :, None] - xk[:, None, :]) * w) ** 2
    ref_w = ref.masked_softmax(scores, np.ones_like(scores, bool))
    assert_allclose(to_np(weights), ref_w, atol=1e-6)
    assert_allclose(to_np(out), np.einsum("bts,bs->bt", ref_w, y), atol=1e-5)


def test_nw_pooling_vector_keys_and_leave_one_out_mask():
    x, y = rand(1, 6, 3), rand(1, 6, 2)
    leave_one_out = ~np.eye(6, dtype=bool)[None]
    out, weights = ka.NWPooling()(x, x, y, attention_mask=leave_one_out,
                                  return_attention_scores=True)
    sq = ((x[:, :, None, :] - x[:, None, :, :]) ** 2).sum(-1)
    ref_w = ref.masked_softmax(-0.5 * sq, leave_one_out)
    assert np.all(np.diag(to_np(weights)[0]) == 0.0)
    assert_allclose(to_np(weights), ref_w, atol=1e-6)
    assert_allclose(to_np(out), ref_w @ y, atol=1e-5)


def test_nw_pooling_learns_width_with_sgd():
    """The parametric form fits a sharper kernel on leave-one-out training (seed 10.2.7)."""
    rng = np.random.default_rng(0)
    xs = np.sort(rng.uniform(0, 5, 50)).astype("float32")[None]
    ys = (2 * np.sin(xs) + xs ** 0.8 + rng.normal(0, 0.5, xs.shape)).astype("float32")
    layer = ka.NWPooling(learnable=True)
    mask = ~np.eye(50, dtype=bool)[None]
    q = keras.Input((50,))
    model = keras.Model(q, layer(q, keras.ops.convert_to_tensor(xs),
                                 keras.ops.convert_to_tensor(ys), attention_mask=mask))
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss="mse")
    first = model.evaluate(xs, ys, verbose=0)
    model.fit(xs, ys, epochs=5, verbose=0)
    assert model.evaluate(xs, ys, verbose=0) < first
    assert float(layer.width) > 1.0


def test_additive_attention_matches_formula():
    layer = ka.AdditiveAttention(units=8)
    q, k, v = rand(2, 3, 20), rand(2, 5, 2), rand(2, 5, 4)
    out, weights = layer(q, k, v, valid_lens=LENS, return_attention_scores=True)
    wq, wk, wv = (to_np(d.kernel) for d in (layer.query_dense, layer.key_dense,
                                            layer.score_dense))
    features = np.tanh((q @ wq)[:, :, None, :] + (k @ wk)[:, None, :, :])  # (B, T, S, u)
    scores = (features @ wv)[..., 0]
    ref_w = ref.masked_softmax(scores, lens_mask(LENS, 3, 5))
    assert_allclose(to_np(weights), ref_w, atol=1e-5)
    assert_allclose(to_np(out), ref_w @ v, atol=1e-5)


def test_scaled_dot_attention_matches_formula_with_causal_mask():
    q, k, v = rand(2, 4, 6), rand(2, 4, 6), rand(2, 4, 3)
    out, weights = ka.ScaledDotAttention()(q, k, v, use_causal_mask=True,
                                           return_attention_scores=True)
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(6)
    ref_w = ref.masked_softmax(scores, np.tril(np.ones((4, 4), bool))[None])
    assert_allclose(to_np(weights), ref_w, atol=1e-5)
    assert_allclose(to_np(out), ref_w @ v, atol=1e-5)


def test_multi_head_matches_per_head_formula():
    layer = ka.MultiHead(num_heads=3, key_dim=4, value_dim=2, output_shape=5)
    q, k, v = rand(2, 3, 6), rand(2, 5, 7), rand(2, 5, 8)
    out, weights = layer(q, k, v, valid_lens=LENS, return_attention_scores=True)
    ref_out, ref_w = ref.multi_head_attention(q, k, v, mha_weights(layer), 3,
                                              lens_mask(LENS, 3, 5))
    assert weights.shape == (2, 3, 3, 5)
    assert_allclose(to_np(weights), ref_w, atol=1e-5)
    assert_allclose(to_np(out), ref_out, atol=1e-5)


@pytest.mark.parametrize("dim", [6, 7])
def test_position_encoding_matches_formula(dim):
    x = rand(2, 9, dim)
    out = to_np(ka.SinusoidalPositionEncoding()(x))
    i = np.arange(9)[:, None]
    j = np.arange(dim)[None, :]
    angle = i / np.power(10000.0, (j - j % 2) / dim)
    table = np.where(j % 2 == 0, np.sin(angle), np.cos(angle))
    assert_allclose(out - x, np.broadcast_to(table, x.shape), atol=1e-5)
    shifted = to_np(ka.SinusoidalPositionEncoding()(x[:, 4:], start_index=4))
    assert_allclose(shifted, out[:, 4:], atol=1e-5)


def test_position_encoding_any_length_and_dtype():
    x = np.zeros((1, 3000, 8), "float32")
    out = to_np(ka.SinusoidalPositionEncoding()(x))
    assert_allclose(out[0, 2999, 0], np.sin(2999.0), atol=1e-3)
    half = ka.SinusoidalPositionEncoding(dtype="mixed_bfloat16")(x)
    assert dtype_of(half) == "bfloat16"


def test_ffn_and_add_norm_match_formula():
    x, y = rand(2, 3, 6), rand(2, 3, 6)
    ffn = ka.FFN(intermediate_dim=8)
    out = to_np(ffn(x))
    h = np.maximum(x @ to_np(ffn.hidden_dense.kernel) + to_np(ffn.hidden_dense.bias), 0)
    want = h @ to_np(ffn.output_dense.kernel) + to_np(ffn.output_dense.bias)
    assert_allclose(out, want, atol=1e-5)

    z = x + y
    ref_norm = (z - z.mean(-1, keepdims=True)) / np.sqrt(z.var(-1, keepdims=True) + 1e-5)
    assert_allclose(to_np(ka.AddNorm()(x, y)), ref_norm, atol=1e-4)


# ---------------------------------------------------------------- keras MHA and torch MHA

@pytest.mark.parametrize("masking", ["none", "padding", "causal", "padding_and_causal"])
def test_multi_head_equals_keras_multi_head_attention(masking):
    # Keras' MultiHeadAttention on JAX calls jax.nn.dot_product_attention, which needs
    # value_dim == key_dim; elsewhere the two differ to check that from_keras keeps them apart.
    value_dim = 8 if keras.backend.backend() == "jax" else 6
    keras_mha = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8, value_dim=value_dim,
                                                output_shape=10)
    q, v, k = rand(3, 5, 12), rand(3, 7, 9), rand(3, 7, 11)
    lens = np.array([7, 3, 1])
    value_mask = np.arange(7) < lens[:, None]
    causal = "causal" in masking
    use_pad = "padding" in masking
    keras_mha(q, v, k)  # build
    ours = ka.MultiHead.from_keras(keras_mha)
    want = keras_mha(q, v, k, value_mask=value_mask if use_pad else None,
                     use_causal_mask=causal)
    out = ours(q, k, v, valid_lens=lens if use_pad else None, use_causal_mask=causal)
    assert_allclose(to_np(out), to_np(want), atol=1e-5)


@pytest.mark.tf_only
def test_multi_head_under_xla_equals_keras_with_gradients():
    import tensorflow as tf

    keras_mha = keras.layers.MultiHeadAttention(num_heads=4, key_dim=8)
    x = tf.constant(rand(3, 6, 16))
    keras_mha(x, x)
    ours = ka.MultiHead.from_keras(keras_mha)

    def loss_and_grads(layer, call):
        def fn(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = call(x)
                loss = tf.reduce_sum(y * y)
            return y, tape.gradient(loss, [x] + layer.trainable_variables)
        return fn

    fn = loss_and_grads(ours, lambda x: ours(x, use_causal_mask=True))
    xla, graph = tf.function(fn, jit_compile=True), tf.function(fn)
    want_out, want_grads = loss_and_grads(
        keras_mha, lambda x: keras_mha(x, x, use_causal_mask=True))(x)
    for compiled in (xla, graph):
        out, grads = compiled(x)
        assert_allclose(to_np(out), to_np(want_out), atol=1e-5)
        for got, want in zip(grads, want_grads):  # Keras kernels are (in, H, d): same order
            assert_allclose(to_np(got).reshape(want.shape), to_np(want), atol=1e-4)


def random_torch_state_dict(e, kdim, vdim, bias, add_bias_kv):
    sd = {"out_proj.weight": rand(e, e)}
    if kdim == vdim == e:
        sd["in_proj_weight"] = rand(3 * e, e)
    else:
        sd.update(q_proj_weight=rand(e, e), k_proj_weight=rand(e, kdim),
                  v_proj_weight=rand(e, vdim))
    if bias:
        sd.update({"in_proj_bias": rand(3 * e), "out_proj.bias": rand(e)})
    if add_bias_kv:
        sd.update(bias_k=rand(1, 1, e), bias_v=rand(1, 1, e))
    return sd


TORCH_CASES = [(8, 8, 8, True, False, False), (8, 5, 3, True, True, True),
               (6, 6, 6, False, True, False), (6, 4, 6, True, False, True)]


@pytest.mark.parametrize("e,kdim,vdim,bias,add_bias_kv,add_zero_attn", TORCH_CASES)
def test_multi_head_from_torch_state_dict_matches_torch_formula(e, kdim, vdim, bias,
                                                                add_bias_kv, add_zero_attn):
    sd = random_torch_state_dict(e, kdim, vdim, bias, add_bias_kv)
    q, k, v = rand(2, 3, e), rand(2, 4, kdim), rand(2, 4, vdim)
    pad = np.array([[False] * 4, [False, False, True, True]])
    ours = ka.MultiHead.from_torch_state_dict(sd, num_heads=2, add_zero_attn=add_zero_attn)
    out = ours(q, k, v, valid_lens=np.array([4, 2]))
    want = ref.torch_multihead_attention(sd, q, k, v, 2, key_padding_mask=pad,
                                         add_zero_attn=add_zero_attn)
    assert_allclose(to_np(out), want, atol=1e-4)


@pytest.mark.parametrize("e,kdim,vdim,bias,add_bias_kv,add_zero_attn", TORCH_CASES)
def test_multi_head_from_torch_equals_real_torch(e, kdim, vdim, bias, add_bias_kv,
                                                 add_zero_attn):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    module = torch.nn.MultiheadAttention(e, 2, bias=bias, add_bias_kv=add_bias_kv,
                                         add_zero_attn=add_zero_attn, kdim=kdim, vdim=vdim,
                                         batch_first=True).eval()
    sd = {name: t.detach().numpy() for name, t in module.state_dict().items()}
    q, k, v = rand(2, 3, e), rand(2, 4, kdim), rand(2, 4, vdim)
    pad = np.array([[False] * 4, [False, False, True, True]])
    with torch.no_grad():
        want, _ = module(torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v),
                        key_padding_mask=torch.from_numpy(pad))
    ours = ka.MultiHead.from_torch_state_dict(sd, num_heads=2, add_zero_attn=add_zero_attn)
    out = ours(q, k, v, valid_lens=np.array([4, 2]))
    assert_allclose(to_np(out), want.numpy(), atol=1e-5)


# ---------------------------------------------------------------- masks

def test_implicit_mask_equals_valid_lens():
    """Embedding(mask_zero=True) masks the same keys as explicit valid_lens."""
    ids = np.array([[5, 3, 8, 0, 0], [2, 9, 4, 7, 1]])
    lens = np.array([3, 5])
    inp = keras.Input((5,), dtype="int32")
    embedding = keras.layers.Embedding(10, 8, mask_zero=True)
    mha = ka.MultiHead(num_heads=2, key_dim=4)
    implicit = keras.Model(inp, mha(embedding(inp)))
    explicit = to_np(mha(embedding(ids), valid_lens=lens))
    out = to_np(implicit(ids))
    valid_rows = np.arange(5) < lens[:, None]
    assert_allclose(out[valid_rows], explicit[valid_rows], atol=1e-6)
    # Padded query rows attend nowhere: zero context, so the output is the output bias.
    assert_allclose(out[0, 3:], np.broadcast_to(to_np(mha.output_dense.bias),
                                                           (2, 8)), atol=1e-6)


def test_implicit_mask_propagates_through_layers():
    """The padding mask of the embedding reaches a masked average after the layers: the
    padded positions do not count."""
    inp = keras.Input((4,), dtype="int32")
    x = keras.layers.Embedding(10, 8, mask_zero=True)(inp)
    y = ka.AddNorm()(x, ka.MultiHead(2, 4)(x))
    y = ka.FFN(16)(ka.SinusoidalPositionEncoding()(y))
    model = keras.Model(inp, [y, keras.layers.GlobalAveragePooling1D()(y)])
    ids = np.array([[3, 4, 0, 0], [5, 6, 7, 8]], "int32")
    sequence, pooled = (to_np(out) for out in model(ids))
    assert_allclose(pooled[0], sequence[0, :2].mean(0), atol=1e-5)
    assert_allclose(pooled[1], sequence[1].mean(0), atol=1e-5)


def test_fully_masked_rows_are_zero_in_low_precision():
    for policy in ("float32", "mixed_float16", "mixed_bfloat16"):
        layer = ka.MultiHead(num_heads=2, key_dim=4, dtype=policy, use_bias=False)
        out, weights = layer(rand(2, 3, 8), valid_lens=np.array([0, 2]),
                             return_attention_scores=True)
        w = to_np(keras.ops.cast(weights, "float32"))
        assert np.all(w[0] == 0) and np.all(np.isfinite(w))
        assert np.all(to_np(keras.ops.cast(out, "float32"))[0] == 0)


@pytest.mark.parametrize("implementation", ["dense", "chunked"])
def test_multi_head_appended_keys_with_a_query_mask_only(implementation):
    """add_bias_kv / add_zero_attn append keys to the mask: a query mask alone, (B, T, 1) once
    merged, is spread over the keys first, as an explicit (B, T, S) mask would be."""
    rng = np.random.default_rng(31)
    query = rng.normal(size=(2, 5, 8)).astype("float32")
    memory = rng.normal(size=(2, 7, 8)).astype("float32")
    query_mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
    layer = ka.MultiHead(num_heads=2, key_dim=4, add_bias_kv=True, add_zero_attn=True,
                         implementation=implementation)
    out = layer(query, memory, query_mask=query_mask)
    explicit = np.broadcast_to(query_mask[:, :, None], (2, 5, 7))
    assert_allclose(to_np(out), to_np(layer(query, memory, attention_mask=explicit)),
                               atol=1e-6)
    assert out.shape == (2, 5, 8) and np.all(np.isfinite(to_np(out)))


# ---------------------------------------------------------------- bad input

@pytest.mark.parametrize(
    "make,arg",
    [
        (lambda: ka.MultiHead(num_heads=0, key_dim=4), "num_heads"),
        (lambda: ka.MultiHead(num_heads=2, key_dim=-1), "key_dim"),
        (lambda: ka.MultiHead(num_heads=2, key_dim=4, value_dim=2.5), "value_dim"),
        (lambda: ka.MultiHead(num_heads=2, key_dim=4, add_bias_kv=1), "add_bias_kv"),
        (lambda: ka.MultiHead(num_heads=2, key_dim=4, dropout=1.0), "dropout"),
        (lambda: ka.AdditiveAttention(units=0), "units"),
        (lambda: ka.ScaledDotAttention(scale="big"), "scale"),
        (lambda: ka.NWPooling(learnable="yes"), "learnable"),
        (lambda: ka.SinusoidalPositionEncoding(max_wavelength=0), "max_wavelength"),
        (lambda: ka.FFN(intermediate_dim=0), "intermediate_dim"),
        (lambda: ka.FFN(intermediate_dim=4, activation="nope"), "activation"),
        (lambda: ka.AddNorm(epsilon=-1), "epsilon"),
        (lambda: ka.AddNorm(dropout=-0.1), "dropout"),
    ],
)
def test_bad_constructor_arguments_name_the_argument(make, arg):
    with pytest.raises(ValueError, match=f"`{arg}`.*Received"):
        make()


@pytest.mark.parametrize(
    "layer,args,kwargs,arg",
    [
        (ka.ScaledDotAttention(), (rand(2, 3, 4), rand(2, 5, 6)), {}, "key"),
        (ka.MultiHead(2, 4), (rand(2, 3, 4), rand(3, 5, 4)), {}, "key"),
        (ka.MultiHead(2, 4), (rand(2, 3, 4), rand(2, 5, 4), rand(2, 6, 4)), {}, "value"),
        (ka.AdditiveAttention(4), (rand(2, 3), rand(2, 5)), {}, "query"),
        (ka.NWPooling(), (rand(2, 3), rand(2, 5, 2)), {}, "key"),
        (ka.MultiHead(2, 4), (rand(2, 3, 4),), {"valid_lens": np.ones((2, 4), "int32")},
         "valid_lens"),
        (ka.MultiHead(2, 4), (rand(2, 5, 8),), {"attention_mask": np.ones((2, 5, 4), bool)},
         "attention_mask"),
        (ka.MultiHead(2, 4), (rand(2, 5, 8),), {"attention_mask": np.ones((3, 5, 5), bool)},
         "attention_mask"),
        (ka.MultiHead(2, 4), (rand(2, 5, 8),), {"valid_lens": np.ones((3,), "int32")},
         "valid_lens"),
        (ka.SinusoidalPositionEncoding(), (rand(2, 3),), {}, "inputs"),
        (ka.AddNorm(), (rand(2, 3, 4), rand(2, 3, 5)), {}, "sublayer_output"),
    ],
)
def test_mismatched_inputs_name_the_argument(layer, args, kwargs, arg):
    with pytest.raises(ValueError, match=f"`{arg}`"):
        layer(*args, **kwargs)
