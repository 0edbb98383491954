"""The configuration objects (`keras_attn.layers.config`): `AttentionConfig` and `BlockConfig`
check every field where they are made, round-trip through their configs, through the configs of
the blocks and stacks that hold them and through `.keras` files, and reach every attention
layer of a stack unchanged; the constructors stay short."""

import dataclasses
import inspect
import json

import keras
import numpy as np
import pytest
from backend_utils import rand, randomize, to_np

import keras_attn as ka
from keras_attn import models
from keras_attn.layers import AttentionConfig, BlockConfig
from keras_attn.ops import IMPLEMENTATIONS

IDS = np.array([[2, 5, 6, 7, 0], [2, 9, 4, 0, 0]], "int32")
MEMORY = rand(2, 4, 16)
# Every field away from its default (those that go together, together).
FULL_ATTENTION = AttentionConfig(
    num_heads=4, num_key_value_heads=2, head_dim=8, use_bias=("query", "key", "value"),
    position_encoding=ka.RotaryEmbedding(max_wavelength=500), implementation="local",
    flash_attention=False, sliding_window=3, soft_cap=30.0, use_gate=True)
FULL_BLOCK = BlockConfig(FULL_ATTENTION, intermediate_dim=24, activation="swiglu",
                         use_bias=False, normalize_first=True, norm="rms",
                         layer_norm_epsilon=1e-6, dropout=0.1)


@pytest.mark.parametrize("fields, name", [
    ({"num_heads": 0}, "num_heads"),
    ({"num_heads": 2.5}, "num_heads"),
    ({"num_heads": 4, "num_key_value_heads": 3}, "num_key_value_heads"),
    ({"num_key_value_heads": 0}, "num_key_value_heads"),
    ({"head_dim": 0}, "head_dim"),
    ({"use_bias": ("query", "ffn")}, "use_bias"),
    ({"use_bias": 1}, "use_bias"),
    ({"position_encoding": "sinusoidal"}, "position_encoding"),
    ({"position_encoding": ka.Dropout(0.1)}, "position_encoding"),
    ({"implementation": "flash"}, "implementation"),
    ({"chunk_size": 8}, "chunk_size"),
    ({"implementation": "chunked", "chunk_size": 0}, "chunk_size"),
    ({"implementation": "local"}, "sliding_window"),
    ({"flash_attention": "yes"}, "flash_attention"),
    ({"sliding_window": 0}, "sliding_window"),
    ({"soft_cap": 0.0}, "soft_cap"),
    ({"soft_cap": -1.0}, "soft_cap"),
    ({"soft_cap": float("nan")}, "soft_cap"),
    ({"use_gate": 1}, "use_gate"),
    ({"add_bias_kv": "no"}, "add_bias_kv"),
    ({"add_zero_attn": None}, "add_zero_attn"),
])
def test_every_attention_field_is_checked_where_the_configuration_is_made(fields, name):
    with pytest.raises(ValueError, match=f"`{name}"):
        AttentionConfig(**fields)
    with pytest.raises(ValueError, match=f"`{name}"):  # and where a copy is made
        AttentionConfig(num_heads=4).replace(**fields)


def test_a_bad_kernel_lists_the_dispatchs_kernels():
    with pytest.raises(ValueError, match="implementation") as error:
        AttentionConfig(implementation="flash")
    assert all(repr(kernel) in str(error.value) for kernel in IMPLEMENTATIONS)


@pytest.mark.parametrize("fields, name", [
    ({"attention": AttentionConfig()}, "num_heads"),
    ({"attention": "four"}, "attention"),
    ({"attention": {"heads": 2}}, "heads"),
    ({"attention": True}, "attention"),
    ({"intermediate_dim": 0}, "intermediate_dim"),
    ({"activation": "nope"}, "activation"),
    ({"use_bias": ("query",)}, "use_bias"),
    ({"normalize_first": 1}, "normalize_first"),
    ({"norm": "batch"}, "norm"),
    ({"layer_norm_epsilon": 0}, "layer_norm_epsilon"),
    ({"layer_norm_epsilon": float("inf")}, "layer_norm_epsilon"),
    ({"dropout": 1.0}, "dropout"),
    ({"dropout": -0.1}, "dropout"),
    ({"attention": AttentionConfig(2, implementation="chunked"), "dropout": 0.1},
     "implementation"),
])
def test_every_block_field_is_checked_where_the_configuration_is_made(fields, name):
    with pytest.raises(ValueError, match=name):
        BlockConfig(**{"attention": 2, "intermediate_dim": 16, **fields})


@pytest.mark.parametrize("config", [AttentionConfig(), AttentionConfig(num_heads=2),
                                    FULL_ATTENTION], ids=["defaults", "heads", "every-field"])
def test_the_attention_configuration_round_trips_through_its_config(config):
    saved = json.loads(json.dumps(config.get_config()))  # JSON-able: what a file holds
    assert AttentionConfig.from_config(saved) == config
    assert AttentionConfig.coerce(saved) == config
    assert set(saved) == {f.name for f in dataclasses.fields(config)
                          if getattr(config, f.name) != f.default}


def test_the_block_configuration_round_trips_through_its_config():
    saved = json.loads(json.dumps(FULL_BLOCK.get_config()))
    assert BlockConfig.from_config(saved) == FULL_BLOCK
    assert BlockConfig.coerce(saved) == FULL_BLOCK
    assert BlockConfig.coerce(FULL_BLOCK) is FULL_BLOCK
    assert AttentionConfig.coerce(4) == AttentionConfig(num_heads=4)


def test_blocks_and_stacks_round_trip_their_configuration():
    block = ka.TransformerDecoderOnlyBlock(FULL_ATTENTION, 24, activation="swiglu",
                                           norm="rms", layer_norm_epsilon=1e-6, dropout=0.1)
    revived = ka.TransformerDecoderOnlyBlock.from_config(block.get_config())
    assert revived.config == block.config
    assert revived.attention == FULL_ATTENTION
    stack = models.TransformerDecoder(12, 1, 16, FULL_BLOCK)
    assert models.TransformerDecoder.from_config(stack.get_config()).block == FULL_BLOCK


def test_a_saved_stack_loads_with_its_configuration_and_its_outputs(tmp_path):
    block = FULL_BLOCK.replace(dropout=0.0)
    ids = keras.Input((None,), dtype="int32")
    decoder = models.TransformerDecoderOnly(12, 2, 16, block, pad_id=None)
    model = keras.Model(ids, decoder(ids))
    randomize(model)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras", safe_mode=True)
    assert loaded.get_layer(decoder.name).block == block
    np.testing.assert_array_equal(to_np(loaded(IDS)), to_np(model(IDS)))


@pytest.mark.parametrize("stack", [models.TransformerEncoder, models.TransformerDecoder,
                                   models.CMLMDecoder, models.TransformerDecoderOnly])
def test_the_same_attention_configuration_reaches_every_attention_layer(stack):
    attention = AttentionConfig(num_heads=2, num_key_value_heads=1, position_encoding="rope",
                                sliding_window=3, soft_cap=20.0, use_bias=("query", "value"))
    block = BlockConfig(attention, intermediate_dim=16)
    layer = stack(12, 2, 16, block)
    layer(IDS, *([MEMORY] if stack in (models.TransformerDecoder, models.CMLMDecoder) else []))
    assert layer.block is block
    for each in layer.blocks:
        assert each.config is block and each.attention is attention
        assert each.self_attention.config is attention  # passed down unchanged
        cross = getattr(each, "cross_attention", None)
        if cross is not None:  # no positions or window across two sequences
            assert cross.config == attention.for_cross_attention()
            assert cross.config.position_encoding is None and cross.sliding_window is None


def test_a_builder_passes_a_whole_configuration_unchanged():
    attention = AttentionConfig(num_heads=2, position_encoding="rope", num_key_value_heads=1)
    model = models.causal_lm(12, num_layers=2, hidden_dim=16, intermediate_dim=16,
                             attention=attention)
    for block in model.get_layer("decoder").blocks:
        assert block.self_attention.config is attention
    with pytest.raises(ValueError, match="num_key_value_heads"):
        models.causal_lm(12, attention=attention, num_key_value_heads=2)


def test_a_multi_head_argument_and_its_configuration_agree_or_are_refused():
    attention = AttentionConfig(sliding_window=3, soft_cap=10.0)
    agreeing = ka.MultiHead(2, 4, attention=attention, sliding_window=3)
    assert agreeing.sliding_window == 3 and agreeing.config.soft_cap == 10.0
    assert agreeing.config == attention.replace(num_heads=2)
    for arguments, name in (({"sliding_window": 4}, "sliding_window"),
                            ({"num_heads": 4, "attention": AttentionConfig(2)}, "num_heads"),
                            ({"key_dim": 8, "attention": AttentionConfig(head_dim=4)},
                             "key_dim")):
        with pytest.raises(ValueError, match=name):
            ka.MultiHead(**{"num_heads": 2, "key_dim": 4, "attention": attention,
                            **arguments})
    whole = AttentionConfig(num_heads=2, head_dim=4, sliding_window=3)
    assert ka.MultiHead(2, 4, attention=whole, sliding_window=3).config is whole


def test_a_stack_takes_its_block_configuration_as_a_dict():
    saved = json.loads(json.dumps(FULL_BLOCK.get_config()))
    stack = models.TransformerEncoder(12, 1, 16, block=saved)
    assert stack.block == FULL_BLOCK
    block = ka.TransformerEncoderBlock(saved["attention"], 24)
    assert block.attention == FULL_ATTENTION
    with pytest.raises(ValueError, match="block"):
        models.TransformerEncoder(12, 1, 16, block={"attention": 2, "ffn_dim": 16})


def constructor_arguments(cls) -> set:
    """The named arguments of `cls(...)`: its `__init__`'s and those of the keras_attn parents
    it passes `*args`/`**kwargs` on to (Keras' base layer's `name`, `dtype`, ... aside)."""
    names = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("keras_attn") or "__init__" not in vars(klass):
            continue
        for name, parameter in inspect.signature(klass.__init__).parameters.items():
            if name != "self" and parameter.kind not in (parameter.VAR_POSITIONAL,
                                                         parameter.VAR_KEYWORD):
                names.add(name)
    return names


def test_multi_head_takes_no_more_arguments_than_keras_multi_head_attention():
    assert "attention" in constructor_arguments(ka.MultiHead)
    assert len(constructor_arguments(ka.MultiHead)) <= 16, sorted(
        constructor_arguments(ka.MultiHead))


@pytest.mark.parametrize("cls, configuration", [
    (ka.TransformerEncoderBlock, "attention"), (ka.TransformerDecoderBlock, "attention"),
    (ka.TransformerDecoderOnlyBlock, "attention"), (models.TransformerEncoder, "block"),
    (models.TransformerDecoder, "block"), (models.CMLMDecoder, "block"),
    (models.TransformerDecoderOnly, "block")])
def test_blocks_and_stacks_take_at_most_ten_arguments_besides_their_configuration(
        cls, configuration):
    arguments = constructor_arguments(cls)
    assert configuration in arguments
    assert len(arguments - {configuration}) <= 10, sorted(arguments)
