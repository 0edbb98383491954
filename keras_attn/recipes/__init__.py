"""Code that serves the example scripts (recipes), not the library's API: what an example needs
to run from a clone without a download.

- `tiny_checkpoints`: `tiny_bert_checkpoint(directory, texts)` and
  `tiny_llama_checkpoint(directory, texts)` write small Hugging Face checkpoint directories
  (`config.json`, `model.safetensors`, tokenizer files trained on the given texts) with random
  weights from a seed, offline and without torch; `keras_attn.checkpoints.from_pretrained`,
  the task models' `from_pretrained` and `transformers` load them.

The examples import this package as `keras_attn.recipes`, never through `sys.path`.
"""

from keras_attn.recipes.tiny_checkpoints import (
    tiny_bert_checkpoint,
    tiny_llama_checkpoint,
)

__all__ = ["tiny_bert_checkpoint", "tiny_llama_checkpoint"]
