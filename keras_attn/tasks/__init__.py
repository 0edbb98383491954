"""Models people use whole (keras-hub's tasks): a backbone, a preprocessor (tokenizer, special
ids, packing) and a sampler; `from_pretrained`, `generate` on strings, `fit` on text, `.keras`
and SavedModel export. The free functions below them (`keras_attn.decoding.generate`,
`keras_attn.checkpoints.from_pretrained`, the exporters) stay the low-level layer.

- `CausalLM`: Llama, Mistral, Qwen2, GPT-2 checkpoints and keras_attn's own language models.
- `TextClassifier`: BERT checkpoints with a classification head; `fit` on (strings, labels).
"""

from keras_attn.tasks.causal_lm import CausalLM
from keras_attn.tasks.seq2seq_lm import Seq2SeqLM
from keras_attn.tasks.task import Task
from keras_attn.tasks.text_classifier import TextClassifier

__all__ = ["CausalLM", "Seq2SeqLM", "Task", "TextClassifier"]
