"""Tiny Hugging Face checkpoints built offline, without torch: what an example loads when the
user gives no checkpoint, so that it runs from a clone.

A directory holds what `save_pretrained` and a tokenizer's `save_pretrained` write, with the
parameter names and layouts of `transformers` (`torch.nn.Linear` weights as `(out, in)`):

- `config.json` (`BertModel` or `LlamaForCausalLM`);
- `model.safetensors`, written with `safetensors.numpy` from NumPy float32 arrays drawn from
  `np.random.default_rng(seed)`: every matrix and embedding normal with standard deviation
  `initializer_range` (transformers' initialization), biases 0, norm scales 1;
- the tokenizer, trained with the `tokenizers` library on the given texts: BERT's uncased
  WordPiece (`tokenizer.json`, `vocab.txt`, `tokenizer_config.json`; template
  `[CLS] text [SEP]`), Llama 3's byte-level BPE (`tokenizer.json`, `tokenizer_config.json`;
  Llama 3's split pattern, template `<|begin_of_text|> text`, end `<|end_of_text|>`).

`keras_attn.checkpoints.from_pretrained`, `keras_attn.tasks.TextClassifier.from_pretrained`,
`keras_attn.tasks.CausalLM.from_pretrained` and `transformers`' `AutoModel` /
`AutoTokenizer` load them (tests/test_tiny_checkpoints.py checks both against each other).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable

import numpy as np

from keras_attn._checks import as_int, check_bool, check_number, check_rate

# Llama 3's pre-tokenizer split (its `tokenizer.json`): contractions, letters, up to three
# digits, punctuation runs, line breaks and spaces.
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
                r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA_SPECIAL_TOKENS = ("<|begin_of_text|>", "<|end_of_text|>")
BERT_SPECIAL_TOKENS = {"pad": "[PAD]", "unk": "[UNK]", "cls": "[CLS]", "sep": "[SEP]",
                       "mask": "[MASK]"}
# The smallest byte-level vocabulary: the 256 bytes and the two special tokens.
MIN_BYTE_LEVEL_VOCABULARY = 256 + len(LLAMA_SPECIAL_TOKENS)


def _check_texts(texts) -> list[str]:
    if isinstance(texts, (str, bytes)) or not isinstance(texts, Iterable):
        raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
            "Received an invalid value for argument `texts`, expected a list of "
            f"strings to train the tokenizer on. Received: texts={texts!r:.200}")
    texts = list(texts)
    if not texts or not all(isinstance(t, str) for t in texts) or not any(
            t.strip() for t in texts):
        raise ValueError("Received an invalid value for argument `texts`, expected a non-empty "
                         f"list of strings with some text. Received: texts={texts!r:.200}")
    return texts


def _check_directory(directory, overwrite: bool) -> str:
    if not isinstance(directory, (str, os.PathLike)):
        raise ValueError(  # noqa: TRY004 - the project raises ValueError for bad args
            "Received an invalid value for argument `directory`, expected a path. "
            f"Received: directory={directory!r}")
    directory = os.fspath(directory)
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise ValueError(f"Argument `directory` must be a directory; {directory!r} is a file.")
    if os.path.isdir(directory) and os.listdir(directory) and not overwrite:
        raise ValueError(
            f"Argument `directory` must be empty or new: {directory!r} holds "
            f"{sorted(os.listdir(directory))[:8]}. Pass overwrite=True to replace the "
            "checkpoint files in it.")
    return directory


def _check_sizes(seed, **sizes) -> dict:
    """Every size a positive int, `seed` a non-negative one (as Python ints)."""
    as_int("seed", seed, 0)
    return {name: as_int(name, value) for name, value in sizes.items()}


def _write(directory: str, config: dict, weights: dict, tokenizer_config: dict,
           tokenizer) -> str:
    """Write the checkpoint files of `directory` (after every check passed)."""
    import safetensors.numpy

    os.makedirs(directory, exist_ok=True)
    for name, value in (("config.json", config), ("tokenizer_config.json", tokenizer_config)):
        with open(os.path.join(directory, name), "w", encoding="utf-8") as file:
            json.dump(value, file, ensure_ascii=False, indent=1)
    # transformers reads safetensors files whose metadata names their framework.
    safetensors.numpy.save_file(weights, os.path.join(directory, "model.safetensors"),
                                metadata={"format": "pt"})
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    return directory


class _Init:
    """Random weights from one seed, in transformers' layouts."""

    def __init__(self, seed: int, initializer_range: float):
        self.rng = np.random.default_rng(seed)
        self.std = initializer_range

    def normal(self, *shape: int) -> np.ndarray:
        return (self.std * self.rng.standard_normal(shape)).astype("float32")

    def linear(self, prefix: str, out_dim: int, in_dim: int, bias: bool) -> dict:
        """`prefix.weight` `(out, in)` (and `prefix.bias` `(out,)` zeros)."""
        arrays = {f"{prefix}.weight": self.normal(out_dim, in_dim)}
        if bias:
            arrays[f"{prefix}.bias"] = np.zeros(out_dim, "float32")
        return arrays

    @staticmethod
    def norm(prefix: str, dim: int, bias: bool) -> dict:
        arrays = {f"{prefix}.weight": np.ones(dim, "float32")}
        if bias:
            arrays[f"{prefix}.bias"] = np.zeros(dim, "float32")
        return arrays


def _wordpiece(texts: list[str], vocabulary_size: int, lowercase: bool):
    from tokenizers import processors
    from tokenizers.implementations import BertWordPieceTokenizer

    tokenizer = BertWordPieceTokenizer(lowercase=lowercase)
    tokenizer.train_from_iterator(texts, vocab_size=vocabulary_size, show_progress=False,
                                  special_tokens=list(BERT_SPECIAL_TOKENS.values()))
    cls, sep = BERT_SPECIAL_TOKENS["cls"], BERT_SPECIAL_TOKENS["sep"]
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B:1 {sep}:1",
        special_tokens=[(cls, tokenizer.token_to_id(cls)), (sep, tokenizer.token_to_id(sep))])
    return tokenizer


def tiny_bert_checkpoint(directory: str, texts: Iterable[str], seed: int = 0, *,
                         vocabulary_size: int = 1000, hidden_dim: int = 32,
                         num_layers: int = 2, num_heads: int = 4, intermediate_dim: int = 64,
                         max_sequence_length: int = 128, lowercase: bool = True,
                         dropout: float = 0.1, initializer_range: float = 0.02,
                         overwrite: bool = False) -> str:
    """Write a `BertModel` checkpoint directory with random weights and a WordPiece tokenizer
    trained on `texts`.

    Args:
        directory: str, where to write (created; must be empty or new unless `overwrite`).
        texts: list of str, the tokenizer's training text.
        seed: int, the seed of the weights. Defaults to `0`.
        vocabulary_size: int, the WordPiece vocabulary's target size (the trained vocabulary
            has at most this many tokens, unless the texts have more distinct characters; the
            config gets the trained size). Defaults to `1000`.
        hidden_dim: int, the model width (`hidden_size`). Defaults to `32`.
        num_layers: int, encoder blocks. Defaults to `2`.
        num_heads: int, attention heads; divides `hidden_dim`. Defaults to `4`.
        intermediate_dim: int, the FFN's inner width. Defaults to `64`.
        max_sequence_length: int, learned positions (`max_position_embeddings`). Defaults to
            `128`.
        lowercase: bool, an uncased tokenizer (lowercased, accents stripped). Defaults to
            `True`.
        dropout: float in [0, 1), BERT's hidden and attention dropout (fine-tuning only).
            Defaults to `0.1`.
        initializer_range: float > 0, the standard deviation of the weights. Defaults to
            `0.02`.
        overwrite: bool, replace the checkpoint files of a non-empty `directory`. Defaults to
            `False`.

    Returns:
        `directory`.

    Example:
    >>> tiny_bert_checkpoint("/tmp/tiny_bert", ["Hello world.", "Bonjour le monde."])
    >>> TextClassifier.from_pretrained("/tmp/tiny_bert", num_classes=2)
    """
    texts = _check_texts(texts)
    sizes = _check_sizes(seed, vocabulary_size=vocabulary_size, hidden_dim=hidden_dim,
                         num_layers=num_layers, num_heads=num_heads,
                         intermediate_dim=intermediate_dim,
                         max_sequence_length=max_sequence_length)
    if hidden_dim % num_heads:
        raise ValueError("Argument `num_heads` must divide `hidden_dim`. Received: "
                         f"num_heads={num_heads}, hidden_dim={hidden_dim}")
    check_bool("lowercase", lowercase)
    check_bool("overwrite", overwrite)
    check_rate("dropout", dropout)
    check_number("initializer_range", initializer_range, minimum=0.0, strict=True)
    directory = _check_directory(directory, overwrite)
    tokenizer = _wordpiece(texts, sizes["vocabulary_size"], lowercase)
    vocab = tokenizer.get_vocab_size()
    pad_id = tokenizer.token_to_id(BERT_SPECIAL_TOKENS["pad"])
    d, inner = hidden_dim, intermediate_dim
    init = _Init(seed, initializer_range)
    weights = {"embeddings.word_embeddings.weight": init.normal(vocab, d),
               "embeddings.position_embeddings.weight": init.normal(max_sequence_length, d),
               "embeddings.token_type_embeddings.weight": init.normal(2, d),
               **init.norm("embeddings.LayerNorm", d, bias=True)}
    weights["embeddings.word_embeddings.weight"][pad_id] = 0.0  # nn.Embedding's padding_idx
    for i in range(num_layers):
        p = f"encoder.layer.{i}."
        for name in ("query", "key", "value"):
            weights.update(init.linear(f"{p}attention.self.{name}", d, d, bias=True))
        weights.update(init.linear(f"{p}attention.output.dense", d, d, bias=True))
        weights.update(init.norm(f"{p}attention.output.LayerNorm", d, bias=True))
        weights.update(init.linear(f"{p}intermediate.dense", inner, d, bias=True))
        weights.update(init.linear(f"{p}output.dense", d, inner, bias=True))
        weights.update(init.norm(f"{p}output.LayerNorm", d, bias=True))
    weights.update(init.linear("pooler.dense", d, d, bias=True))
    config = {
        "architectures": ["BertModel"], "model_type": "bert", "vocab_size": vocab,
        "hidden_size": d, "num_hidden_layers": num_layers, "num_attention_heads": num_heads,
        "intermediate_size": inner, "hidden_act": "gelu", "hidden_dropout_prob": dropout,
        "attention_probs_dropout_prob": dropout, "max_position_embeddings": max_sequence_length,
        "type_vocab_size": 2, "initializer_range": initializer_range, "layer_norm_eps": 1e-12,
        "pad_token_id": pad_id, "position_embedding_type": "absolute", "dtype": "float32"}
    tokenizer_config = {
        "tokenizer_class": "BertTokenizer", "do_lower_case": lowercase,
        "model_max_length": max_sequence_length,
        **{f"{key}_token": token for key, token in BERT_SPECIAL_TOKENS.items()}}
    _write(directory, config, weights, tokenizer_config, tokenizer)
    tokenizer.save_model(directory)  # vocab.txt, as BERT repositories have
    return directory


def _byte_level_bpe(texts: list[str], vocabulary_size: int):
    from tokenizers import (
        Regex,
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )

    tokenizer = Tokenizer(models.BPE(ignore_merges=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocabulary_size, show_progress=False,
                                  special_tokens=list(LLAMA_SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    bos = LLAMA_SPECIAL_TOKENS[0]
    tokenizer.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                      special_tokens=[(bos, tokenizer.token_to_id(bos))])])
    return tokenizer


def tiny_llama_checkpoint(directory: str, texts: Iterable[str], seed: int = 0, *,
                          vocabulary_size: int = 512, hidden_dim: int = 32,
                          num_layers: int = 2, num_heads: int = 4,
                          num_key_value_heads: int = 2, intermediate_dim: int = 64,
                          max_sequence_length: int = 256, rope_theta: float = 10000.0,
                          tie_word_embeddings: bool = False, initializer_range: float = 0.02,
                          overwrite: bool = False) -> str:
    """Write a `LlamaForCausalLM` checkpoint directory with random weights and a byte-level
    BPE tokenizer (Llama 3's) trained on `texts`.

    The model is Llama's: RMSNorm pre-norm blocks, rotary positions, grouped-query attention,
    a SwiGLU FFN, no biases. Token ids: `<|begin_of_text|>` 0 (the template's start),
    `<|end_of_text|>` 1 (the end of generation); no padding id.

    Args:
        directory: str, where to write (created; must be empty or new unless `overwrite`).
        texts: list of str, the tokenizer's training text.
        seed: int, the seed of the weights. Defaults to `0`.
        vocabulary_size: int, the BPE vocabulary's size: the 256 bytes, the two special tokens
            and merges learned from `texts` (fewer when the texts run out of pairs; the config
            gets the trained size). At least 258. Defaults to `512`.
        hidden_dim: int, the model width. Defaults to `32`.
        num_layers: int, decoder blocks. Defaults to `2`.
        num_heads: int, query heads; divides `hidden_dim` into heads of an even size (rotary
            positions rotate pairs). Defaults to `4`.
        num_key_value_heads: int, key/value heads; divides `num_heads`. Defaults to `2`.
        intermediate_dim: int, the SwiGLU FFN's inner width. Defaults to `64`.
        max_sequence_length: int, the configured context (`max_position_embeddings`).
            Defaults to `256`.
        rope_theta: float > 0, the rotary base. Defaults to `10000.0`.
        tie_word_embeddings: bool, the output projection is the token embedding. Defaults to
            `False`.
        initializer_range, overwrite: as for `tiny_bert_checkpoint`.

    Returns:
        `directory`, holding `config.json`, `model.safetensors`, `tokenizer.json` and
        `tokenizer_config.json`.

    Example:
    >>> tiny_llama_checkpoint("/tmp/tiny_llama", open("timemachine.txt").read().splitlines())
    >>> CausalLM.from_pretrained("/tmp/tiny_llama").generate("The Time", max_length=16)
    """
    texts = _check_texts(texts)
    sizes = _check_sizes(seed, vocabulary_size=vocabulary_size, hidden_dim=hidden_dim,
                         num_layers=num_layers, num_heads=num_heads,
                         num_key_value_heads=num_key_value_heads,
                         intermediate_dim=intermediate_dim,
                         max_sequence_length=max_sequence_length)
    if vocabulary_size < MIN_BYTE_LEVEL_VOCABULARY:
        raise ValueError(
            f"Argument `vocabulary_size` must be at least {MIN_BYTE_LEVEL_VOCABULARY} (the 256 "
            f"bytes and the special tokens). Received: vocabulary_size={vocabulary_size}")
    if hidden_dim % num_heads or (hidden_dim // num_heads) % 2:
        raise ValueError("Argument `num_heads` must divide `hidden_dim` into heads of an even "
                         f"size. Received: num_heads={num_heads}, hidden_dim={hidden_dim}")
    if num_heads % num_key_value_heads:
        raise ValueError("Argument `num_key_value_heads` must divide `num_heads`. Received: "
                         f"num_key_value_heads={num_key_value_heads}, num_heads={num_heads}")
    check_number("rope_theta", rope_theta, minimum=0.0, strict=True)
    check_number("initializer_range", initializer_range, minimum=0.0, strict=True)
    check_bool("tie_word_embeddings", tie_word_embeddings)
    check_bool("overwrite", overwrite)
    directory = _check_directory(directory, overwrite)
    tokenizer = _byte_level_bpe(texts, sizes["vocabulary_size"])
    vocab = tokenizer.get_vocab_size()
    bos, eos = (tokenizer.token_to_id(token) for token in LLAMA_SPECIAL_TOKENS)
    d, inner = hidden_dim, intermediate_dim
    head_dim = d // num_heads
    kv_dim = num_key_value_heads * head_dim
    init = _Init(seed, initializer_range)
    weights = {"model.embed_tokens.weight": init.normal(vocab, d)}
    for i in range(num_layers):
        p = f"model.layers.{i}."
        for name, out_dim in (("q_proj", d), ("k_proj", kv_dim), ("v_proj", kv_dim),
                              ("o_proj", d)):
            weights.update(init.linear(f"{p}self_attn.{name}", out_dim, d, bias=False))
        weights.update(init.linear(f"{p}mlp.gate_proj", inner, d, bias=False))
        weights.update(init.linear(f"{p}mlp.up_proj", inner, d, bias=False))
        weights.update(init.linear(f"{p}mlp.down_proj", d, inner, bias=False))
        weights.update(init.norm(f"{p}input_layernorm", d, bias=False))
        weights.update(init.norm(f"{p}post_attention_layernorm", d, bias=False))
    weights.update(init.norm("model.norm", d, bias=False))
    if not tie_word_embeddings:
        weights.update(init.linear("lm_head", vocab, d, bias=False))
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
        "hidden_size": d, "intermediate_size": inner, "num_hidden_layers": num_layers,
        "num_attention_heads": num_heads, "num_key_value_heads": num_key_value_heads,
        "head_dim": head_dim, "hidden_act": "silu",
        "max_position_embeddings": max_sequence_length, "rms_norm_eps": 1e-5,
        "rope_theta": float(rope_theta), "attention_bias": False, "mlp_bias": False,
        "attention_dropout": 0.0, "tie_word_embeddings": tie_word_embeddings,
        "initializer_range": initializer_range, "bos_token_id": bos, "eos_token_id": eos,
        "dtype": "float32"}
    tokenizer_config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": LLAMA_SPECIAL_TOKENS[0],
        "eos_token": LLAMA_SPECIAL_TOKENS[1], "model_max_length": max_sequence_length}
    return _write(directory, config, weights, tokenizer_config, tokenizer)
