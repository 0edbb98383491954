"""Train a Transformer translator, score it on held-out data, and export it as a SavedModel.

By default it learns the built-in date-normalization task ("the 3rd of march, 2021" ->
"2021-03-03", 19 formats listed by `--help`; no download) in a few minutes on a laptop CPU.
With `--data fra.txt` it trains on a Tatoeba/Anki English–French export instead. Either way it
prints exact match and corpus BLEU (0–100) on the test split with sample translations, and
writes everything into `--out`: metrics.json, attention_<i>.png (the cross-attention of the
last decoder layer, one panel per head), history.png and saved_model/, a SavedModel whose
`translate` signature takes raw strings and returns the translation, a confidence score and a
truncation flag, with TensorFlow alone.

    python examples/transformer_translation.py --out runs/transformer
    python examples/transformer_translation.py --data fra.txt --out runs/transformer_fra
"""

from __future__ import annotations

import sys

from example_utils import import_tensorflow_quietly, rate
from translation_args import parse_args

DEFAULTS = {
    "dates": {"num_examples": 20000, "epochs": 14, "batch_size": 128, "learning_rate": 2e-3,
              "out": "runs/transformer", "num_layers": 2, "embed_dim": 64, "num_heads": 4,
              "ffn_dim": 128, "dropout": 0.1, "label_smoothing": 0.0, "warmup_steps": 0,
              "precision": "float32"},
    # Tuned for quality per second of training on 2 CPU cores (benchmarks/RESULTS.md,
    # "Translation"): a narrow model with a wide FFN learns fastest in a 10-minute budget;
    # at 700 s label smoothing regularises better than dropout, and batch 32 (1.7x the
    # updates of batch 64, 15% fewer sentences) learns more.
    "tatoeba": {"num_examples": None, "epochs": 4, "batch_size": 32, "learning_rate": 1e-3,
                "out": "runs/transformer_tatoeba", "num_layers": 2, "embed_dim": 128,
                "num_heads": 4, "ffn_dim": 512, "dropout": 0.0, "max_length": 12,
                "min_freq": 2, "tokenizer": "sentencepiece", "vocab_size": 4000,
                "label_smoothing": 0.1, "warmup_steps": 300,
                "precision": "mixed_bfloat16", "beam_size": 4, "length_penalty": 1.2},
}

MODEL_FLAGS = {
    "num_layers": (int, "encoder and decoder blocks, each"),
    "embed_dim": (int, "width of the token embeddings and of every block"),
    "num_heads": (int, "attention heads (must divide --embed-dim)"),
    "ffn_dim": (int, "hidden width of the position-wise feed-forward networks"),
    "dropout": (rate, "dropout rate, in [0, 1)"),
}

USAGE = (
    "python examples/transformer_translation.py --out runs/transformer",
    ("python examples/transformer_translation.py --epochs 2 --num-examples 2000 --out /tmp/tr"
     "   # a quick check that everything runs: most translations come out wrong"),
    "python examples/transformer_translation.py --num-layers 1 --embed-dim 32 --out runs/small",
    "python examples/transformer_translation.py --data fra.txt --out runs/transformer_fra",
)


def build_model(data, args):
    from keras_attn.models import transformer_seq2seq

    return transformer_seq2seq(
        data.source_vocab_size, data.target_vocab_size, num_layers=args.num_layers,
        hidden_dim=args.embed_dim, num_heads=args.num_heads, intermediate_dim=args.ffn_dim,
        dropout=args.dropout,
    )


def main(argv=None) -> dict:
    args = parse_args(__doc__.splitlines()[0], DEFAULTS, argv, MODEL_FLAGS, USAGE)
    import_tensorflow_quietly()
    from keras_attn.recipes.translation import run

    return run("transformer", args, build_model, DEFAULTS)


if __name__ == "__main__":
    main(sys.argv[1:])
