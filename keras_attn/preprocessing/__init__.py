"""Text in, ids out, and back: tokenizers as Keras layers and the preprocessors of the task
models (`keras_attn.tasks`), with TensorFlow ops (imported when they first run).

- `tokenizers`: `Tokenizer` (the interface), `CharacterTokenizer` (keras_attn's own
  vocabularies), `PretrainedTokenizer` (a Hugging Face checkpoint's files);
- `causal_lm`: `CausalLMPreprocessor`, the special ids, the training layout and the prompt
  layout of a causal language model;
- `seq2seq_lm`: `Seq2SeqLMPreprocessor`, a translator's two vocabularies and text
  normalization: sources and `(source, target)` pairs to ids, target ids to text;
- `text_classifier`: `TextClassifierPreprocessor`, single texts in the tokenizer's template,
  truncated and padded for an encoder (BERT);
- `chat`: `ChatTemplate`, a checkpoint's chat template rendering conversations as
  transformers' `apply_chat_template` does (`CausalLMPreprocessor.apply_chat_template`).
"""

from keras_attn.preprocessing.causal_lm import CausalLMPreprocessor
from keras_attn.preprocessing.chat import ChatTemplate
from keras_attn.preprocessing.seq2seq_lm import Seq2SeqLMPreprocessor
from keras_attn.preprocessing.text_classifier import TextClassifierPreprocessor
from keras_attn.preprocessing.tokenizers import (
    CharacterTokenizer,
    PretrainedTokenizer,
    Tokenizer,
)

__all__ = ["CausalLMPreprocessor", "CharacterTokenizer", "ChatTemplate", "PretrainedTokenizer",
           "Seq2SeqLMPreprocessor", "TextClassifierPreprocessor", "Tokenizer"]
