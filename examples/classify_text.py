"""English or French? A BERT text classifier fine-tuned with `keras_attn.tasks.TextClassifier`.

The labelled set is built from the Tatoeba English-French pairs (../shared/data/fra-eng.txt from
the project root, d2l's `fra-eng` file; --data reads another `English<TAB>French` file): each
pair gives an English sentence (label 0, "english") and a French one (label 1, "french").
`--num-pairs` pairs are drawn at random (seeded) from the whole file, which is sorted by length,
and split by their English sentence (`keras_attn.data.pairs.split_by_source`), so that a sentence
and its translations are in one split only; a text that is also in the training split (a
French sentence translating two English ones, a name spelled alike in both languages) is
dropped from the validation and test splits, and a text with both labels from every split.

CHECKPOINT_DIR is a Hugging Face BERT directory (`BertModel` or `BertForMaskedLM`: config.json,
safetensors weights, tokenizer.json or vocab.txt), e.g. one downloaded with `huggingface-cli
download google-bert/bert-base-multilingual-uncased --local-dir DIR`. Without one the script
builds a tiny BERT offline into OUT/checkpoint (`keras_attn.recipes.tiny_bert_checkpoint`: an
uncased WordPiece vocabulary trained on the training sentences, random weights from --seed), so
it runs from a clone; from random weights, "fine-tuning" is training the whole encoder.

The run prints the test accuracy before and after fine-tuning and writes to --out:
`metrics.json`, `model.keras` (the classifier with its tokenizer) and `saved_model/`, whose
`classify` signature takes strings (served by TensorFlow with tensorflow-text's ops), and
serves a few sentences through that SavedModel at the end.

    python examples/classify_text.py
    python examples/classify_text.py path/to/bert --epochs 2 --learning-rate 3e-5
    python examples/classify_text.py --num-pairs 1000 --epochs 1 --out /tmp/classify
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time

from example_utils import (
    HelpFormatter,
    check_run_dirs,
    import_tensorflow_quietly,
    positive,
)

DEFAULT_DATA = os.path.normpath(os.path.join(
    os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "shared", "data",
    "fra-eng.txt"))
LABELS = ("english", "french")
DTYPES = ("float32", "bfloat16", "float16")
# Served through the SavedModel at the end, with a few test sentences.
EXAMPLES = ["The weather is lovely today.", "Il fait très beau aujourd'hui.",
            "Where did you put my keys?", "Je ne sais pas où sont mes clés."]


def _positive(kind):  # integer counts (the float options take example_utils.positive)
    def parse(text: str):
        value = kind(text)
        if not value > 0:
            raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
        return value
    return parse


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:3]))
    parser.add_argument("checkpoint", nargs="?", default=None,
                        help="a Hugging Face BERT directory (default: a tiny BERT built "
                             "offline into OUT/checkpoint)")
    parser.add_argument("--data", default=DEFAULT_DATA,
                        help="tab-separated English-French pairs")
    parser.add_argument("--out", default="runs/classify_text",
                        help="directory for everything the run writes")
    parser.add_argument("--num-pairs", type=_positive(int), default=4000,
                        help="pairs drawn at random from the file (two texts each)")
    parser.add_argument("--test-fraction", type=float, default=0.1,
                        help="share of the English sentences (with their pairs) held out "
                             "for the test")
    parser.add_argument("--validation-fraction", type=float, default=0.1,
                        help="likewise for validation")
    parser.add_argument("--epochs", type=_positive(int), default=3,
                        help="passes over the training texts")
    parser.add_argument("--batch-size", type=_positive(int), default=32,
                        help="texts per training step")
    parser.add_argument("--learning-rate", type=positive, default=None,
                        help="Adam's rate (default: 5e-5, keras-hub's, for a given "
                             "checkpoint; 1e-3 for the tiny BERT trained from random "
                             "weights)")
    parser.add_argument("--sequence-length", type=_positive(int), default=64,
                        help="token ids per text, [CLS] and [SEP] included (longer texts "
                             "are cut)")
    parser.add_argument("--dtype", choices=DTYPES, default=None,
                        help="the model's dtype (default: the checkpoint's)")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the sample, the splits, the tiny BERT and training")
    tiny = parser.add_argument_group("the tiny BERT built without CHECKPOINT_DIR")
    tiny.add_argument("--tiny-hidden-dim", type=_positive(int), default=64,
                      help="model width")
    tiny.add_argument("--tiny-layers", type=_positive(int), default=2, help="encoder blocks")
    tiny.add_argument("--tiny-heads", type=_positive(int), default=4,
                      help="attention heads (divides --tiny-hidden-dim)")
    tiny.add_argument("--tiny-intermediate-dim", type=_positive(int), default=128,
                      help="feed-forward width")
    tiny.add_argument("--tiny-vocabulary-size", type=_positive(int), default=2000,
                      help="WordPiece tokens learned from the training texts (at most)")
    parser.add_argument("--no-export", action="store_true",
                        help="skip the SavedModel")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results of an earlier run in --out")
    args = parser.parse_args(argv)
    if args.checkpoint is not None and not os.path.isfile(
            os.path.join(args.checkpoint, "config.json")):
        parser.error(f"{args.checkpoint} has no config.json: pass a Hugging Face BERT "
                     "directory, or nothing for the tiny BERT")
    if not os.path.isfile(args.data):
        parser.error(f"--data {args.data} is not a file (the default is where this project's "
                     "machines keep the Tatoeba pairs: ../shared/data/fra-eng.txt)")
    for name in ("test_fraction", "validation_fraction"):
        if not 0 < getattr(args, name) < 0.5:
            parser.error(f"--{name.replace('_', '-')} must be in (0, 0.5), got "
                         f"{getattr(args, name)}")
    if args.tiny_hidden_dim % args.tiny_heads:
        parser.error("--tiny-heads must divide --tiny-hidden-dim")
    if args.sequence_length < 3:
        parser.error("--sequence-length must leave room for [CLS], a token and [SEP]")
    return args


def _earlier_run(args: argparse.Namespace, export_dir: str | None) -> str | None:
    """Why this run would replace an earlier run's files, or None."""
    problem = check_run_dirs(args.out, export_dir, args.overwrite)
    if problem or args.overwrite:
        return problem
    for name in ("model.keras", "checkpoint"):
        path = os.path.join(args.out, name)
        if os.path.isfile(path) or (os.path.isdir(path) and os.listdir(path)):
            return (f"{path} holds an earlier run's files; pass --overwrite to replace them, "
                    "or choose another --out")
    return None


def labelled_splits(args: argparse.Namespace) -> dict:
    """`{"train", "validation", "test"}` -> `(texts, labels)`: English 0, French 1."""
    from keras_attn.data.pairs import split_by_source

    with open(args.data, encoding="utf-8") as file:
        pairs = [tuple(line.rstrip("\n").split("\t")[:2]) for line in file if "\t" in line]
    pairs = [(en.strip(), fr.strip()) for en, fr in pairs if en.strip() and fr.strip()]
    pairs = random.Random(args.seed).sample(pairs, min(args.num_pairs, len(pairs)))
    train, validation, test = split_by_source(pairs, args.test_fraction,
                                              args.validation_fraction, seed=args.seed)
    # Both labels: a text that is English in one pair and French in another (or the same).
    both = {en for en, _ in pairs} & {fr for _, fr in pairs}
    seen = {text for pair in train for text in pair}
    splits = {}
    for name, split in (("train", train), ("validation", validation), ("test", test)):
        labelled = {text: label for pair in split for label, text in enumerate(pair)
                    if text not in both and (name == "train" or text not in seen)}
        splits[name] = (list(labelled), list(labelled.values()))
    return splits


def build_checkpoint(args: argparse.Namespace, texts: list[str]) -> str:
    """The checkpoint to fine-tune: CHECKPOINT_DIR, or a tiny BERT built into OUT/checkpoint
    with a vocabulary of the training texts."""
    if args.checkpoint is not None:
        return args.checkpoint
    from keras_attn.recipes import tiny_bert_checkpoint

    return tiny_bert_checkpoint(
        os.path.join(args.out, "checkpoint"), texts, seed=args.seed,
        vocabulary_size=args.tiny_vocabulary_size, hidden_dim=args.tiny_hidden_dim,
        num_layers=args.tiny_layers, num_heads=args.tiny_heads,
        intermediate_dim=args.tiny_intermediate_dim,
        max_sequence_length=max(args.sequence_length, 64), overwrite=args.overwrite)


def serve(export_dir: str, texts: list[str]) -> list[dict]:
    """The SavedModel's `classify` answers for `texts`, as a consumer gets them."""
    import numpy as np
    import tensorflow as tf

    classify = tf.saved_model.load(export_dir).signatures["classify"]
    out = classify(text=tf.constant(texts))
    probabilities = tf.nn.softmax(out["logits"]).numpy()
    return [{"text": text, "label": LABELS[int(label)],
             "probability": round(float(np.max(p)), 4)}
            for text, label, p in zip(texts, out["label"].numpy(), probabilities)]


def main(argv=None) -> dict:
    args = parse_args(argv)
    export_dir = None if args.no_export else os.path.join(args.out, "saved_model")
    problem = _earlier_run(args, export_dir)
    if problem:
        raise SystemExit(problem)
    import_tensorflow_quietly()
    import keras

    from keras_attn.recipes.runtime import clear_export_dir, fit_verbosity
    from keras_attn.tasks import TextClassifier

    keras.utils.set_random_seed(args.seed)
    splits = labelled_splits(args)
    sizes = {name: len(texts) for name, (texts, _) in splits.items()}
    print(f"{args.data}: {sizes['train']} training, {sizes['validation']} validation and "
          f"{sizes['test']} test texts (English and French)")
    os.makedirs(args.out, exist_ok=True)
    start = time.perf_counter()
    checkpoint = build_checkpoint(args, splits["train"][0])
    classifier = TextClassifier.from_pretrained(checkpoint, num_classes=len(LABELS),
                                                dtype=args.dtype,
                                                sequence_length=args.sequence_length)
    print(f"{'built' if args.checkpoint is None else 'loaded'} {checkpoint} "
          f"({classifier.backbone.count_params():,} parameters, head on the "
          f"{classifier.pooling}) in {time.perf_counter() - start:.1f} s")
    learning_rate = args.learning_rate or (1e-3 if args.checkpoint is None else 5e-5)
    classifier.compile(optimizer=keras.optimizers.Adam(learning_rate))
    test = splits["test"]
    before = classifier.evaluate(*test, batch_size=args.batch_size, verbose=0)
    print(f"test accuracy before fine-tuning: {before[1]:.4f} (loss {before[0]:.4f})")
    start = time.perf_counter()
    history = classifier.fit(*splits["train"], batch_size=args.batch_size, epochs=args.epochs,
                             validation_data=splits["validation"],
                             verbose=fit_verbosity())
    train_seconds = time.perf_counter() - start
    after = classifier.evaluate(*test, batch_size=args.batch_size, verbose=0)
    print(f"test accuracy after fine-tuning:  {after[1]:.4f} (loss {after[0]:.4f}), "
          f"{train_seconds:.0f} s of training")
    predicted = classifier.predict(test[0], batch_size=args.batch_size, verbose=0).argmax(-1)
    errors = [{"text": text, "label": LABELS[label], "predicted": LABELS[guess]}
              for text, label, guess in zip(*test, predicted.tolist()) if guess != label]
    for error in errors[:5]:
        print(f"  wrong: {error['text']!r} ({error['label']}) read as {error['predicted']}")
    metrics = {
        "checkpoint": os.path.abspath(checkpoint), "built_checkpoint": args.checkpoint is None,
        "parameters": classifier.count_params(), "pooling": classifier.pooling,
        "data": os.path.abspath(args.data), "texts": sizes,
        "test_accuracy_before": before[1], "test_loss_before": before[0],
        "test_accuracy": after[1], "test_loss": after[0], "test_errors": errors,
        "train_seconds": train_seconds,
        "history": {key: [float(v) for v in values]
                    for key, values in history.history.items()},
        "settings": {key: value for key, value in vars(args).items()
                     if key not in ("checkpoint", "data", "out")}
                    | {"learning_rate": learning_rate}}
    classifier.save(os.path.join(args.out, "model.keras"))
    if export_dir is not None:
        clear_export_dir(export_dir)
        classifier.export(export_dir)
        metrics["saved_model"] = export_dir
        metrics["served"] = serve(export_dir, EXAMPLES + test[0][:4])
        print(f"served by {export_dir}:")
        for answer in metrics["served"]:
            print(f"  {answer['label']:>7} {answer['probability']:.3f}  {answer['text']}")
    with open(os.path.join(args.out, "metrics.json"), "w", encoding="utf-8") as file:
        json.dump(metrics, file, ensure_ascii=False, indent=1)
    return metrics


if __name__ == "__main__":
    main()
