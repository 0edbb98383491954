"""The one model assembly: attention weights only when asked, the kernel choice through every
model, per-sublayer initializers, padding ids, the parts (TokenEmbedding, OutputHead), the
decoding Protocol, the moved names."""

import functools
import warnings

import keras
import numpy as np
import pytest
from backend_utils import as_np, assert_allclose, assert_array_equal, randomize, to_np
from layer_test_utils import run_layer_test

import keras_attn as ka
from keras_attn import decoding
from keras_attn.decoding.contract import Decoder
from keras_attn.layers import (
    AttentionConfig,
    BlockConfig,
    MultiHead,
    OutputHead,
    RotaryEmbedding,
    SwinBlock,
    TokenEmbedding,
    TransformerDecoderBlock,
    TransformerDecoderOnlyBlock,
    TransformerEncoderBlock,
    WindowAttention,
)
from keras_attn.models import (
    CMLMDecoder,
    TransformerDecoderOnly,
    TransformerEncoder,
    causal_lm,
    nat_seq2seq,
    transformer_seq2seq,
)

SOURCE = np.array([[4, 5, 6, 7, 0], [8, 9, 10, 0, 0]], "int32")
TARGET = np.array([[2, 5, 9, 11], [2, 13, 14, 0]], "int32")
LM_IDS = np.array([[2, 5, 6, 7, 8, 9, 10], [2, 9, 11, 12, 0, 0, 0]], "int32")
SIZES = {"num_layers": 2, "hidden_dim": 16, "num_heads": 4, "intermediate_dim": 24}
# The same sizes for a stack: its blocks' configuration in one `BlockConfig` (the decoder-only
# stack's LLaMA-style, as `causal_lm` makes it).
STACK = {"num_layers": 2, "hidden_dim": 16,
         "block": BlockConfig(AttentionConfig(num_heads=4), intermediate_dim=24)}
LLAMA_BLOCK = BlockConfig(AttentionConfig(num_heads=4, position_encoding="rope"),
                          intermediate_dim=24, activation="swiglu", norm="rms",
                          normalize_first=True)


# ---- attention weights only when asked ------------------------------------------------------


@pytest.fixture
def asked(monkeypatch):
    """The `return_attention_scores` / `need_weights` of every attention call made."""
    calls = []
    multi_head_call, window_attend = MultiHead.call, WindowAttention.attend

    @functools.wraps(multi_head_call)  # Keras reads the call signature
    def call(self, *args, **kwargs):
        calls.append(bool(kwargs.get("return_attention_scores", False)))
        return multi_head_call(self, *args, **kwargs)

    @functools.wraps(window_attend)
    def attend(self, *args, need_weights=True, **kwargs):
        calls.append(bool(need_weights))
        return window_attend(self, *args, need_weights=need_weights, **kwargs)

    monkeypatch.setattr(MultiHead, "call", call)
    monkeypatch.setattr(WindowAttention, "attend", attend)
    return calls


def _models():
    return {
        "transformer_seq2seq": (transformer_seq2seq(19, 22, dropout=0.0, **SIZES),
                                [SOURCE, TARGET]),
        "causal_lm": (causal_lm(24, **SIZES), LM_IDS),
        "nat_seq2seq": (nat_seq2seq(19, 22, dropout=0.0, max_target_length=6, **SIZES),
                        [SOURCE, np.where(TARGET > 0, 22, 0).astype("int32")]),
    }


@pytest.mark.parametrize("name", ["transformer_seq2seq", "causal_lm", "nat_seq2seq"])
def test_training_and_decoding_never_ask_for_attention_weights(name, asked):
    model, inputs = _models()[name]
    model(inputs, training=True)
    if name == "transformer_seq2seq":
        decoding.generate(model, SOURCE, 5)
        decoding.generate(model, SOURCE, 5, sampler=decoding.Beam(2))
    elif name == "causal_lm":
        decoding.generate(model, LM_IDS[:, :3], 6)
    assert asked and not any(asked)
    if name == "transformer_seq2seq":  # the heatmaps still get theirs
        _, attention = decoding.generate(model, SOURCE, 5, return_attention_scores=True)
        assert attention.shape == (2, 5, 2, 4, 5) and any(asked)


def test_blocks_and_swin_ask_only_when_asked(asked):
    x = np.random.default_rng(0).standard_normal((2, 8, 8, 16)).astype("float32")
    swin = SwinBlock(num_heads=2, window_size=4, shift_size=2)
    assert swin(x).shape == (2, 8, 8, 16) and not any(asked)
    _, weights = swin(x, return_attention_scores=True)
    assert weights.shape == (2, 4, 2, 16, 16) and asked[-1]
    asked.clear()
    seq = x[:, 0]  # (2, 8, 16)
    encoder, decoder = TransformerEncoderBlock(2, 16), TransformerDecoderBlock(2, 16)
    decoder_only = TransformerDecoderOnlyBlock(2, 16)  # `attention` as the number of heads
    encoder(seq), decoder(seq, seq), decoder_only(seq)
    assert not any(asked)
    assert encoder(seq, return_attention_scores=True)[1].shape == (2, 2, 8, 8)
    assert decoder(seq, seq[:, :5], return_attention_scores=True)[1].shape == (2, 2, 8, 5)
    assert decoder_only(seq, return_attention_scores=True)[1].shape == (2, 2, 8, 8)


def test_stacks_return_the_weights_they_are_asked_for():
    model = causal_lm(24, **SIZES)
    decoder = model.get_layer("decoder")
    logits, weights = decoder(LM_IDS, return_attention_scores=True)
    assert_allclose(logits, model(LM_IDS), atol=1e-5)
    assert weights.shape == (2, 2, 4, 7, 7)
    assert_allclose(np.triu(as_np(weights)[0, 0, 0], 1), 0.0)  # causal
    state = decoder.init_decode_state(2, 7)
    _, state, none = decoder.decode_step(LM_IDS[:, 0], 0, state)  # not asked: not formed
    assert none is None
    _, _, attention = decoder.decode_step(LM_IDS[:, 1], 1, state, return_attention_scores=True)
    assert attention.shape == (2, 2, 4, 7)
    encoder = TransformerEncoder(19, **STACK)
    hidden, weights = encoder(SOURCE, return_attention_scores=True)
    assert hidden.shape == (2, 5, 16) and weights.shape == (2, 2, 4, 5, 5)
    assert_allclose(as_np(weights)[1, :, :, :3, 3:], 0.0)  # padding hidden


# ---- the kernel choice reaches every model ----------------------------------------------------


@pytest.mark.parametrize("name", ["transformer_seq2seq", "causal_lm", "nat_seq2seq"])
def test_the_chunked_kernel_gives_the_dense_models_outputs(name):
    dense, inputs = _models()[name]
    builder = {"transformer_seq2seq": transformer_seq2seq, "causal_lm": causal_lm,
               "nat_seq2seq": nat_seq2seq}[name]
    args = {"causal_lm": (24,), "transformer_seq2seq": (19, 22), "nat_seq2seq": (19, 22)}[name]
    extra = {"causal_lm": {}, "transformer_seq2seq": {"dropout": 0.0},
             "nat_seq2seq": {"dropout": 0.0, "max_target_length": 6}}[name]
    chunked = builder(*args, implementation="chunked", chunk_size=2, **SIZES, **extra)
    randomize(dense)
    chunked.set_weights(dense.get_weights())
    for layer in chunked.layers:
        for block in getattr(layer, "blocks", []):
            assert block.self_attention.implementation == "chunked"
            assert block.self_attention.chunk_size == 2
    got, want = chunked(inputs), dense(inputs)
    got = got if isinstance(got, (list, tuple)) else [got]
    want = want if isinstance(want, (list, tuple)) else [want]
    for a, b in zip(got, want):
        assert_allclose(to_np(a), to_np(b), atol=2e-5)


def test_chunked_causal_lm_trains_and_generates_as_the_dense_one():
    kwargs = dict(SIZES, num_key_value_heads=2)
    dense = causal_lm(24, **kwargs)
    chunked = causal_lm(24, implementation="chunked", chunk_size=3, **kwargs)
    randomize(dense, scale=0.5)
    chunked.set_weights(dense.get_weights())
    prompts = np.array([[2, 5, 6, 0], [2, 9, 0, 0]], "int32")
    tokens = as_np(decoding.generate(dense, prompts, 12))
    assert_array_equal(decoding.generate(chunked, prompts, 12), tokens)
    assert len(np.unique(tokens)) > 4
    chunked.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    history = chunked.fit(LM_IDS[:, :-1], LM_IDS[:, 1:], epochs=2, verbose=0)
    assert np.all(np.isfinite(history.history["loss"]))


def test_sliding_window_reaches_every_block_with_keras_meaning():
    """`sliding_window=3`: position t sees t-2..t; the local kernel gives the dense numbers."""
    local = causal_lm(24, sliding_window=3, implementation="local", **SIZES)
    dense = causal_lm(24, sliding_window=3, **SIZES)
    randomize(dense)
    local.set_weights(dense.get_weights())
    ids = np.array([[2, 5, 6, 7, 8, 9, 10, 11]], "int32")
    changed = ids.copy()
    changed[0, 1] = 12
    before, after = to_np(dense(ids)), to_np(dense(changed))
    # Two blocks of window 3: position 1 reaches up to position 1 + 2 * 2 = 5.
    assert_allclose(after[:, 6:], before[:, 6:], atol=1e-6)
    assert not np.allclose(after[:, 5], before[:, 5], atol=1e-4)
    assert_allclose(to_np(local(ids)), before, atol=2e-5)
    prompts = np.array([[2, 5, 6, 0]], "int32")
    assert_array_equal(decoding.generate(local, prompts, 10),
                       decoding.generate(dense, prompts, 10))


@pytest.mark.parametrize("kwargs, name", [
    ({"implementation": "flash"}, "implementation"),
    ({"chunk_size": 8}, "chunk_size"),
    ({"implementation": "local"}, "implementation"),
    ({"implementation": "chunked", "dropout": 0.1}, "implementation"),
    ({"sliding_window": 0}, "sliding_window"),
    ({"pad_id": -1}, "pad_id"),
    ({"head_dim": 0}, "head_dim"),
    ({"use_bias": 1}, "use_bias"),
])
def test_bad_kernel_arguments_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=f"`{name}"):
        causal_lm(24, **SIZES, **kwargs)


# ---- initializers ------------------------------------------------------------------------------


def test_a_seeded_model_is_reproducible_and_no_two_kernels_start_equal():
    def build():
        init = keras.initializers.GlorotUniform(seed=7)
        return causal_lm(24, **SIZES, kernel_initializer=init)

    first, second = build(), build()
    for a, b in zip(first.weights, second.weights):
        assert_array_equal(a, b)
    # One kernel of each sublayer the blocks and stacks create (MultiHead and FFN give each
    # of their projections its own initializer in turn).
    decoder = first.get_layer("decoder")
    kernels = [as_np(decoder.embedding.token_embedding.embeddings),
               as_np(decoder.head.output_dense.kernel)]
    for block in decoder.blocks:
        kernels += [as_np(block.self_attention.query_dense.kernel),
                    as_np(block.ffn.hidden_dense.kernel)]
    for i, a in enumerate(kernels):
        for b in kernels[i + 1:]:
            assert a.shape != b.shape or not np.allclose(a, b)
    seq2seq = transformer_seq2seq(19, 22, **SIZES,
                                  kernel_initializer=keras.initializers.GlorotUniform(seed=7))
    blocks = seq2seq.get_layer("encoder").blocks
    q0, q1 = (as_np(b.self_attention.query_dense.kernel) for b in blocks)
    assert not np.allclose(q0, q1)


# ---- padding ids, parts, composition ----------------------------------------------------------


def test_pad_id_none_makes_every_id_a_token_and_explicit_masks_still_work():
    with_pad = causal_lm(24, **SIZES)
    no_pad = causal_lm(24, **SIZES, pad_id=None)
    randomize(with_pad)
    no_pad.set_weights(with_pad.get_weights())
    ids = np.array([[2, 0, 6, 7]], "int32")  # 0 inside the sequence
    differs = np.abs(to_np(no_pad(ids)) - to_np(with_pad(ids)))[0, 2:]
    assert differs.max() > 1e-3  # id 0 is attended to without pad_id
    decoder = no_pad.get_layer("decoder")
    explicit = decoder(ids, padding_mask=ids != 0)
    assert_allclose(explicit, with_pad(ids), atol=1e-5)
    shifted = causal_lm(24, **SIZES, pad_id=23)
    shifted.set_weights(with_pad.get_weights())
    real = ids[0] != 0  # a padded position's output still holds its own token's vector
    assert_allclose(to_np(shifted(np.where(ids == 0, 23, ids)))[:, real],
                    to_np(with_pad(ids))[:, real], atol=1e-5)


def test_every_stack_takes_an_explicit_padding_mask_as_pad_id_would_give_it():
    """Encoder, decoder, decoder-only and CMLM stacks take `padding_mask` alike: with
    `pad_id=None` an explicit mask equals the padding `pad_id=0` finds (and differs from no
    mask at all)."""
    ids = np.array([[2, 0, 6, 7], [2, 9, 0, 5]], "int32")  # padding that later tokens see
    memory = np.random.default_rng(3).normal(size=(2, 5, 16)).astype("float32")
    stacks = [
        (ka.models.TransformerEncoder, ()), (ka.models.TransformerDecoder, (memory,)),
        (TransformerDecoderOnly, ()), (CMLMDecoder, (memory,))]
    for cls, extra in stacks:
        block = LLAMA_BLOCK if cls is TransformerDecoderOnly else STACK["block"]
        padded, plain = (cls(24, **dict(STACK, block=block), pad_id=pad_id)
                         for pad_id in (0, None))
        padded(ids, *extra)
        plain(ids, *extra)
        randomize(padded)
        plain.set_weights(padded.get_weights())
        real = ids != 0
        # Column 0: the CMLM never emits its padding id (logit -1e9) only under pad_id=0.
        explicit = to_np(plain(ids, *extra, padding_mask=real))[real][:, 1:]
        assert_allclose(explicit, to_np(padded(ids, *extra))[real][:, 1:], atol=1e-5)
        differs = np.abs(explicit - to_np(plain(ids, *extra))[real][:, 1:])
        assert differs.max() > 1e-4, cls.__name__


def test_the_seq2seq_builders_take_the_same_stack_arguments():
    kwargs = {"activation": "gelu", "layer_norm_epsilon": 1e-6, "pad_id": 1,
              "kernel_initializer": keras.initializers.GlorotUniform(seed=3), "seed": 4}
    seq2seq = transformer_seq2seq(12, 14, **SIZES, dropout=0.0, **kwargs)
    nat = nat_seq2seq(12, 14, **SIZES, dropout=0.0, max_target_length=6, **kwargs)
    for model in (seq2seq, nat):
        for name in ("encoder", "decoder"):
            stack = model.get_layer(name)
            assert (stack.pad_id, stack.block.layer_norm_epsilon, stack.seed) == (1, 1e-6, 4)
            assert keras.activations.serialize(stack.block.activation) == "gelu"
    with pytest.raises(ValueError, match="warp"):
        nat_seq2seq(12, 14, **SIZES, max_target_length=6, warp=1)


def test_a_llama_shaped_stack_with_its_own_head_size_rope_base_and_no_biases(tmp_path):
    attention = AttentionConfig(
        num_heads=4, num_key_value_heads=2, head_dim=8, use_bias=False,
        position_encoding=RotaryEmbedding(max_wavelength=500000.0))
    decoder = TransformerDecoderOnly(
        30, num_layers=1, hidden_dim=16, pad_id=None, block=LLAMA_BLOCK.replace(
            attention=attention, use_bias=False, layer_norm_epsilon=1e-6))
    ids = keras.Input((None,), dtype="int32")
    model = keras.Model(ids, decoder(ids))
    names = [w.path for w in model.weights]
    assert not [n for n in names if n.endswith("bias")]
    query = decoder.blocks[0].self_attention
    assert query.query_dense.kernel.shape == (16, 32) and query.key_dense.kernel.shape == (16, 16)
    assert query.position_encoding.max_wavelength == 500000.0
    assert decoder.blocks[0].ffn_norm.epsilon == 1e-6 and decoder.final_norm.epsilon == 1e-6
    randomize(model)
    path = tmp_path / "llama.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert_allclose(loaded(LM_IDS), model(LM_IDS), atol=1e-6)
    assert loaded.layers[1].blocks[0].self_attention.position_encoding.max_wavelength == 5e5


def test_a_gpt2_shaped_stack_has_a_tied_head_and_tanh_gelu():
    model = causal_lm(30, **SIZES, position_encoding="learned", max_sequence_length=8,
                      norm="layer", activation="gelu_tanh", tie_word_embeddings=True)
    decoder = model.get_layer("decoder")
    assert decoder.output_dense is None and decoder.head.token_embedding is (
        decoder.embedding.token_embedding)
    x = np.linspace(-3, 3, 7).astype("float32")
    gelu = decoder.blocks[0].ffn.hidden_dense.activation
    tanh_gelu = 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))
    assert_allclose(gelu(x), tanh_gelu, atol=1e-6)
    hidden = decoder.final_norm(decoder._run_blocks(decoder.embedding(LM_IDS), LM_IDS != 0,
                                                    None, None, False)[0])
    table = as_np(decoder.embedding.token_embedding.embeddings)
    assert_allclose(model(LM_IDS), as_np(hidden) @ table.T, atol=1e-5)


def test_a_bert_shaped_encoder_by_composition(tmp_path):
    embedding = TokenEmbedding(30, 16, position="learned", max_sequence_length=9,
                               num_segments=2, norm="layer", layer_norm_epsilon=1e-12,
                               name="embedding")
    head = OutputHead(30, tie_word_embeddings=True, transform_activation="gelu",
                      layer_norm_epsilon=1e-12, name="head")
    block = STACK["block"].replace(activation="gelu", layer_norm_epsilon=1e-12)
    encoder = TransformerEncoder(30, **dict(STACK, block=block), embedding=embedding,
                                 head=head)
    ids = keras.Input((None,), dtype="int32")
    segments = keras.Input((None,), dtype="int32")
    model = keras.Model([ids, segments], encoder(ids, token_type_ids=segments))
    randomize(model)
    types = np.array([[0, 0, 1, 1, 1], [0, 1, 1, 0, 0]], "int32")
    logits = as_np(model([SOURCE, types]))
    assert logits.shape == (2, 5, 30)
    assert head.bias is not None and head.output_dense is None
    other = as_np(model([SOURCE, 1 - types]))
    assert not np.allclose(logits, other, atol=1e-3)  # the segments count
    path = tmp_path / "bert.keras"
    model.save(path)
    loaded = keras.saving.load_model(path, safe_mode=True)
    assert_allclose(loaded([SOURCE, types]), logits, atol=1e-5)


@pytest.mark.parametrize("layer_cls, kwargs, inputs, shape", [
    (TokenEmbedding, {"vocabulary_size": 12, "hidden_dim": 8, "position": "learned",
                      "max_sequence_length": 6, "num_segments": 2, "norm": "layer",
                      "dropout": 0.1},
     {"inputs": np.array([[3, 4, 5], [6, 0, 0]], "int32")}, (2, 3, 8)),
    (TokenEmbedding, {"vocabulary_size": 12, "hidden_dim": 8, "position": "sinusoidal",
                      "scale": 2.0}, {"inputs": np.array([[3, 4, 5]], "int32")}, (1, 3, 8)),
    (OutputHead, {"vocabulary_size": 12, "transform_activation": "gelu"},
     {"inputs": np.random.default_rng(0).standard_normal((2, 3, 8)).astype("float32")},
     (2, 3, 12)),
])
def test_the_parts_keep_the_layer_contract(layer_cls, kwargs, inputs, shape, tmp_path):
    run_layer_test(layer_cls, kwargs, inputs, shape, tmp_path)


def test_the_stacks_keep_the_layer_contract(tmp_path):
    run_layer_test(TransformerDecoderOnly,
                   {"vocabulary_size": 11, "num_layers": 1, "hidden_dim": 8,
                    "block": LLAMA_BLOCK.replace(
                        attention=AttentionConfig(2, position_encoding="rope",
                                                  implementation="chunked"),
                        intermediate_dim=16),
                    "tie_word_embeddings": True},
                   {"inputs": np.array([[2, 6, 7], [2, 5, 0]], "int32")}, (2, 3, 11), tmp_path)
    run_layer_test(CMLMDecoder,
                   {"vocabulary_size": 11, "num_layers": 1, "hidden_dim": 8,
                    "block": BlockConfig(AttentionConfig(2, sliding_window=2),
                                         intermediate_dim=16)},
                   {"inputs": np.array([[11, 6, 7], [2, 11, 0]], "int32"),
                    "encoder_outputs": np.random.default_rng(0).standard_normal(
                        (2, 4, 8)).astype("float32")}, (2, 3, 11), tmp_path)


# ---- the decoding contract and the moved names -------------------------------------------------


def test_the_decoders_keep_the_decoding_protocol():
    seq2seq = transformer_seq2seq(19, 22, **SIZES)
    assert isinstance(seq2seq.get_layer("decoder"), Decoder)
    assert isinstance(causal_lm(24, **SIZES).get_layer("decoder"), Decoder)
    assert isinstance(ka.models.bahdanau_seq2seq(9, 9, embedding_dim=4, units=4,
                                                 num_layers=1).get_layer("decoder"), Decoder)
    assert not isinstance(seq2seq.get_layer("encoder"), Decoder)
    with pytest.raises(ValueError, match="contract.Decoder"):
        decoding.compiled.contract_layer(seq2seq, "encoder", "a seq2seq model")


def test_the_moved_stacks_still_come_from_keras_attn_layers_with_a_warning():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for name in ("TransformerEncoder", "TransformerDecoder", "TransformerDecoderOnly",
                     "CMLMDecoder", "LengthPredictor", "BahdanauEncoder", "BahdanauDecoder"):
            assert getattr(ka.layers, name) is getattr(ka.models, name) is getattr(ka, name)
    assert len(caught) == 7
    assert all(issubclass(w.category, DeprecationWarning) for w in caught)
    with pytest.raises(AttributeError):
        ka.layers.NoSuchLayer  # noqa: B018
    registered = keras.saving.get_registered_object("keras_attn>TransformerEncoder")
    assert registered is TransformerEncoder
