"""Chat templates (`keras_attn.preprocessing.chat`): a checkpoint's `chat_template` renders
conversations to the same string as transformers' `apply_chat_template(..., tokenize=False)`,
tokenizes to the same ids, and `CausalLM.generate` answers a conversation as it continues
those ids.

The templates (tests/fixtures/chat_templates/) are written out here after the families'
published ones: Llama 3 and 3.1, Llama 2 and Mistral's `[INST]`, ChatML (Qwen2) and Qwen2.5's
with tools, Gemma's and Zephyr's (whitespace left to `trim_blocks` / `lstrip_blocks`).
transformers runs in a subprocess (`PreTrainedTokenizerFast` loaded from the same
directories), as in tests/transformers_reference.py: nothing is downloaded.
"""

import json
import os
import pathlib
import shutil
import subprocess
import sys

import keras
import numpy as np
import pytest

from keras_attn.preprocessing import CausalLMPreprocessor, CharacterTokenizer
from keras_attn.preprocessing.chat import ChatTemplate
from keras_attn.recipes.tiny_checkpoints import tiny_llama_checkpoint
from keras_attn.tasks import CausalLM
from keras_attn.tokens import RESERVED_TOKENS

TEMPLATES = pathlib.Path(__file__).parent / "fixtures" / "chat_templates"

HELLO = [{"role": "user", "content": "Hello, who are you?"}]
SYSTEM = [{"role": "system", "content": "  You are terse.\n"},
          {"role": "user", "content": "  Say 日本語 and 😀  "}]
TURNS = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Hello! 😀"},
         {"role": "user", "content": "what is 2+2? <b>"}]
TOOLS = [{"role": "user", "content": "Weather in Paris?"},
         {"role": "assistant", "content": None, "tool_calls": [{"type": "function", "function": {
             "name": "get_weather", "arguments": {"city": "Paris", "note": "<é> & 東京"}}}]},
         {"role": "tool", "content": "22°C"}, {"role": "tool", "content": "sunny"}]
# family: (template file, where it is saved, special tokens, added tokens, conversations)
FAMILIES = {
    "llama3": ("llama3.jinja", "config", {"bos_token": "<|begin_of_text|>",
                                          "eos_token": "<|eot_id|>"},
               ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
               [HELLO, SYSTEM, TURNS]),
    "llama3_1": ("llama3_1.jinja", "file", {"bos_token": "<|begin_of_text|>",
                                            "eos_token": "<|eot_id|>"},
                 ["<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"],
                 [HELLO, SYSTEM, TURNS]),
    "llama2": ("llama2.jinja", "config", {"bos_token": "<s>", "eos_token": "</s>",
                                          "unk_token": "<unk>"},
               ["<s>", "</s>", "<unk>"], [HELLO, SYSTEM, TURNS]),
    "mistral": ("mistral.jinja", "config", {"bos_token": {  # the older AddedToken form
        "__type": "AddedToken", "content": "<s>", "lstrip": False, "normalized": False,
        "rstrip": False, "single_word": False},
                                            "eos_token": "</s>"},
                ["<s>", "</s>"], [HELLO, TURNS]),
    "qwen2": ("chatml.jinja", "config", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
                                         "bos_token": None},
              ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], [HELLO, SYSTEM, TURNS]),
    "qwen2_5": ("qwen2_5.jinja", "file", {"eos_token": "<|im_end|>",
                                          "pad_token": "<|endoftext|>"},
                ["<|endoftext|>", "<|im_start|>", "<|im_end|>"], [HELLO, SYSTEM, TURNS, TOOLS]),
    "gemma": ("gemma.jinja", "config", {"bos_token": "<bos>", "eos_token": "<eos>",
                                        "pad_token": "<pad>"},
              ["<bos>", "<eos>", "<pad>", "<start_of_turn>", "<end_of_turn>"], [HELLO, TURNS]),
    "zephyr": ("zephyr.jinja", "config", {"bos_token": "<s>", "eos_token": "</s>"},
               ["<s>", "</s>"], [HELLO, SYSTEM, TURNS]),
}
TEXTS = ["The Time Traveller (for so it will be convenient to speak of him) was expounding.",
         "You are a helpful assistant. Hello, who are you? Say hi, what is the weather?",
         "system user assistant model Cutting Knowledge Date December Today",
         "日本語のテキスト 😀 Émoji café 東京 22°C sunny Paris"]

REFERENCE = """
import json, sys
import transformers
cases, out = json.loads(sys.argv[1]), sys.argv[2]
results = {}
for name, (directory, conversations) in cases.items():
    tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
    results[name] = {
        "fast": isinstance(tokenizer, transformers.PreTrainedTokenizerFast),
        "prompts": tokenizer.apply_chat_template(conversations, tokenize=False,
                                                 add_generation_prompt=True),
        "closed": tokenizer.apply_chat_template(conversations, tokenize=False),
        "ids": [tokenizer.apply_chat_template(c, tokenize=True, add_generation_prompt=True,
                                              return_dict=False) for c in conversations]}
with open(out, "w", encoding="utf-8") as file:
    json.dump(results, file, ensure_ascii=False)
"""


def _template(file_name: str, where: str) -> str:
    text = (TEMPLATES / file_name).read_text(encoding="utf-8")
    # A template in tokenizer_config.json is one JSON string, without the file's last newline.
    return text.rstrip("\n") if where == "config" else text


def _edit_tokenizer_config(directory: str, **changes) -> None:
    path = os.path.join(directory, "tokenizer_config.json")
    with open(path, encoding="utf-8") as file:
        config = json.load(file)
    config.update(changes)
    with open(path, "w", encoding="utf-8") as file:
        json.dump(config, file, ensure_ascii=False, indent=1)


def _family_directory(base: str, root: pathlib.Path, name: str) -> str:
    """`base`'s tokenizer files with the family's special tokens added and its template saved
    in tokenizer_config.json or chat_template.jinja."""
    from tokenizers import Tokenizer

    file_name, where, specials, added, _ = FAMILIES[name]
    directory = str(root / name)
    os.makedirs(directory)
    for file in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(base, file), directory)
    tokenizer = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    tokenizer.add_special_tokens(added)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    template = _template(file_name, where)
    if where == "file":
        with open(os.path.join(directory, "chat_template.jinja"), "w", encoding="utf-8") as f:
            f.write(template)
        _edit_tokenizer_config(directory, chat_template="{{ 'the file wins' }}", **specials)
    else:
        _edit_tokenizer_config(directory, chat_template=template, **specials)
    return directory


def _transformers(cases: dict, out: str) -> dict:
    result = subprocess.run([sys.executable, "-c", REFERENCE, json.dumps(cases), out],
                            capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(out, encoding="utf-8") as file:
        return json.load(file)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """A tiny Llama checkpoint (random weights, byte-level BPE) with Llama 3's template."""
    directory = str(tmp_path_factory.mktemp("chat") / "llama")
    tiny_llama_checkpoint(directory, TEXTS * 4, seed=1, vocabulary_size=400, hidden_dim=16,
                          num_layers=1, num_heads=2, num_key_value_heads=1,
                          intermediate_dim=32, max_sequence_length=256)
    _edit_tokenizer_config(directory, chat_template=_template("llama3.jinja", "config"))
    return directory


@pytest.fixture(scope="module")
def reference(checkpoint, tmp_path_factory):
    """Every family's directory, and what transformers renders and tokenizes there."""
    root = tmp_path_factory.mktemp("families")
    directories = {name: _family_directory(checkpoint, root, name) for name in FAMILIES}
    cases = {name: (directories[name], FAMILIES[name][4]) for name in FAMILIES}
    cases["generate"] = (checkpoint, [HELLO, TURNS])
    return directories, _transformers(cases, str(root / "reference.json"))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_renders_and_tokenizes_as_transformers(reference, name):
    from keras_attn.preprocessing import PretrainedTokenizer

    directories, expected = reference
    assert expected[name]["fast"]
    tokenizer = PretrainedTokenizer(directories[name])
    preprocessor = CausalLMPreprocessor(tokenizer)
    conversations = FAMILIES[name][4]
    prompts = preprocessor.apply_chat_template(conversations)
    assert prompts == expected[name]["prompts"]
    assert preprocessor.apply_chat_template(conversations, add_generation_prompt=False) == (
        expected[name]["closed"])
    assert prompts[0] == preprocessor.apply_chat_template(conversations[0])[0]  # one or a batch
    ids = tokenizer.tokenize(prompts, add_special_tokens=False).to_list()
    assert ids == expected[name]["ids"]
    assert len(prompts[0]) > 10 and prompts[0] != prompts[-1]


def test_generate_answers_a_conversation_as_the_token_path(checkpoint, reference):
    lm = CausalLM.from_pretrained(checkpoint, sequence_length=256)
    _, expected = reference
    prompts, ids = expected["generate"]["prompts"], expected["generate"]["ids"]
    replies = lm.generate([HELLO, TURNS], max_length=256, max_new_tokens=6)
    tokenizer = lm.preprocessor.tokenizer
    stops = set(tokenizer.end_token_ids)
    for reply, row in zip(replies, ids):
        tokens = keras.ops.convert_to_numpy(lm.generate(
            np.array([row], "int32"), max_length=256, max_new_tokens=6))[0]
        new = [int(t) for t in tokens[len(row):len(row) + 6]]
        new = new[:next((i for i, t in enumerate(new) if t in stops), len(new))]
        assert reply == tokenizer.detokenize([new]).numpy()[0].decode("utf-8")
    assert lm.generate(HELLO, max_length=256, max_new_tokens=6) == replies[0]
    assert "".join(lm.generate(HELLO, max_length=256, max_new_tokens=6, stream=True)) == (
        replies[0])
    whole = lm.generate(HELLO, max_length=256, max_new_tokens=6, strip_prompt=False)
    context = tokenizer.detokenize([ids[0]]).numpy()[0].decode("utf-8")
    assert whole == context + replies[0] and context in prompts[0]


def test_keras_file_keeps_the_template_file(checkpoint, tmp_path):
    directory = str(tmp_path / "qwen")
    shutil.copytree(checkpoint, directory)
    shutil.copy(TEMPLATES / "qwen2_5.jinja", os.path.join(directory, "chat_template.jinja"))
    lm = CausalLM.from_pretrained(directory, sequence_length=64)
    before = lm.preprocessor.apply_chat_template(TOOLS)
    assert before[0].startswith("<|im_start|>system")  # the file wins over the config's
    path = str(tmp_path / "lm.keras")
    lm.save(path)
    loaded = keras.saving.load_model(path)
    assert loaded.preprocessor.apply_chat_template(TOOLS) == before


def test_template_errors_are_value_errors(reference):
    from keras_attn.preprocessing import PretrainedTokenizer

    directories, _ = reference
    gemma = CausalLMPreprocessor(PretrainedTokenizer(directories["gemma"]))
    with pytest.raises(ValueError, match="System role not supported"):
        gemma.apply_chat_template(SYSTEM)
    mistral = CausalLMPreprocessor(PretrainedTokenizer(directories["mistral"]))
    with pytest.raises(ValueError, match="inputs.*alternate"):
        mistral.apply_chat_template([{"role": "assistant", "content": "hi"}])


@pytest.mark.parametrize("bad, message", [
    ([{"content": "no role"}], r"inputs.*'role'.*inputs\[0\]"),
    ([[HELLO[0]], [{"role": 3, "content": "x"}]], r"'role'.*inputs\[1\]\[0\]"),
    ([HELLO[0], "text"], r"inputs.*dict.*inputs\[1\]"),
    ([HELLO, []], r"inputs\[1\]"),
])
def test_bad_messages_are_named(checkpoint, bad, message):
    lm = CausalLM.from_pretrained(checkpoint, sequence_length=64)
    with pytest.raises(ValueError, match=message):
        lm.generate(bad, max_length=64)


def test_no_template_is_a_clear_error(checkpoint, tmp_path):
    directory = str(tmp_path / "plain")
    shutil.copytree(checkpoint, directory)
    _edit_tokenizer_config(directory, chat_template=None)
    lm = CausalLM.from_pretrained(directory, sequence_length=64)
    assert lm.preprocessor.tokenizer.chat_template is None
    with pytest.raises(ValueError, match="inputs.*no chat template"):
        lm.generate(HELLO, max_length=64)
    assert isinstance(lm.generate("The Time", max_length=16), str)  # strings still work
    vocabulary = list(RESERVED_TOKENS) + list("abc ")
    preprocessor = CausalLMPreprocessor(CharacterTokenizer(vocabulary))
    with pytest.raises(ValueError, match="no chat template"):
        preprocessor.apply_chat_template(HELLO)


def test_chat_template_object():
    chat = ChatTemplate("{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}"
                        "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
                        {"bos_token": "<s>", "eos_token": None})
    assert chat.render(HELLO) == ["<s><user>Hello, who are you?<assistant>"]
    assert chat.render([HELLO], add_generation_prompt=False) == ["<s><user>Hello, who are you?"]
    with pytest.raises(ValueError, match="template"):
        ChatTemplate("")
    sandboxed = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(Exception, match="unsafe|not safely|access"):
        sandboxed.render(HELLO)
