"""Train a GRU seq2seq translator with Bahdanau attention, score it, export it.

The seq2seq model of Bahdanau et al. (2015): at each output step the previous decoder state
attends (additive attention) over the encoder states. By default it learns the built-in
date-normalization task (19 formats listed by `--help`; no download); `--data fra.txt` trains
on a Tatoeba/Anki English–French export. Prints exact match and corpus BLEU (0–100) on the test
split with sample translations, and writes everything into `--out`: metrics.json,
attention_<i>.png (which source tokens each output step looked at), history.png and
saved_model/, a SavedModel that serves raw strings (translation, confidence score, truncation
flag) with TensorFlow alone.

    python examples/bahdanau_translation.py --out runs/bahdanau
"""

from __future__ import annotations

import sys

from example_utils import import_tensorflow_quietly, rate
from translation_args import parse_args

DEFAULTS = {
    "dates": {"num_examples": 20000, "epochs": 10, "batch_size": 128, "learning_rate": 3e-3,
              "out": "runs/bahdanau", "embed_dim": 32, "units": 128, "num_layers": 1,
              "dropout": 0.1, "label_smoothing": 0.0, "warmup_steps": 0,
              "precision": "float32"},
    "tatoeba": {"num_examples": None, "epochs": 15, "batch_size": 128, "learning_rate": 1e-3,
                "out": "runs/bahdanau_tatoeba", "embed_dim": 128, "units": 256, "num_layers": 2,
                "dropout": 0.2, "max_length": 12, "min_freq": 2, "tokenizer": "word", "vocab_size": 8000, "label_smoothing": 0.0,
                "warmup_steps": 0, "precision": "float32"},
}

MODEL_FLAGS = {
    "num_layers": (int, "stacked GRU layers in the encoder and in the decoder"),
    "embed_dim": (int, "width of the token embeddings"),
    "units": (int, "size of the GRU states and of the attention"),
    "dropout": (rate, "dropout rate, in [0, 1)"),
}

USAGE = (
    "python examples/bahdanau_translation.py --out runs/bahdanau",
    "python examples/bahdanau_translation.py --epochs 2 --num-examples 2000 --out /tmp/bd",
    "python examples/bahdanau_translation.py --data fra.txt --out runs/bahdanau_fra",
)


def build_model(data, args):
    from keras_attn.models import bahdanau_seq2seq

    return bahdanau_seq2seq(
        data.source_vocab_size, data.target_vocab_size, embedding_dim=args.embed_dim,
        units=args.units, num_layers=args.num_layers, dropout=args.dropout, seed=args.seed,
    )


def main(argv=None) -> dict:
    args = parse_args(__doc__.splitlines()[0], DEFAULTS, argv, MODEL_FLAGS, USAGE,
                      unsupported={"export_format": "--export-format is an option of the "
                                   "Transformer example (the Bahdanau one exports a "
                                   "SavedModel)"})
    import_tensorflow_quietly()
    from keras_attn.recipes.translation import run

    return run("bahdanau", args, build_model, DEFAULTS)


if __name__ == "__main__":
    main(sys.argv[1:])
