"""keras_attn.checkpoints.files: safetensors into NumPy without torch (single files, sharded
indexes, bfloat16 kept or widened) and the config files, against torch's own state dicts."""

import json
import os
import pathlib
import re
import shutil
import sys

import checkpoint_fixtures as fx
import ml_dtypes
import numpy as np
import pytest

from keras_attn.checkpoints import load_hf_checkpoint, read_config, read_safetensors

FLOAT32 = [name for name in fx.CHECKPOINTS if name != "llama_bf16"]


def stored(name, kind="state"):
    """torch's `state_dict()` arrays of checkpoint `name` that `save_pretrained` stored
    (`kind="bits"`: the raw bits of its bfloat16 tensors)."""
    prefix = f"{kind}/"
    return {key[len(prefix):]: value for key, value in fx.expected(name).items()
            if key.startswith(prefix)}


def test_reader_equals_torch_state_dict():
    # One test over every checkpoint (each test item costs this process a garbage collection).
    for name in FLOAT32:
        tensors = read_safetensors(fx.hf_checkpoint(name))
        expected = stored(name)
        assert set(tensors) == set(expected), name
        for key, value in expected.items():
            assert tensors[key].dtype == np.float32, (name, key)
            np.testing.assert_array_equal(tensors[key], value, err_msg=f"{name} {key}")
    # the tied copies are not stored; every other parameter is
    assert "lm_head.weight" not in read_safetensors(fx.hf_checkpoint("qwen2"))
    assert "lm_head.weight" in read_safetensors(fx.hf_checkpoint("llama"))


def test_bfloat16_is_kept_bit_for_bit_or_widened_on_request():
    path = fx.hf_checkpoint("llama_bf16")
    kept, widened = read_safetensors(path), read_safetensors(path, dtype="float32")
    bits, values = stored("llama_bf16", "bits"), stored("llama_bf16")
    assert set(kept) == set(bits) == set(values)
    for key in bits:
        assert kept[key].dtype == ml_dtypes.bfloat16, key
        np.testing.assert_array_equal(kept[key].view(np.int16), bits[key])
        assert widened[key].dtype == np.float32
        np.testing.assert_array_equal(widened[key], values[key])
    narrowed = read_safetensors(fx.hf_checkpoint("llama"), dtype="bfloat16")
    key = "model.embed_tokens.weight"
    assert narrowed[key].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(narrowed[key],
                                  stored("llama")[key].astype(ml_dtypes.bfloat16))


def test_sharded_checkpoint_through_its_index():
    path = fx.hf_checkpoint("llama3")
    with open(os.path.join(path, "model.safetensors.index.json")) as file:
        weight_map = json.load(file)["weight_map"]
    assert len(set(weight_map.values())) == 3  # the fixture is really sharded
    whole = read_safetensors(path)
    assert whole.keys() == read_safetensors(
        os.path.join(path, "model.safetensors.index.json")).keys() == set(weight_map)
    shard = min(set(weight_map.values()))
    part = read_safetensors(os.path.join(path, shard))
    assert set(part) == {key for key, file in weight_map.items() if file == shard}
    for key in part:
        np.testing.assert_array_equal(part[key], whole[key])


def test_missing_shard_and_pickles_are_refused(tmp_path):
    source = fx.hf_checkpoint("llama3")
    broken = tmp_path / "broken"
    shutil.copytree(source, broken)
    os.remove(broken / "model-00002-of-00003.safetensors")
    with pytest.raises(ValueError, match="model-00002-of-00003.safetensors"):
        read_safetensors(str(broken))
    pickled = tmp_path / "pickled"
    pickled.mkdir()
    (pickled / "pytorch_model.bin").write_bytes(b"not read")
    with pytest.raises(ValueError, match="`path`.*pytorch_model.bin"):
        read_safetensors(str(pickled))
    with pytest.raises(ValueError, match="`dtype`"):
        read_safetensors(source, dtype="int8")


def test_config_and_generation_config(tmp_path):
    config, generation = read_config(fx.hf_checkpoint("llama3"))
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert len(generation["eos_token_id"]) == 2 and config["eos_token_id"] in (
        generation["eos_token_id"])
    assert read_config(fx.hf_checkpoint("bert"))[1] is None  # BertModel writes none
    with pytest.raises(ValueError, match="`directory`"):
        read_config(str(tmp_path))


def test_reading_never_imports_torch(monkeypatch):
    for module in ("torch", "transformers"):  # an `import torch` would now raise ImportError
        monkeypatch.setitem(sys.modules, module, None)
    spec, weights = load_hf_checkpoint(fx.hf_checkpoint("llama3"))
    assert spec.architecture == "llama" and len(weights) == 21


def test_a_single_file_beside_a_shard_index_is_what_is_read():
    """transformers reads `model.safetensors` first; the shards beside it (other weights in
    this fixture) were read instead (logits 12 apart on a real directory)."""
    path = fx.hf_checkpoint("llama_both")
    shards = read_safetensors(os.path.join(path, "model.safetensors.index.json"))
    whole = read_safetensors(path)
    expected = stored("llama_both")  # the model transformers loaded from this directory
    assert set(whole) == set(shards) == set(expected)
    for key, value in expected.items():
        np.testing.assert_array_equal(whole[key], value)
        assert not np.array_equal(shards[key], value)


@pytest.mark.parametrize("weight_map, message", [
    (["a", "b"], "has no `weight_map`"),
    ({"a": 3}, re.escape("weight_map['a']=3")),
    ({"a": None}, re.escape("weight_map['a']=None")),
])
def test_a_damaged_index_beside_the_single_file_is_refused(tmp_path, weight_map, message):
    """The single file is read, as transformers reads it; the damaged index beside it was
    passed over silently."""
    path = damaged(tmp_path, "both", "llama_both")
    write_json(path / "model.safetensors.index.json", {"weight_map": weight_map})
    with pytest.raises(ValueError, match=r"index\.json.*" + message):
        load_hf_checkpoint(str(path))


def write_json(path, value):
    with open(path, "w", encoding="utf-8") as file:
        json.dump(value, file)


def damaged(tmp_path, name, source="llama3"):
    """A copy of a fixture checkpoint to damage."""
    path = tmp_path / name
    shutil.copytree(fx.hf_checkpoint(source), path)
    return path


def test_damaged_files_are_refused_naming_the_file_or_key(tmp_path):
    """Each was a raw AttributeError, TypeError, SafetensorError, JSONDecodeError or
    UnicodeDecodeError, or (a tensor in another shard than its index says) no error."""
    index_name = "model.safetensors.index.json"
    index = json.loads((damaged(tmp_path, "read") / index_name).read_text())
    weight_map = index["weight_map"]
    cases = []
    path = damaged(tmp_path, "list")
    write_json(path / index_name, list(weight_map))
    cases.append((path, r"index\.json' does not hold a JSON object"))
    path = damaged(tmp_path, "number")
    name = min(weight_map)
    write_json(path / index_name, {"weight_map": {**weight_map, name: 3}})
    cases.append((path, re.escape(f"weight_map[{name!r}]=3")))
    # A tensor the index places in another shard that is read too.
    shards = sorted(set(weight_map.values()))
    source = next(s for s in shards if list(weight_map.values()).count(s) > 1)  # still read
    moved = next(key for key, shard in weight_map.items() if shard == source)
    path = damaged(tmp_path, "wrong_shard")
    write_json(path / index_name, {"weight_map": {
        **weight_map, moved: next(s for s in shards if s != source)}})
    cases.append((path, re.escape(f"holds the tensor {moved!r}, which its index")))
    single = fx.hf_checkpoint("llama")
    data = (pathlib.Path(single) / "model.safetensors").read_bytes()
    for label, content in (("empty", b""), ("garbage", b"not a safetensors file at all"),
                           ("header_cut", data[:100]), ("data_cut", data[:-64])):
        path = damaged(tmp_path, label, "llama")
        (path / "model.safetensors").write_bytes(content)
        cases.append((path, r"model\.safetensors' is not a readable safetensors file"))
    for label, content in (("not_json", b'{"architectures": ['),
                           ("not_utf8", b'{"model_type": "\xff\xfe"}')):
        path = damaged(tmp_path, label, "llama")
        (path / "config.json").write_bytes(content)
        cases.append((path, r"config\.json' is not (valid JSON|UTF-8 text)"))
    for path, message in cases:
        with pytest.raises(ValueError, match=message):
            load_hf_checkpoint(str(path))


def test_a_float64_checkpoint_names_a_tensor_and_the_way_out(tmp_path):
    """It was refused later by `build_model` as "Received: dtype='float64'", an argument the
    caller never passed."""
    from safetensors.numpy import save_file

    path = damaged(tmp_path, "float64", "llama")
    tensors = read_safetensors(str(path))
    save_file({key: value.astype(np.float64) for key, value in tensors.items()},
              str(path / "model.safetensors"))
    with pytest.raises(ValueError, match=r"stores '.+' as float64.*pass `dtype`"):
        load_hf_checkpoint(str(path))
    spec, weights = load_hf_checkpoint(str(path), dtype="float32")  # asked for: cast
    assert spec.dtype == "float32" and weights["token_embedding/embeddings"].dtype == np.float32


@pytest.mark.parametrize("value", [None, "", 3, b"dir"])
def test_paths_that_are_no_paths_are_refused_by_name(value):
    from keras_attn.checkpoints import from_pretrained

    for call, name in ((from_pretrained, "directory"), (read_config, "directory"),
                       (load_hf_checkpoint, "directory"), (read_safetensors, "path")):
        with pytest.raises(ValueError, match=f"argument `{name}`"):
            call(value)
