"""keras_attn 0.2's names (`keras_attn.layers.legacy`): each still works for one release, warns
once naming today's name, and builds what today's name builds (the same config, the same
outputs with the same weights); given beside today's name it is a ValueError; configs and
`.keras` files of earlier releases load without a warning.

`tests/fixtures/layers_v0.keras` was saved by the 0.1 code (`tests/fixtures/make_layers_v0.py`):
MultiHead with grouped-query heads and RoPE, a gated MultiHead, LocalMultiHead(window=2), linear,
additive, ALiBi and T5 attention, a SwiGLU FFN and the two position-bias layers, with its inputs
and outputs in `layers_v0.npz`. The models of 0.1 and 0.2 are `tests/test_legacy_models.py`'s.
"""

import inspect
import pathlib
import warnings

import keras
import numpy as np
import pytest
from backend_utils import rand, to_np

import keras_attn as ka
from keras_attn import models
from keras_attn.layers import AttentionConfig, BlockConfig

FIXTURES = pathlib.Path(__file__).parent / "fixtures"

X = rand(2, 5, 8)
MEMORY = rand(2, 4, 8)
IDS = np.array([[2, 5, 6, 7, 0], [2, 9, 4, 0, 0]], "int32")
SOURCE = np.array([[5, 6, 7, 0], [8, 4, 0, 0]], "int32")
IMAGES = rand(2, 4, 4, 3)
GRU_STATES = (rand(2, 4, 8), [rand(2, 8)])
# keras_attn 0.2's decoder-only defaults, which a BlockConfig now says.
LLAMA = {"activation": "swiglu", "norm": "rms", "normalize_first": True}
ROPE = {"position_encoding": "rope"}
STACK = {"num_layers": 1, "hidden_dim": 8}
LM = {"num_layers": 1, "hidden_dim": 8, "num_heads": 2, "intermediate_dim": 16}


def flat_stack(**extra):
    """A stack's arguments of keras_attn 0.2."""
    return dict(vocab_size=12, num_layers=1, embed_dim=8, num_heads=2, ffn_dim=16, **extra)


def encoder_block(*args, **kwargs):
    return ka.TransformerEncoderBlock(*args, name="block", **kwargs)


def decoder_only(**kwargs):
    """A decoder-only stack of today's `block`, with `kwargs`."""
    return models.TransformerDecoderOnly(12, 1, 8, BlockConfig(2, 16), **kwargs)


# (earlier spelling, today's, the call's inputs, what the warning says)
RENAMED = [
    # The blocks: every earlier argument, one at a time.
    pytest.param(lambda: encoder_block(num_heads=2, intermediate_dim=16),
                 lambda: encoder_block(AttentionConfig(num_heads=2), 16),
                 (X,), "`num_heads` is a field of `attention`", id="block-num_heads"),
    pytest.param(lambda: encoder_block(2, ffn_dim=16), lambda: encoder_block(2, 16), (X,),
                 "`ffn_dim` is `intermediate_dim`", id="block-ffn_dim"),
    pytest.param(lambda: encoder_block(2, 16, norm_first=True),
                 lambda: encoder_block(2, 16, normalize_first=True), (X,),
                 "`norm_first` is `normalize_first`", id="block-norm_first"),
    pytest.param(lambda: encoder_block(2, 16, epsilon=1e-3),
                 lambda: encoder_block(2, 16, layer_norm_epsilon=1e-3), (X,),
                 "`epsilon` is `layer_norm_epsilon`", id="block-epsilon"),
    pytest.param(lambda: encoder_block(2, 16, num_key_value_heads=1, head_dim=4,
                                       position_encoding="rope"),
                 lambda: encoder_block(AttentionConfig(2, num_key_value_heads=1, head_dim=4,
                                                       position_encoding="rope"), 16),
                 (X,), "`num_key_value_heads` is a field of `attention`",
                 id="block-heads-and-positions"),
    pytest.param(lambda: encoder_block(2, 16, implementation="chunked", chunk_size=2),
                 lambda: encoder_block(AttentionConfig(2, implementation="chunked",
                                                       chunk_size=2), 16),
                 (X,), "`implementation` is a field of `attention`", id="block-kernel"),
    pytest.param(lambda: encoder_block(2, 16, sliding_window=2),
                 lambda: encoder_block(AttentionConfig(2, sliding_window=2), 16), (X,),
                 "`sliding_window` is a field of `attention`", id="block-sliding_window"),
    pytest.param(lambda: encoder_block(2, 16, attention_window=2),
                 lambda: encoder_block(AttentionConfig(2, sliding_window=3), 16), (X,),
                 "sliding_window=3", id="block-attention_window"),
    pytest.param(lambda: encoder_block(2, 16, use_bias=("query", "value", "ffn")),
                 lambda: encoder_block(AttentionConfig(2, use_bias=("query", "value")), 16,
                                       use_bias=True),
                 (X,), "`use_bias` naming parts is `attention.use_bias`", id="block-use_bias"),
    pytest.param(lambda: encoder_block(2, 16, gated_ffn=True, activation="gelu"),
                 lambda: encoder_block(2, 16, activation="geglu"), (X,),
                 "gated activation name", id="block-gated_ffn"),
    pytest.param(lambda: ka.TransformerDecoderBlock(num_heads=2, ffn_dim=16, name="block"),
                 lambda: ka.TransformerDecoderBlock(AttentionConfig(2), 16, name="block"),
                 (X, MEMORY), "`ffn_dim` is `intermediate_dim`", id="decoder-block"),
    pytest.param(lambda: ka.TransformerDecoderOnlyBlock(2, 16, gated_ffn=True,
                                                        activation="silu", name="block"),
                 lambda: ka.TransformerDecoderOnlyBlock(2, 16, activation="swiglu",
                                                        name="block"),
                 (X,), "gated activation name", id="decoder-only-block"),
    # The stacks: keras_attn 0.2's flat arguments make the `block` (one warning).
    pytest.param(lambda: models.TransformerEncoder(**flat_stack(norm_first=True, epsilon=1e-3)),
                 lambda: models.TransformerEncoder(12, **STACK, block=BlockConfig(
                     2, 16, normalize_first=True, layer_norm_epsilon=1e-3)),
                 (IDS,), "`vocab_size` is `vocabulary_size`", id="encoder"),
    pytest.param(lambda: models.TransformerDecoder(**flat_stack(dropout=0.1,
                                                                sliding_window=2)),
                 lambda: models.TransformerDecoder(12, **STACK, block=BlockConfig(
                     AttentionConfig(2, sliding_window=2), 16, dropout=0.1)),
                 (IDS, MEMORY), "`embed_dim` is `hidden_dim`", id="decoder"),
    pytest.param(lambda: models.CMLMDecoder(**flat_stack(gated_ffn=True, activation="relu")),
                 lambda: models.CMLMDecoder(12, **STACK, block=BlockConfig(
                     2, 16, activation="reglu")),
                 (IDS, MEMORY), "`ffn_dim` is `intermediate_dim`", id="cmlm-decoder"),
    pytest.param(lambda: models.TransformerDecoderOnly(**flat_stack()),
                 lambda: models.TransformerDecoderOnly(12, **STACK, block=BlockConfig(
                     AttentionConfig(2, **ROPE), 16, **LLAMA)),
                 (IDS,), "`num_heads` is a field of `attention`", id="decoder-only-defaults"),
    pytest.param(lambda: models.TransformerDecoderOnly(
                     **flat_stack(use_bias=("query", "key", "value"), num_key_value_heads=1)),
                 lambda: models.TransformerDecoderOnly(12, **STACK, block=BlockConfig(
                     AttentionConfig(2, num_key_value_heads=1, use_bias=("query", "key",
                                                                         "value"), **ROPE),
                     16, use_bias=False, **LLAMA)),
                 (IDS,), "`use_bias` is `attention.use_bias`", id="decoder-only-qwen"),
    pytest.param(lambda: decoder_only(tie_embeddings=True),
                 lambda: decoder_only(tie_word_embeddings=True), (IDS,),
                 "`tie_embeddings` is `tie_word_embeddings`", id="decoder-only-tie_embeddings"),
    pytest.param(lambda: decoder_only(position_encoding="learned", max_sequence_length=6),
                 lambda: decoder_only(position_embedding="learned", max_sequence_length=6),
                 (IDS,), "`position_encoding` is `position_embedding`",
                 id="decoder-only-position_encoding"),
    pytest.param(lambda: decoder_only(position_embedding="learned", max_length=6),
                 lambda: decoder_only(position_embedding="learned", max_sequence_length=6),
                 (IDS,), "`max_length` is `max_sequence_length`", id="decoder-only-max_length"),
    # The builders: today's flat keywords, one earlier name at a time.
    pytest.param(lambda: models.causal_lm(vocab_size=12, **LM),
                 lambda: models.causal_lm(vocabulary_size=12, **LM), (IDS,),
                 "`vocab_size` is `vocabulary_size`", id="causal_lm-vocab_size"),
    pytest.param(lambda: models.causal_lm(12, 1, embed_dim=8, num_heads=2, intermediate_dim=16),
                 lambda: models.causal_lm(12, **LM), (IDS,), "`embed_dim` is `hidden_dim`",
                 id="causal_lm-embed_dim"),
    pytest.param(lambda: models.causal_lm(12, 1, 8, 2, ffn_dim=16),
                 lambda: models.causal_lm(12, **LM), (IDS,), "`ffn_dim` is `intermediate_dim`",
                 id="causal_lm-ffn_dim"),
    pytest.param(lambda: models.causal_lm(12, **LM, norm_first=False, epsilon=1e-3),
                 lambda: models.causal_lm(12, **LM, normalize_first=False,
                                          layer_norm_epsilon=1e-3),
                 (IDS,), "`norm_first` is `normalize_first`", id="causal_lm-norms"),
    pytest.param(lambda: models.causal_lm(12, **LM, tie_embeddings=True),
                 lambda: models.causal_lm(12, **LM, tie_word_embeddings=True), (IDS,),
                 "`tie_embeddings` is `tie_word_embeddings`", id="causal_lm-tie_embeddings"),
    pytest.param(lambda: models.causal_lm(12, **LM, position_encoding="learned", max_length=6),
                 lambda: models.causal_lm(12, **LM, position_encoding="learned",
                                          max_sequence_length=6),
                 (IDS,), "`max_length` is `max_sequence_length`", id="causal_lm-max_length"),
    pytest.param(lambda: models.causal_lm(12, **LM, gated_ffn=True, activation="gelu_tanh"),
                 lambda: models.causal_lm(12, **LM, activation="geglu_tanh"), (IDS,),
                 "gated activation name", id="causal_lm-gated_ffn"),
    pytest.param(lambda: models.causal_lm(12, **LM, attention_window=2),
                 lambda: models.causal_lm(12, **LM, sliding_window=3), (IDS,),
                 "sliding_window=3", id="causal_lm-attention_window"),
    pytest.param(lambda: models.transformer_seq2seq(source_vocab_size=12,
                                                    target_vocab_size=14, **LM),
                 lambda: models.transformer_seq2seq(source_vocabulary_size=12,
                                                    target_vocabulary_size=14, **LM),
                 ([SOURCE, IDS],), "`source_vocab_size` is `source_vocabulary_size`",
                 id="transformer_seq2seq-vocab_size"),
    pytest.param(lambda: models.nat_seq2seq(12, 14, 1, embed_dim=8, num_heads=2, ffn_dim=16,
                                            norm_first=True, max_target_length=5),
                 lambda: models.nat_seq2seq(12, 14, **LM, normalize_first=True,
                                            max_target_length=5),
                 ([SOURCE, IDS],), "`embed_dim` is `hidden_dim`", id="nat_seq2seq"),
    pytest.param(lambda: models.bahdanau_seq2seq(source_vocab_size=12, target_vocab_size=14,
                                                 embed_dim=4, units=8, num_layers=1),
                 lambda: models.bahdanau_seq2seq(12, 14, embedding_dim=4, units=8,
                                                 num_layers=1),
                 ([SOURCE, IDS],), "`embed_dim` is `embedding_dim`", id="bahdanau_seq2seq"),
    # The layers.
    pytest.param(lambda: ka.MultiHead(2, 4, output_dim=6, name="layer"),
                 lambda: ka.MultiHead(2, 4, output_shape=6, name="layer"), (X,),
                 "`output_dim=n` is `output_shape=n`", id="MultiHead-output_dim"),
    pytest.param(lambda: ka.LocalMultiHead(2, 4, window=2, name="layer"),
                 lambda: ka.LocalMultiHead(2, 4, sliding_window=3, name="layer"), (X,),
                 "sliding_window=d \\+ 1", id="LocalMultiHead-window"),
    pytest.param(lambda: ka.FFN(hidden_dim=16, name="layer"),
                 lambda: ka.FFN(intermediate_dim=16, name="layer"), (X,),
                 "`hidden_dim` is `intermediate_dim`", id="FFN-hidden_dim"),
    pytest.param(lambda: ka.TokenEmbedding(vocab_size=12, embed_dim=8, position="learned",
                                           sequence_length=6, norm="layer", epsilon=1e-3,
                                           name="layer"),
                 lambda: ka.TokenEmbedding(vocabulary_size=12, hidden_dim=8, position="learned",
                                           max_sequence_length=6, norm="layer",
                                           layer_norm_epsilon=1e-3, name="layer"),
                 (IDS,), "`sequence_length` is `max_sequence_length`", id="TokenEmbedding"),
    pytest.param(lambda: ka.TokenAndPositionEmbedding(vocab_size=12, sequence_length=6,
                                                      embedding_dim=8, name="layer"),
                 lambda: ka.TokenAndPositionEmbedding(vocabulary_size=12, sequence_length=6,
                                                      embedding_dim=8, name="layer"),
                 (IDS,), "`vocab_size` is `vocabulary_size`", id="TokenAndPositionEmbedding"),
    pytest.param(lambda: ka.OutputHead(vocab_size=12, transform_activation="gelu",
                                       epsilon=1e-3, name="layer"),
                 lambda: ka.OutputHead(vocabulary_size=12, transform_activation="gelu",
                                       layer_norm_epsilon=1e-3, name="layer"),
                 (X,), "`epsilon` is `layer_norm_epsilon`", id="OutputHead"),
    pytest.param(lambda: ka.PatchEmbedding(2, embed_dim=8, epsilon=1e-3, name="layer"),
                 lambda: ka.PatchEmbedding(2, hidden_dim=8, layer_norm_epsilon=1e-3,
                                           name="layer"),
                 (IMAGES,), "`embed_dim` is `hidden_dim`", id="PatchEmbedding"),
    pytest.param(lambda: models.LengthPredictor(max_length=6, name="layer"),
                 lambda: models.LengthPredictor(max_target_length=6, name="layer"), (MEMORY,),
                 "`max_length` is `max_target_length`", id="LengthPredictor"),
    pytest.param(lambda: models.BahdanauEncoder(vocab_size=12, embed_dim=4, units=8,
                                                name="layer"),
                 lambda: models.BahdanauEncoder(vocabulary_size=12, embedding_dim=4, units=8,
                                                name="layer"),
                 (IDS,), "`vocab_size` is `vocabulary_size`", id="BahdanauEncoder"),
    pytest.param(lambda: models.BahdanauDecoder(12, embed_dim=4, units=8, name="layer"),
                 lambda: models.BahdanauDecoder(12, embedding_dim=4, units=8, name="layer"),
                 (IDS, GRU_STATES), "`embed_dim` is `embedding_dim`", id="BahdanauDecoder"),
]


def deprecations(caught) -> list:
    return [w for w in caught if issubclass(w.category, DeprecationWarning)]


def configs(layer) -> list:
    """The configs that make `layer`: its own but its name, or a functional model's layers'
    (whose order and names are the builder's)."""
    if isinstance(layer, keras.Model):
        return [part.get_config() for part in layer.layers]
    return [{key: value for key, value in layer.get_config().items() if key != "name"}]


@pytest.mark.parametrize("old, new, inputs, message", RENAMED)
def test_an_earlier_name_warns_once_and_builds_what_todays_name_builds(old, new, inputs,
                                                                       message):
    with pytest.deprecated_call(match=message) as caught:
        before = old()
    assert len(deprecations(caught)) == 1, [str(w.message) for w in caught]
    after = new()  # today's names: no warning (setup.cfg makes one an error)
    assert configs(before) == configs(after)
    before(*inputs)
    after(*inputs)
    after.set_weights(before.get_weights())
    for got, want in zip(keras.tree.flatten(after(*inputs)), keras.tree.flatten(before(*inputs))):
        np.testing.assert_array_equal(to_np(got), to_np(want))


# An earlier name beside today's (given by position, or as a keyword).
BOTH = [
    pytest.param(lambda: encoder_block(2, 16, ffn_dim=16), "ffn_dim", id="block-ffn_dim"),
    pytest.param(lambda: encoder_block(2, 16, normalize_first=True, norm_first=True),
                 "norm_first", id="block-norm_first"),
    pytest.param(lambda: encoder_block(2, 16, layer_norm_epsilon=1e-3, epsilon=1e-3),
                 "epsilon", id="block-epsilon"),
    pytest.param(lambda: encoder_block(AttentionConfig(2), 16, num_heads=4), "num_heads",
                 id="block-num_heads"),
    pytest.param(lambda: encoder_block(AttentionConfig(2, sliding_window=3), 16,
                                       attention_window=4), "sliding_window",
                 id="block-attention_window"),
    pytest.param(lambda: models.TransformerEncoder(12, 1, 8, BlockConfig(2, 16), vocab_size=12),
                 "vocab_size", id="stack-vocab_size"),
    pytest.param(lambda: models.TransformerDecoder(12, 1, 8, BlockConfig(2, 16), embed_dim=8),
                 "embed_dim", id="stack-embed_dim"),
    pytest.param(lambda: models.CMLMDecoder(12, 1, 8, BlockConfig(2, 16), ffn_dim=16),
                 "`block` only", id="stack-block-and-flat"),
    pytest.param(lambda: decoder_only(tie_word_embeddings=True, tie_embeddings=True),
                 "tie_embeddings", id="stack-tie_embeddings"),
    pytest.param(lambda: decoder_only(max_sequence_length=6, max_length=6),
                 "max_length", id="stack-max_length"),
    pytest.param(lambda: decoder_only(position_embedding="learned", position_encoding="learned",
                                      max_sequence_length=6),
                 "position_encoding", id="stack-position_encoding"),
    pytest.param(lambda: models.causal_lm(vocabulary_size=12, vocab_size=12), "vocab_size",
                 id="causal_lm-vocab_size"),
    pytest.param(lambda: models.causal_lm(12, hidden_dim=16, embed_dim=16), "embed_dim",
                 id="causal_lm-embed_dim"),
    pytest.param(lambda: models.causal_lm(12, intermediate_dim=16, ffn_dim=16), "ffn_dim",
                 id="causal_lm-ffn_dim"),
    pytest.param(lambda: models.causal_lm(12, normalize_first=False, norm_first=False),
                 "norm_first", id="causal_lm-norm_first"),
    pytest.param(lambda: models.causal_lm(12, tie_word_embeddings=True, tie_embeddings=True),
                 "tie_embeddings", id="causal_lm-tie_embeddings"),
    pytest.param(lambda: models.causal_lm(12, position_encoding="learned",
                                          max_sequence_length=6, max_length=6),
                 "max_length", id="causal_lm-max_length"),
    pytest.param(lambda: models.causal_lm(12, sliding_window=3, attention_window=2),
                 "attention_window", id="causal_lm-attention_window"),
    pytest.param(lambda: models.transformer_seq2seq(12, 14, target_vocab_size=14),
                 "target_vocab_size", id="transformer_seq2seq-target_vocab_size"),
    pytest.param(lambda: models.nat_seq2seq(12, 14, hidden_dim=16, embed_dim=16,
                                            max_target_length=5),
                 "embed_dim", id="nat_seq2seq-embed_dim"),
    pytest.param(lambda: models.bahdanau_seq2seq(12, 14, embedding_dim=4, embed_dim=4),
                 "embed_dim", id="bahdanau_seq2seq-embed_dim"),
    pytest.param(lambda: models.BahdanauEncoder(12, 4, 8, vocab_size=12), "vocab_size",
                 id="BahdanauEncoder-vocab_size"),
    pytest.param(lambda: ka.MultiHead(4, 4, output_dim=5, output_shape=(6,)), "output_shape",
                 id="MultiHead-output_dim"),
    pytest.param(lambda: ka.LocalMultiHead(4, 4, window=2, sliding_window=4), "sliding_window",
                 id="LocalMultiHead-window"),
    pytest.param(lambda: ka.FFN(16, hidden_dim=16), "hidden_dim", id="FFN-hidden_dim"),
    pytest.param(lambda: ka.TokenEmbedding(12, 8, vocab_size=12), "vocab_size",
                 id="TokenEmbedding-vocab_size"),
    pytest.param(lambda: ka.TokenEmbedding(12, 8, position="learned", max_sequence_length=6,
                                           sequence_length=6),
                 "sequence_length", id="TokenEmbedding-sequence_length"),
    pytest.param(lambda: ka.TokenAndPositionEmbedding(12, 6, 8, vocab_size=12), "vocab_size",
                 id="TokenAndPositionEmbedding-vocab_size"),
    pytest.param(lambda: ka.OutputHead(12, tie_word_embeddings=True, tie_embeddings=True),
                 "tie_embeddings", id="OutputHead-tie_embeddings"),
    pytest.param(lambda: ka.PatchEmbedding(2, 8, embed_dim=8), "embed_dim",
                 id="PatchEmbedding-embed_dim"),
    pytest.param(lambda: models.LengthPredictor(6, max_length=6), "max_length",
                 id="LengthPredictor-max_length"),
    # Today's name given with its default value: the earlier name won silently.
    pytest.param(lambda: models.causal_lm(12, hidden_dim=default(models.causal_lm, "hidden_dim"),
                                          embed_dim=16), "embed_dim",
                 id="causal_lm-embed_dim-default"),
    pytest.param(lambda: models.causal_lm(12, 2, default(models.causal_lm, "hidden_dim"),
                                          embed_dim=16), "embed_dim",
                 id="causal_lm-embed_dim-default-positional"),
    pytest.param(lambda: models.causal_lm(12, max_sequence_length=None, max_length=8),
                 "max_length", id="causal_lm-max_length-default"),
    pytest.param(lambda: models.transformer_seq2seq(
        12, 14, hidden_dim=default(models.transformer_seq2seq, "hidden_dim"), embed_dim=16),
        "embed_dim", id="transformer_seq2seq-embed_dim-default"),
    pytest.param(lambda: models.bahdanau_seq2seq(
        12, 14, embedding_dim=default(models.bahdanau_seq2seq, "embedding_dim"), embed_dim=4),
        "embed_dim", id="bahdanau_seq2seq-embed_dim-default"),
    # The same for the layers' and stacks' constructors (subclasses included).
    pytest.param(lambda: ka.TokenEmbedding(vocab_size=12, vocabulary_size=None, hidden_dim=8),
                 "vocab_size", id="TokenEmbedding-vocab_size-default"),
    pytest.param(lambda: ka.TokenAndPositionEmbedding(vocabulary_size=None, sequence_length=6,
                                                      embedding_dim=8, vocab_size=12),
                 "vocab_size", id="TokenAndPositionEmbedding-vocab_size-default"),
    pytest.param(lambda: ka.OutputHead(12, tie_word_embeddings=False, tie_embeddings=True),
                 "tie_embeddings", id="OutputHead-tie_embeddings-default"),
    pytest.param(lambda: ka.PatchEmbedding(2, hidden_dim=None, embed_dim=8), "embed_dim",
                 id="PatchEmbedding-embed_dim-default"),
    pytest.param(lambda: ka.TransformerEncoderBlock(ka.AttentionConfig(num_heads=2), None,
                                                    ffn_dim=16), "ffn_dim",
                 id="TransformerEncoderBlock-ffn_dim-default"),
    pytest.param(lambda: ka.TransformerDecoderBlock(ka.AttentionConfig(num_heads=2), 16,
                                                    layer_norm_epsilon=1e-5, epsilon=1e-6),
                 "epsilon", id="TransformerDecoderBlock-epsilon-default"),
    pytest.param(lambda: ka.TransformerDecoderOnlyBlock(ka.AttentionConfig(num_heads=2), 16,
                                                        normalize_first=None, norm_first=True),
                 "norm_first", id="TransformerDecoderOnlyBlock-norm_first-default"),
    pytest.param(lambda: models.BahdanauEncoder(vocabulary_size=None, embedding_dim=4,
                                                hidden_dim=4, vocab_size=12), "vocab_size",
                 id="BahdanauEncoder-vocab_size-default"),
]


def default(function, name):
    return inspect.signature(function).parameters[name].default


@pytest.mark.parametrize("make, name", BOTH)
def test_an_earlier_name_beside_todays_is_refused(make, name):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # some warn before they refuse
        with pytest.raises(ValueError, match=name):
            make()


# keras_attn 0.2's configs (flat arguments), loaded as a `.keras` file loads them.
CONFIGS = [
    pytest.param(ka.TransformerEncoderBlock,
                 {"num_heads": 2, "ffn_dim": 16, "norm_first": True, "epsilon": 1e-3,
                  "use_bias": ["query", "value", "ffn"], "gated_ffn": True,
                  "activation": "gelu", "attention_window": None, "sliding_window": 2,
                  "position_encoding": "rope"},
                 {"attention": AttentionConfig(2, use_bias=("query", "value"),
                                               sliding_window=2, position_encoding="rope"),
                  "intermediate_dim": 16, "normalize_first": True, "layer_norm_epsilon": 1e-3,
                  "activation": "geglu"},
                 (X,), id="encoder-block"),
    pytest.param(models.TransformerDecoderOnly,
                 {"vocab_size": 12, "num_layers": 1, "embed_dim": 8, "num_heads": 2,
                  "ffn_dim": 16, "position_encoding": "learned", "max_length": 6,
                  "tie_embeddings": True, "num_key_value_heads": 1, "norm": "layer",
                  "attention_window": None},
                 {"vocabulary_size": 12, **STACK, "position_embedding": "learned",
                  "max_sequence_length": 6, "tie_word_embeddings": True,
                  "block": BlockConfig(AttentionConfig(2, num_key_value_heads=1), 16,
                                       **dict(LLAMA, norm="layer"))},
                 (IDS,), id="decoder-only"),
    pytest.param(models.TransformerEncoder,
                 {"vocab_size": 12, "num_layers": 1, "embed_dim": 8, "num_heads": 2,
                  "ffn_dim": 16, "implementation": "chunked", "chunk_size": 2},
                 {"vocabulary_size": 12, **STACK, "block": BlockConfig(
                     AttentionConfig(2, implementation="chunked", chunk_size=2), 16)},
                 (IDS,), id="encoder"),
    pytest.param(models.LengthPredictor, {"max_length": 6}, {"max_target_length": 6},
                 (MEMORY,), id="length-predictor"),
    pytest.param(ka.TokenEmbedding, {"vocab_size": 12, "embed_dim": 8, "epsilon": 1e-3,
                                     "norm": "layer"},
                 {"vocabulary_size": 12, "hidden_dim": 8, "layer_norm_epsilon": 1e-3,
                  "norm": "layer"}, (IDS,), id="token-embedding"),
]


@pytest.mark.parametrize("cls, earlier, today, inputs", CONFIGS)
def test_an_earlier_config_loads_without_a_warning_as_todays_arguments(cls, earlier, today,
                                                                       inputs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        loaded = cls.from_config(dict(earlier, name="layer"))
    assert not deprecations(caught), [str(w.message) for w in caught]
    assert loaded.get_config() == cls(**today, name="layer").get_config()
    assert keras.tree.flatten(loaded(*inputs))  # it runs


def test_the_previous_release_file_loads_without_a_warning_with_the_same_outputs():
    data = np.load(FIXTURES / "layers_v0.npz")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = keras.saving.load_model(FIXTURES / "layers_v0.keras", safe_mode=True)
    assert not deprecations(caught), [str(w.message) for w in caught]
    inputs = {name[len("input_"):]: data[name] for name in data if name.startswith("input_")}
    outputs = model(inputs)
    for i, got in enumerate(outputs):
        np.testing.assert_allclose(to_np(got), data[f"output_{i}"], rtol=1e-5, atol=1e-5)
    assert model.get_layer("local").sliding_window == 3  # window=2: |p - j| <= 2
    assert model.get_layer("local").get_config()["attention"]["sliding_window"] == 3


def test_deprecations_name_the_line_of_the_user_who_asked():
    """Warnings attributed to keras_attn's own files are hidden by Python's default filters:
    `causal_lm(attention_window=)` warned from inside the stack, so its users never saw it."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ka.models.causal_lm(20, num_layers=1, embed_dim=8, num_heads=2, ffn_dim=8,
                            attention_window=2)
        ka.layers.LocalMultiHead(2, 4, window=2)
        ka.TransformerEncoderBlock(2, 8, use_bias=("query", "ffn"))
        ka.layers.TransformerEncoder  # noqa: B018 (the moved name, deprecated)
    assert len(deprecations(caught)) >= 4
    assert {w.filename for w in deprecations(caught)} == {__file__}
