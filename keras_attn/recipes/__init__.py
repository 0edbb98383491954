"""Code that serves the example scripts and the benchmarks (recipes), not the library's API:
what an example needs to run from a clone without a download, and the code the scripts share.

- `tiny_checkpoints`: `tiny_bert_checkpoint(directory, texts)` and
  `tiny_llama_checkpoint(directory, texts)` write small Hugging Face checkpoint directories
  (`config.json`, `model.safetensors`, tokenizer files trained on the given texts) with random
  weights from a seed, offline and without torch; `keras_attn.checkpoints.from_pretrained`,
  the task models' `from_pretrained` and `transformers` load them.
- `runtime`: what a script needs once its arguments are parsed: `write_export(export_dir,
  write)` (an earlier SavedModel replaced only once the new one is written),
  `clear_export_dir`, `fit_verbosity()` (one line per epoch when stdout is not a terminal) and
  `time_budget_callback(seconds, learning_rate, ...)` (the learning-rate schedule fitted to a
  budget of training seconds, with checkpoint averaging).
- `translation`: the translation examples' data and training: `run(name, args, build_model)`
  trains, then scores, draws and exports; `load_data`, `data_options`, `compile_translator`,
  `fit_plan` and the rest are what `examples/nat_translation.py` and the translation
  benchmarks reuse.
- `translation_eval`: what is done with a trained translator: `translate`, `score`
  (exact match, corpus BLEU), `draw_attention`, `print_samples`, `check_export` (the served
  `translate` signature against the model in Python).

The examples import this package as `keras_attn.recipes`, never through `sys.path`, and only
after parsing their arguments: importing `keras_attn` imports Keras and TensorFlow, so the
scripts' argument parsing (`examples/example_utils.py`, `examples/translation_args.py`) stays
beside them and answers `--help` at once. Nothing in the rest of the library imports this
package.
"""

from keras_attn.recipes.tiny_checkpoints import (
    tiny_bert_checkpoint,
    tiny_llama_checkpoint,
)

__all__ = ["tiny_bert_checkpoint", "tiny_llama_checkpoint"]
