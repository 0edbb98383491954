"""examples/finetune_lm.py at tiny sizes: it builds a Llama-architecture checkpoint offline,
adapts it with LoRA on The Time Machine, lowers the validation perplexity, and writes a
model.keras and a SavedModel that continue a prompt as the fine-tuned model does; it never
replaces an earlier run without --overwrite."""

import json

import finetune_lm
import keras
import pytest

pytestmark = pytest.mark.tf_only  # the tokenizer's TF ops, the SavedModel

TINY = ["--max-passages", "40", "--epochs", "2", "--batch-size", "8", "--sequence-length", "32",
        "--tiny-hidden-dim", "32", "--tiny-layers", "1", "--tiny-intermediate-dim", "32",
        "--tiny-vocabulary-size", "400", "--max-length", "12", "--rank", "4"]


def test_a_tiny_run_end_to_end(tmp_path, capsys):
    out = tmp_path / "run"
    metrics = finetune_lm.main([*TINY, "--out", str(out)])
    printed = capsys.readouterr().out
    assert "validation perplexity before" in printed and "validation perplexity after" in printed
    saved = json.loads((out / "metrics.json").read_text())
    assert saved["built_checkpoint"] and (out / "checkpoint" / "config.json").is_file()
    assert saved["validation_perplexity"] < saved["validation_perplexity_before"]
    lora = saved["lora"]
    assert lora["trainable_parameters"] < saved["parameters"] / 5 and len(lora["adapted"]) == 5
    assert set(saved["samples"]) == set(finetune_lm.PROMPTS) == set(saved["served"])
    model = keras.saving.load_model(str(out / "model.keras"))  # the merged kernels
    assert not any("lora" in w.path for w in model.weights)
    # The SavedModel serves what the saved model generates, greedily.
    prompt = finetune_lm.PROMPTS[0]
    ours = model.generate([prompt], max_length=64, max_new_tokens=24, strip_prompt=True)[0]
    assert saved["served"][prompt] == ours
    assert metrics["validation_perplexity"] == saved["validation_perplexity"]


def test_an_earlier_run_is_kept(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    with pytest.raises(SystemExit, match="overwrite"):
        finetune_lm.main([*TINY, "--out", str(out)])
    assert (out / "metrics.json").read_text() == "{}"


@pytest.mark.parametrize("flag, value", [("--learning-rate", "nan"), ("--rank", "0"),
                                         ("--validation-fraction", "1")])
def test_bad_numbers_are_refused_by_name(flag, value, capsys):
    with pytest.raises(SystemExit):
        finetune_lm.parse_args([flag, value])
    assert flag in capsys.readouterr().err
