"""Pretrained checkpoints in: Hugging Face directories and keras-hub backbones.

Everything here is NumPy and plain Python, whatever the Keras backend (torch is never
imported); only the tokenizers need TensorFlow (their ops run inside a TF graph).

- `load_hf_checkpoint(directory, dtype=None) -> (spec, weights)`: `config.json` (+
  `generation_config.json`) and the safetensors weights of a `LlamaForCausalLM`,
  `MistralForCausalLM`, `Qwen2ForCausalLM`, `GPT2LMHeadModel`, `BertModel` or
  `BertForMaskedLM` checkpoint; what the conversion cannot honour is refused with a ValueError
  naming the config key (`hf_config`'s table).
- `spec_from_keras_hub(model)`, `canonical_from_keras_hub(model)`: the same two things read from
  a keras-hub `GPT2Backbone`, `LlamaBackbone`, `MistralBackbone` or `BertBackbone` (or their
  `CausalLM` / `MaskedLM` tasks) in memory.
- `ArchitectureSpec` (`spec`): the architecture; `canonical_shapes(spec)` (`canonical`): every
  weight a spec has, with its shape and meaning.
- `read_safetensors`, `read_config` (`files`); `spec_from_hf_config`;
  `canonical_from_hf_state_dict`; `rope_inverse_frequencies` (`keras_attn.ops.rope`).
- `build_model(spec, weights, dtype=None)` (`build`): the keras_attn model of a spec (one
  assembly: `TransformerDecoderOnly` or BERT's `TransformerEncoder`) with the weights set;
  `generation_ids(spec)`: the checkpoint's eos/pad ids for `keras_attn.decoding.generate`;
  `from_pretrained(directory, dtype=None) -> (model, tokenizer, spec)`: all of it at once.
- `load_tokenizer(directory)` (`tokenizer`, TensorFlow): the checkpoint's tokenizer, encoding
  and decoding as the `tokenizers` library does, inside a TF graph.
"""

from keras_attn.checkpoints.build import (
    build_model,
    from_pretrained,
    generation_ids,
    set_weights,
)
from keras_attn.checkpoints.canonical import canonical_shapes, check_canonical
from keras_attn.checkpoints.files import read_config, read_safetensors
from keras_attn.checkpoints.from_keras_hub import (
    canonical_from_keras_hub,
    spec_from_keras_hub,
)
from keras_attn.checkpoints.hf_config import spec_from_hf_config
from keras_attn.checkpoints.hf_weights import (
    canonical_from_hf_state_dict,
    load_hf_checkpoint,
)
from keras_attn.checkpoints.spec import ArchitectureSpec
from keras_attn.ops.rope import rope_inverse_frequencies

__all__ = [
    "ArchitectureSpec", "build_model", "canonical_from_hf_state_dict",
    "canonical_from_keras_hub", "canonical_shapes", "check_canonical", "from_pretrained",
    "generation_ids", "load_hf_checkpoint", "load_tokenizer", "read_config",
    "read_safetensors", "rope_inverse_frequencies", "set_weights", "spec_from_hf_config",
    "spec_from_keras_hub",
]


def __getattr__(name):
    # The tokenizers import TensorFlow: only when asked for.
    if name in ("load_tokenizer", "CheckpointTokenizer"):
        from keras_attn.checkpoints import tokenizer

        return getattr(tokenizer, name)
    raise AttributeError(f"module 'keras_attn.checkpoints' has no attribute {name!r}")
