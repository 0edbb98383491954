"""Data for the examples: kernel regression toy data and translation tasks.

- `make_kernel_regression_data`: the d2l Nadaraya-Watson toy problem (numpy).
- `load_dates_translation`: built-in date normalization ("3/3/21" -> "2021-03-03"), no download.
- `load_tatoeba`: tab-separated sentence pairs (d2l's `fra.txt` and other Tatoeba exports),
  with word or subword (`tokenizer="sentencepiece"`) vocabularies.
- `learn_sentencepiece`, `SentencePieceVectorizer`: subword vocabularies learned from a training
  split and applied inside graphs (`keras_attn.data.subwords`).
- `make_cmlm_dataset`: masked-target batches of a translation task for the non-autoregressive
  translator (`keras_attn.models.nat_seq2seq`).

Both translation loaders return a `TranslationData` whose vocabularies start with the reserved
ids of `keras_attn.tokens` (`PAD_ID`, `UNK_ID`, `BOS_ID`, `EOS_ID`), re-exported here.
"""

from keras_attn.data import dates, nat, nw, pairs, subwords
from keras_attn.data.dates import load_dates, load_dates_translation
from keras_attn.data.nat import make_cmlm_dataset
from keras_attn.data.nw import (
    KernelRegressionData,
    make_kernel_regression_data,
    true_function,
)
from keras_attn.data.pairs import load_tatoeba, preprocess, preprocess_tf, read_pairs
from keras_attn.data.subwords import SentencePieceVectorizer, learn_sentencepiece
from keras_attn.data.translation import (
    BOS,
    BOS_ID,
    EOS,
    EOS_ID,
    PAD_ID,
    RESERVED_TOKENS,
    UNK_ID,
    WHITESPACE,
    TranslationData,
    build_vectorizer,
)

__all__ = [
    "BOS",
    "BOS_ID",
    "EOS",
    "EOS_ID",
    "PAD_ID",
    "RESERVED_TOKENS",
    "UNK_ID",
    "WHITESPACE",
    "KernelRegressionData",
    "SentencePieceVectorizer",
    "TranslationData",
    "build_vectorizer",
    "dates",
    "learn_sentencepiece",
    "load_dates",
    "load_dates_translation",
    "load_tatoeba",
    "make_cmlm_dataset",
    "make_kernel_regression_data",
    "nat",
    "nw",
    "pairs",
    "preprocess",
    "preprocess_tf",
    "read_pairs",
    "subwords",
    "true_function",
]
