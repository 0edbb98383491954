"""Tiny pretrained checkpoints, built offline by one subprocess and reused.

One subprocess (`python tests/checkpoint_fixtures.py ROOT`, run by the first fixture asked
for) builds everything with torch, transformers, tokenizers and sentencepiece, so that the test
processes never import torch or transformers (each would make every later test's
`clear_session` garbage collection slower). The build goes to the temporary directory under a
hash of this file, the data and the libraries' versions, so later sessions and parallel
workers reuse it (`KERAS_ATTN_CHECKPOINT_FIXTURES=DIR` puts it elsewhere); tests copy a
fixture before changing it.

- `tokenizer_dir(kind)`: tokenizer files trained on the first lines of
  `../shared/data/timemachine.txt` plus a few lines of other scripts, tiny vocabularies:
  `"gpt2"` (byte-level BPE, GPT-2's pre-tokenizer), `"llama3"` (byte-level BPE with Llama 3's
  split regex, `ignore_merges`, a `<|begin_of_text|>` template), `"qwen2"` (NFC, Qwen2's split
  regex), `"sentencepiece"` (a Llama 2-style `tokenizer.model` and the `tokenizer.json`
  transformers converts it to), `"sentencepiece_legacy"` (the same model with the Llama 2 hub
  `tokenizer.json`: Prepend/Replace normalizer), `"wordpiece"` (uncased BERT `vocab.txt` and
  `tokenizer.json`), `"wordpiece_cased"`.
- `hf_checkpoint(name)`: `save_pretrained` directories of random-initialised transformers
  models with their tokenizer files (see CHECKPOINTS): Llama plain, with llama3 (sharded, a
  list of eos ids in `generation_config.json`) and linear RoPE scaling, with a YaRN
  `rope_scaling` beside `rope_parameters`, with both `model.safetensors` and a shard index of
  other weights, in bfloat16, with every bias and the tanh GELU; Mistral with
  sliding_window=3; Qwen2 (tied embeddings), and with a sliding window on every layer; GPT-2;
  `BertModel`; `BertForMaskedLM`. The edited directories' expected outputs are those of the
  model transformers loads from them.
- `expected(name)`: what torch computed for that checkpoint: `state/<name>` (the stored state
  dict, float32; `bits/<name>` the raw bfloat16 bits), `ids`, `mask`, `token_type_ids`, and
  `logits` (or `hidden` and `pooled` for `BertModel`) of `model(ids, attention_mask=mask)`;
  for the causal LMs `generated`: `model.generate` greedy from `ids[:, :5]`, 20 new tokens
  (`(2, 25)`).
- `rope_cases()`: Llama configs (default, linear, llama3, yarn RoPE) with the inverse
  frequencies and attention scaling `transformers.modeling_rope_utils` computes for them.
- `keras_hub_model(name)` (in process): tiny keras-hub tasks with random weights: `"gpt2"`,
  `"llama"`, `"llama3"`, `"mistral"`, `"bert_mlm"`, and the backbone `"bert"`.

Nothing is downloaded.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile

DATA = os.path.normpath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "shared",
                                     "data", "timemachine.txt"))
ROOT = ""  # the build directory: made by `_built` (tests) or given to `build` (subprocess)
LIBRARIES = ("torch", "transformers", "tokenizers", "sentencepiece", "safetensors", "numpy")

# Lines of other scripts, so that the tiny vocabularies know some non-English characters.
EXTRA_LINES = [
    "日本語のテキストです。漢字とかなを混ぜた文。東京の天気は晴れ。",
    "中文句子，包括标点符号。我们的时间机器。",
    "Émoji 😀 café naïve façade — “quotes” and ‘single’ ones…",
    "Ünïcödé àéîõü ÀÉÎÕÜ ñ ç ß Straße, Ελληνικά ΟΔΟΣ, русский текст.",
    "Numbers 12345, 3.14159 and 1,000,000; Arabic ١٢٣ digits.",
    "tab\tseparated\tvalues and  double  spaces,\u00a0nbsp\u3000ideographic space.",
    "don't can't I'm you're we've it's THEY'LL he'd",
]
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
                r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}"
               r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
TINY = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}


def training_lines(count: int = 300) -> list[str]:
    """The first `count` non-empty lines of The Time Machine, and EXTRA_LINES."""
    with open(DATA, encoding="utf-8") as file:
        lines = [line.rstrip("\n") for line in file if line.strip()]
    return lines[:count] + EXTRA_LINES


def _folder(name: str) -> str:
    path = os.path.join(ROOT, name)
    os.makedirs(path, exist_ok=True)
    return path


def _write_json(path: str, value: dict) -> None:
    with open(path, "w", encoding="utf-8") as file:
        json.dump(value, file, ensure_ascii=False, indent=1)


def _byte_level_tokenizer(split: str | None, specials: list[str], nfc: bool = False,
                          ignore_merges: bool = False, bos: str | None = None):
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        normalizers,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE(ignore_merges=ignore_merges))
    if nfc:
        tokenizer.normalizer = normalizers.NFC()
    if split is None:  # GPT-2: the ByteLevel pre-tokenizer's own regex
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(split), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(training_lines(), trainer)
    post = [processors.ByteLevel(trim_offsets=False)]
    if bos is not None:
        post.append(processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
            special_tokens=[(bos, tokenizer.token_to_id(bos))]))
    tokenizer.post_processor = processors.Sequence(post) if len(post) > 1 else post[0]
    return tokenizer


def _sentencepiece_model() -> bytes:
    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(training_lines()), model_writer=model, model_type="bpe",
        vocab_size=600, byte_fallback=True, split_digits=True, character_coverage=1.0,
        normalization_rule_name="identity", add_dummy_prefix=True,
        remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, unk_id=0, bos_id=1,
        eos_id=2, pad_id=-1, minloglevel=2)
    return model.getvalue()


TOKENIZERS = ("gpt2", "llama3", "qwen2", "sentencepiece", "sentencepiece_legacy", "wordpiece",
              "wordpiece_cased")


def _build_tokenizer(kind: str) -> str:
    path = _folder(f"tokenizer_{kind}")
    if kind in ("gpt2", "llama3", "qwen2"):
        settings = {
            "gpt2": {"split": None, "specials": ["<|endoftext|>"]},
            "llama3": {"split": LLAMA3_SPLIT, "ignore_merges": True, "bos": "<|begin_of_text|>",
                       "specials": ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]},
            "qwen2": {"split": QWEN2_SPLIT, "nfc": True,
                      "specials": ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]},
        }[kind]
        tokenizer = _byte_level_tokenizer(**settings)
        tokenizer.save(os.path.join(path, "tokenizer.json"))
        if kind == "gpt2":
            tokenizer.model.save(path)  # vocab.json and merges.txt, as GPT-2 repositories have
        specials = settings["specials"]
        _write_json(os.path.join(path, "tokenizer_config.json"),
                    {"bos_token": specials[0], "eos_token": specials[min(1, len(specials) - 1)]})
    elif kind in ("sentencepiece", "sentencepiece_legacy"):
        _write_sentencepiece(path, legacy=kind.endswith("legacy"))
    elif kind in ("wordpiece", "wordpiece_cased"):
        _write_wordpiece(path, lowercase=kind == "wordpiece")
    return path


def _write_sentencepiece(path: str, legacy: bool) -> None:
    from transformers import AutoTokenizer

    with open(os.path.join(path, "tokenizer.model"), "wb") as file:
        file.write(_sentencepiece_model())
    _write_json(os.path.join(path, "tokenizer_config.json"), {
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "add_bos_token": True, "legacy": legacy})
    # What transformers converts the model to (the `tokenizer.json` of today's uploads).
    converted = tempfile.mkdtemp(dir=ROOT)
    AutoTokenizer.from_pretrained(path).save_pretrained(converted)
    with open(os.path.join(converted, "tokenizer.json"), encoding="utf-8") as file:
        spec = json.load(file)
    if legacy:  # the Llama 2 hub file: a Prepend/Replace normalizer, no pre-tokenizer
        spec["normalizer"] = {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"},
            {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
        spec["pre_tokenizer"] = None
    _write_json(os.path.join(path, "tokenizer.json"), spec)


def _write_wordpiece(path: str, lowercase: bool) -> None:
    from tokenizers import processors
    from tokenizers.implementations import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(lowercase=lowercase)
    tokenizer.train_from_iterator(training_lines(), vocab_size=400, show_progress=False)
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tokenizer.token_to_id("[CLS]")),
                        ("[SEP]", tokenizer.token_to_id("[SEP]"))])
    tokenizer.save(os.path.join(path, "tokenizer.json"))
    tokenizer.save_model(path)  # vocab.txt
    _write_json(os.path.join(path, "tokenizer_config.json"), {
        "tokenizer_class": "BertTokenizer", "do_lower_case": lowercase})


def _vocab_size(tokenizer_path: str) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(tokenizer_path, "tokenizer.json")).get_vocab_size()


def _token_id(tokenizer_path: str, token: str) -> int:
    from tokenizers import Tokenizer

    return Tokenizer.from_file(os.path.join(tokenizer_path, "tokenizer.json")).token_to_id(token)


CHECKPOINTS = {
    # name: (transformers class, tokenizer kind, config overrides, options)
    "llama": ("LlamaForCausalLM", "sentencepiece_legacy", {}, {}),
    "llama3": ("LlamaForCausalLM", "llama3", {"rope_scaling": {
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}, "rope_theta": 500000.0},
        {"max_shard_size": "20KB"}),
    "llama_linear": ("LlamaForCausalLM", "sentencepiece",
                     {"rope_scaling": {"rope_type": "linear", "factor": 2.0}}, {}),
    "llama_bf16": ("LlamaForCausalLM", "sentencepiece", {}, {"bfloat16": True}),
    "llama_biases": ("LlamaForCausalLM", "sentencepiece", {
        "attention_bias": True, "mlp_bias": True, "hidden_act": "gelu_pytorch_tanh",
        "tie_word_embeddings": True, "head_dim": 8}, {}),
    "mistral": ("MistralForCausalLM", "sentencepiece", {"sliding_window": 3}, {}),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", {"tie_word_embeddings": True,
                                            "rope_theta": 1000000.0}, {}),
    "qwen2_sliding": ("Qwen2ForCausalLM", "qwen2", {
        "use_sliding_window": True, "sliding_window": 3, "max_window_layers": 0}, {}),
    # transformers 4's `rope_scaling` beside transformers 5's `rope_parameters` in config.json
    # (written after saving): transformers 5 applies the scaling, with the top-level theta.
    # (Larger initial weights than transformers' 0.02, so that positions change the logits.)
    "llama_yarn": ("LlamaForCausalLM", "sentencepiece", {"rope_theta": 1000.0,
                                                         "initializer_range": 0.25}, {
        "config_json": {"rope_theta": 1000.0,
                        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
                        "rope_scaling": {"type": "yarn", "factor": 4.0, "beta_fast": 8,
                                         "original_max_position_embeddings": 4}}}),
    # model.safetensors and a shard index of other weights: transformers reads the single file.
    "llama_both": ("LlamaForCausalLM", "sentencepiece", {}, {"decoy_shards": True}),
    "gpt2": ("GPT2LMHeadModel", "gpt2", {}, {}),
    "bert": ("BertModel", "wordpiece", {}, {}),
    "bert_mlm": ("BertForMaskedLM", "wordpiece", {}, {}),
}
ROPE_CASES = [None, {"rope_type": "linear", "factor": 4.0},
              {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
              {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 8192},
              {"rope_type": "yarn", "factor": 16.0, "beta_fast": 16.0, "beta_slow": 2.0,
               "truncate": False, "mscale": 1.0, "mscale_all_dim": 0.5},
              {"rope_type": "yarn", "factor": 2.0, "attention_factor": 1.5,
               "original_max_position_embeddings": 65536}]


def _config(name: str):
    import transformers

    cls_name, kind, overrides, _ = CHECKPOINTS[name]
    tokenizer_path = os.path.join(ROOT, f"tokenizer_{kind}")
    vocab = _vocab_size(tokenizer_path)
    if cls_name.startswith("GPT2"):
        eos = _token_id(tokenizer_path, "<|endoftext|>")
        return transformers.GPT2Config(vocab_size=vocab, n_positions=64, n_embd=16, n_layer=2,
                                       n_head=4, bos_token_id=eos, eos_token_id=eos,
                                       **overrides)
    if cls_name.startswith("Bert"):
        return transformers.BertConfig(
            vocab_size=vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=4,
            intermediate_size=32, max_position_embeddings=64, type_vocab_size=2,
            pad_token_id=_token_id(tokenizer_path, "[PAD]"), **overrides)
    config_cls = getattr(transformers, cls_name.replace("ForCausalLM", "Config"))
    ids = {"sentencepiece": (1, 2), "sentencepiece_legacy": (1, 2)}.get(kind)
    if ids is None:
        specials = {"llama3": ("<|begin_of_text|>", "<|end_of_text|>"),
                    "qwen2": ("<|endoftext|>", "<|endoftext|>")}[kind]
        ids = tuple(_token_id(tokenizer_path, token) for token in specials)
    return config_cls(vocab_size=vocab, bos_token_id=ids[0], eos_token_id=ids[1],
                      **{**TINY, **overrides})


def _expected_outputs(model, vocab: int, bert: bool) -> dict:
    """Fixed inputs (the second row padded after 5 tokens) and what torch computes."""
    import numpy as np
    import torch

    rng = np.random.default_rng(0)
    ids = rng.integers(0, vocab, size=(2, 7))
    mask = np.ones((2, 7), dtype=bool)
    mask[1, 5:] = False
    types = rng.integers(0, 2, size=(2, 7))
    kwargs = {"token_type_ids": torch.tensor(types)} if bert else {}
    with torch.no_grad():
        out = model(torch.tensor(ids), attention_mask=torch.tensor(mask.astype(np.int64)),
                    **kwargs)
    arrays = {"ids": ids, "mask": mask, "token_type_ids": types}
    if hasattr(model, "generate") and not bert:  # greedy, 20 new tokens, no early stop
        prompt = torch.tensor(ids[:, :5])
        with torch.no_grad():
            arrays["generated"] = model.generate(
                prompt, attention_mask=torch.ones_like(prompt), do_sample=False,
                max_new_tokens=20, min_new_tokens=20,
                pad_token_id=model.config.eos_token_id).numpy()
    if hasattr(out, "logits"):
        arrays["logits"] = out.logits.float().numpy()
    else:
        arrays["hidden"] = out.last_hidden_state.numpy()
        arrays["pooled"] = out.pooler_output.numpy()
    return arrays


def _build_checkpoint(name: str) -> None:
    import numpy as np
    import safetensors.numpy
    import torch
    import transformers

    path = _folder(f"checkpoint_{name}")
    cls_name, kind, _, options = CHECKPOINTS[name]
    torch.manual_seed(sorted(CHECKPOINTS).index(name))
    model = getattr(transformers, cls_name)(_config(name)).eval()
    if options.get("bfloat16"):
        model = model.to(torch.bfloat16)
    if name == "llama3":  # instruct-style stop ids: a list, in generation_config.json
        model.generation_config.eos_token_id = [
            model.config.eos_token_id,
            _token_id(os.path.join(ROOT, f"tokenizer_{kind}"), "<|eot_id|>")]
    model.save_pretrained(path, max_shard_size=options.get("max_shard_size", "5GB"))
    source = os.path.join(ROOT, f"tokenizer_{kind}")
    for file in os.listdir(source):
        shutil.copy(os.path.join(source, file), path)
    if "config_json" in options or options.get("decoy_shards"):
        _edit_saved(path, options)
        # What transformers loads from the edited directory is what the tests compare with.
        model = getattr(transformers, cls_name).from_pretrained(path).eval()
    stored = set(safetensors_names(path))
    arrays = {}
    for key, value in model.state_dict().items():
        if key in stored:
            arrays[f"state/{key}"] = value.float().numpy()
            if value.dtype == torch.bfloat16:
                arrays[f"bits/{key}"] = value.view(torch.int16).numpy()
    arrays.update(_expected_outputs(model.float(), model.config.vocab_size,
                                    cls_name.startswith("Bert")))
    safetensors.numpy.save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()},
                                os.path.join(ROOT, f"expected_{name}.safetensors"))


def _edit_saved(path: str, options: dict) -> None:
    """A saved checkpoint changed as its options say: `config_json` keys set in config.json;
    `decoy_shards`: a shard index and shards of other weights (the stored ones + 1) beside the
    single `model.safetensors`."""
    import safetensors.numpy

    if "config_json" in options:
        config_path = os.path.join(path, "config.json")
        with open(config_path, encoding="utf-8") as file:
            config = json.load(file)
        config.update(options["config_json"])
        _write_json(config_path, config)
    if options.get("decoy_shards"):
        tensors = safetensors.numpy.load_file(os.path.join(path, "model.safetensors"))
        names = sorted(tensors)
        weight_map = {}
        for i, part in enumerate((names[::2], names[1::2])):
            shard = f"model-0000{i + 1}-of-00002.safetensors"
            safetensors.numpy.save_file({name: tensors[name] + 1 for name in part},
                                        os.path.join(path, shard), metadata={"format": "pt"})
            weight_map.update(dict.fromkeys(part, shard))
        _write_json(os.path.join(path, "model.safetensors.index.json"),
                    {"metadata": {}, "weight_map": weight_map})


def safetensors_names(path: str) -> list[str]:
    """The tensor names stored in a checkpoint directory (all shards)."""
    from safetensors import safe_open

    names = []
    for file in sorted(os.listdir(path)):
        if file.endswith(".safetensors"):
            with safe_open(os.path.join(path, file), framework="np") as handle:
                names.extend(handle.keys())
    return names


def _build_rope_cases() -> None:
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    cases = []
    for rope in ROPE_CASES:
        config = transformers.LlamaConfig(hidden_size=1024, num_attention_heads=8,
                                          rope_theta=500000.0, max_position_embeddings=131072,
                                          rope_scaling=None if rope is None else dict(rope))
        if rope is None:
            inv_freq, scale = LlamaRotaryEmbedding.compute_default_rope_parameters(config)
        else:
            inv_freq, scale = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config)
        config = {**config.to_dict(), "architectures": ["LlamaForCausalLM"]}
        config["dtype"] = str(config.get("dtype") or "float32").replace("torch.", "")
        cases.append({"rope": rope, "config": config, "attention_scale": scale,
                      "inv_freq": inv_freq.tolist()})
    _write_json(os.path.join(ROOT, "rope_cases.json"), {"cases": cases})


def build(root: str) -> None:
    """Build every tokenizer, checkpoint and expected output under `root` (the subprocess)."""
    global ROOT
    ROOT = root
    for kind in TOKENIZERS:
        _build_tokenizer(kind)
    for name in CHECKPOINTS:
        _build_checkpoint(name)
    _build_rope_cases()


def _cache_key() -> str:
    """A hash of what the fixtures depend on: this file, the data and the libraries."""
    from importlib import metadata

    digest = hashlib.sha256()
    for path in (os.path.abspath(__file__), DATA):
        with open(path, "rb") as file:
            digest.update(file.read())
    for name in LIBRARIES:
        digest.update(f"{name}=={metadata.version(name)}".encode())
    return digest.hexdigest()[:16]


@functools.cache
def _built() -> str:
    """The build directory, built now unless a build with the same cache key is complete (a
    lock keeps parallel test workers from building it twice)."""
    import fcntl

    root = os.environ.get("KERAS_ATTN_CHECKPOINT_FIXTURES") or os.path.join(
        tempfile.gettempdir(), f"keras_attn_checkpoint_fixtures_{_cache_key()}")
    with open(root + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.isfile(os.path.join(root, "COMPLETE")):
            partial = root + ".partial"
            for path in (root, partial):
                shutil.rmtree(path, ignore_errors=True)
            os.makedirs(partial)
            result = subprocess.run([sys.executable, os.path.abspath(__file__), partial],
                                    check=False, capture_output=True, text=True, timeout=900)
            if result.returncode:
                raise RuntimeError("building the checkpoint fixtures failed:\n"
                                   + result.stderr[-4000:])
            open(os.path.join(partial, "COMPLETE"), "w").close()
            os.rename(partial, root)
    return root


def tokenizer_dir(kind: str) -> str:
    """A directory with the tokenizer files of `kind` (see the module docstring)."""
    if kind not in TOKENIZERS:
        raise ValueError(f"no tokenizer kind {kind!r}")
    return os.path.join(_built(), f"tokenizer_{kind}")


def hf_checkpoint(name: str) -> str:
    """The `save_pretrained` directory of checkpoint `name`, with its tokenizer files."""
    if name not in CHECKPOINTS:
        raise ValueError(f"no checkpoint {name!r}")
    return os.path.join(_built(), f"checkpoint_{name}")


@functools.cache
def expected(name: str) -> dict:
    """What torch computed for checkpoint `name` (see the module docstring)."""
    from safetensors.numpy import load_file

    return load_file(os.path.join(_built(), f"expected_{name}.safetensors"))


def rope_cases() -> list[dict]:
    """Llama configs and the inverse frequencies transformers computes for them."""
    with open(os.path.join(_built(), "rope_cases.json"), encoding="utf-8") as file:
        return json.load(file)["cases"]


@functools.cache
def keras_hub_model(name: str):
    """A tiny keras-hub task (or, for `"bert"`, a backbone) with random weights."""
    import keras
    import keras_hub

    keras.utils.set_random_seed(7)
    models = keras_hub.models
    if name == "gpt2":
        backbone = models.GPT2Backbone(vocabulary_size=64, num_layers=2, num_heads=4,
                                       hidden_dim=16, intermediate_dim=32,
                                       max_sequence_length=32)
        return models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    if name in ("llama", "llama3"):
        rope = {}
        if name == "llama3":
            rope = {"rope_frequency_adjustment_factor": 8.0, "rope_low_freq_factor": 1.0,
                    "rope_high_freq_factor": 4.0, "rope_pretraining_sequence_length": 16}
        backbone = models.LlamaBackbone(vocabulary_size=64, num_layers=2, num_query_heads=4,
                                        num_key_value_heads=2, hidden_dim=16,
                                        intermediate_dim=32, **rope)
        return models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    if name == "mistral":
        backbone = models.MistralBackbone(vocabulary_size=64, num_layers=2, num_query_heads=4,
                                          num_key_value_heads=2, hidden_dim=16,
                                          intermediate_dim=32, sliding_window=3)
        return models.MistralCausalLM(backbone=backbone, preprocessor=None)
    backbone = models.BertBackbone(vocabulary_size=64, num_layers=2, num_heads=4, hidden_dim=16,
                                   intermediate_dim=32, max_sequence_length=32)
    if name == "bert":
        return backbone
    return models.BertMaskedLM(backbone=backbone, preprocessor=None)


if __name__ == "__main__":
    build(sys.argv[1])
