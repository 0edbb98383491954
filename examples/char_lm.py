"""A character language model on H. G. Wells' The Time Machine, trained with `model.fit`.

A small decoder-only Transformer (`keras_attn.models.causal_lm`: rotary positions, RMSNorm,
SwiGLU, grouped-query attention) learns the next character of the book, as in d2l's language
model chapter (letters and spaces, lowercased). The run prints the validation perplexity and
samples at a few temperatures, and writes to `--out`: `metrics.json`, `history.png` (the loss),
`attention.png` (the last layer's heads on a sample) and `saved_model/`, a SavedModel whose
`generate` signature continues prompt strings with TensorFlow alone; it normalizes a prompt as
the book was (lowercased, anything but a-z one space), so "The Time Traveller," works.

The book is Project Gutenberg's plain text of The Time Machine (eBook #35, public domain in the
US): this project's machines keep a copy at ../shared/data/timemachine.txt from the project root
(the default --data); from a clone elsewhere, --download fetches it from Project Gutenberg, or
--data reads any plain-text book.

    python examples/char_lm.py
    python examples/char_lm.py --download --out /tmp/char_lm
    python examples/char_lm.py --epochs 2 --out /tmp/char_lm
    python examples/char_lm.py --data path/to/book.txt --num-layers 4 --embed-dim 256
    python examples/char_lm.py --prompt "the time machine " --prompt "weena"
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import time

from example_utils import HelpFormatter, positive

DEFAULT_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir,
                            "shared", "data", "timemachine.txt")
BOOK_URL = "https://www.gutenberg.org/cache/epub/35/pg35.txt"
# The book's normalization, for training and for the exported signature's prompts: lowercase,
# then every run of anything but a-z one space.
NOT_LETTERS = "[^a-z]+"
# What the run continues at three temperatures when no --prompt is given, and how: 80 new
# characters in a cache of 128 positions (<bos>, the prompt and the continuation).
PROMPTS = ("the time traveller ", "it was ")
SAMPLE_NEW, SAMPLE_LENGTH = 80, 128


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        formatter_class=HelpFormatter,
        epilog="the book: Project Gutenberg's The Time Machine (eBook #35, public domain in the "
               "US),\n  at ../shared/data/timemachine.txt on this project's machines;\n"
               f"  elsewhere --download fetches it from {BOOK_URL}\n"
               "examples:\n  python examples/char_lm.py --epochs 2 --out /tmp/char_lm\n"
               "  python examples/char_lm.py --download --out /tmp/char_lm")
    parser.add_argument("--data", default=os.path.normpath(DEFAULT_DATA),
                        help="the book as plain text (a Project Gutenberg file, header and "
                             "licence footer included, is fine); the default is where this "
                             "project's machines keep The Time Machine")
    parser.add_argument("--download", action="store_true",
                        help=f"instead of --data, fetch The Time Machine from {BOOK_URL} into "
                             "the Keras cache (~/.keras/datasets) and train on it")
    parser.add_argument("--out", default="runs/char_lm", help="directory for everything the "
                        "run writes")
    parser.add_argument("--epochs", type=int, default=6, help="training epochs")
    parser.add_argument("--steps-per-epoch", type=int, default=150,
                        help="batches per epoch (windows drawn at random from the book)")
    parser.add_argument("--batch-size", type=int, default=64, help="windows per batch")
    parser.add_argument("--seq-len", type=int, default=64, help="characters per example")
    parser.add_argument("--learning-rate", type=positive, default=3e-3,
                        help="AdamW's peak rate, decayed to 0 over the run (cosine)")
    parser.add_argument("--num-layers", type=int, default=2, help="decoder blocks")
    parser.add_argument("--embed-dim", type=int, default=128, help="model width")
    parser.add_argument("--num-heads", type=int, default=4, help="query heads per block")
    parser.add_argument("--num-kv-heads", type=int, default=2,
                        help="key/value heads (grouped-query attention)")
    parser.add_argument("--ffn-dim", type=int, default=256,
                        help="hidden width of each block's SwiGLU feed-forward network")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the weights, the windows and the samples")
    parser.add_argument("--prompt", action="append", default=None,
                        help="text to continue after training, at temperatures 0, 0.6 and 1 "
                             "(repeat for several; normalized as the book: lowercased, "
                             "anything but a-z one space) (default: "
                             + " and ".join(repr(p) for p in PROMPTS) + ")")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier run's SavedModel in --out")
    args = parser.parse_args(argv)
    args.prompt = args.prompt or list(PROMPTS)
    longest = SAMPLE_LENGTH - 1 - SAMPLE_NEW
    for prompt in args.prompt:
        if len(standardize(prompt)) > longest:
            parser.error(f"--prompt must be at most {longest} characters once normalized "
                         f"(room for <bos> and {SAMPLE_NEW} new ones). Received: --prompt "
                         f"{prompt!r}")
    return args


def standardize(text: str) -> str:
    """The book's normalization: lowercased, every run of anything but a-z one space."""
    return re.sub(NOT_LETTERS, " ", text.lower())


def standardize_tf(text):
    """`standardize` with `tf.strings` ops, for a `(B,)` string tensor: what the exported
    `generate` signature does to its prompts."""
    import tensorflow as tf

    return tf.strings.regex_replace(tf.strings.lower(text, encoding="utf-8"), NOT_LETTERS, " ")


def book_path(args: argparse.Namespace) -> str:
    """The book to read: `--data`, or with `--download` Project Gutenberg's copy (cached)."""
    if not args.download:
        return args.data
    if os.path.normpath(args.data) != os.path.normpath(DEFAULT_DATA):
        raise SystemExit(f"Give --data or --download, not both. Received: --data {args.data}")
    import keras

    return keras.utils.get_file("timemachine_pg35.txt", origin=BOOK_URL)


def read_book(path: str) -> str:
    """The book as d2l reads it: letters only, lowercased, runs of anything else one space;
    Project Gutenberg's header and licence footer left out."""
    if not os.path.isfile(path):
        raise SystemExit(
            f"No text at --data {path!r}. The example reads The Time Machine (Project "
            "Gutenberg eBook #35): this project's machines keep it at "
            "../shared/data/timemachine.txt from the project root; elsewhere pass --download "
            f"to fetch it from {BOOK_URL}, or --data with any plain-text book.")
    with open(path, encoding="utf-8-sig") as file:
        text = file.read()
    start = text.find("*** START OF")  # Project Gutenberg's header, up to that line's end
    text = text[text.find("\n", start) + 1:] if start >= 0 else text
    end = text.find("*** END OF")  # Project Gutenberg's licence footer
    text = text[:end] if end >= 0 else text
    return standardize(text).strip()


def main(argv=None) -> dict:
    args = parse_args(argv)
    from example_utils import check_run_dirs, import_tensorflow_quietly

    export_dir = os.path.join(args.out, "saved_model")
    reason = check_run_dirs(args.out, export_dir, args.overwrite)
    if reason:
        raise SystemExit(reason)
    import_tensorflow_quietly()
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_attn as ka
    from keras_attn.export_generator import export_generator
    from keras_attn.recipes.runtime import fit_verbosity, write_export
    from keras_attn.tokens import BOS_ID, RESERVED_TOKENS, UNK_ID
    from keras_attn.viz import plot_history, show_heatmaps

    keras.utils.set_random_seed(args.seed)
    text = read_book(book_path(args))
    vocabulary = list(RESERVED_TOKENS) + sorted(set(text))
    index = {c: i for i, c in enumerate(vocabulary)}
    ids = np.array([index[c] for c in text], "int32")
    split = int(0.9 * len(ids))
    train_ids, val_ids = ids[:split], ids[split:]
    print(f"{len(text):,} characters, {len(vocabulary) - 4} distinct; "
          f"{len(train_ids):,} to train on, {len(val_ids):,} to validate")

    length = args.seq_len

    def windows(source, starts):
        """`<bos>` and `length - 1` characters in, the next `length` characters out."""
        inputs = np.stack([np.concatenate([[BOS_ID], source[s:s + length - 1]]) for s in starts])
        targets = np.stack([source[s:s + length] for s in starts])
        return inputs.astype("int32"), targets.astype("int32")

    rng = np.random.default_rng(args.seed)
    count = args.steps_per_epoch * args.batch_size
    train = windows(train_ids, rng.integers(0, len(train_ids) - length, count * args.epochs))
    val = windows(val_ids, np.arange(0, len(val_ids) - length, length))
    train_ds = tf.data.Dataset.from_tensor_slices(train).batch(args.batch_size).prefetch(2)
    val_ds = tf.data.Dataset.from_tensor_slices(val).batch(256)

    model = ka.models.causal_lm(
        len(vocabulary), num_layers=args.num_layers, hidden_dim=args.embed_dim,
        num_heads=args.num_heads, intermediate_dim=args.ffn_dim,
        num_key_value_heads=args.num_kv_heads, seed=args.seed)
    schedule = keras.optimizers.schedules.CosineDecay(
        args.learning_rate, args.epochs * args.steps_per_epoch)
    model.compile(optimizer=keras.optimizers.AdamW(schedule, weight_decay=0.01),
                  loss=ka.metrics.MaskedSequenceLoss())
    start = time.perf_counter()
    history = model.fit(train_ds, validation_data=val_ds, epochs=args.epochs,
                        steps_per_epoch=args.steps_per_epoch, shuffle=False,
                        verbose=fit_verbosity())
    seconds = time.perf_counter() - start
    val_loss = float(model.evaluate(val_ds, verbose=0))
    perplexity = math.exp(val_loss)
    print(f"validation perplexity {perplexity:.2f} (loss {val_loss:.3f} nats per character) "
          f"after {seconds:.0f} s of training")

    os.makedirs(args.out, exist_ok=True)
    prompts = [standardize(prompt) for prompt in args.prompt]  # as the book was read
    prompt_ids = np.zeros((len(prompts), max(map(len, prompts)) + 1), "int32")
    for row, prompt in enumerate(prompts):
        prompt_ids[row, :len(prompt) + 1] = [BOS_ID] + [index.get(c, UNK_ID) for c in prompt]
    samples = {}
    for temperature in (0.0, 0.6, 1.0):
        tokens = keras.ops.convert_to_numpy(ka.decoding.generate(
            model, prompt_ids, SAMPLE_LENGTH, max_new_tokens=SAMPLE_NEW,
            sampler=ka.decoding.TopP(0.95, temperature=temperature, seed=args.seed)))
        texts = ["".join(vocabulary[t] for t in row if t >= 4) for row in tokens]
        samples[str(temperature)] = texts
        print(f"\ntemperature {temperature}" + (" (greedy)" if temperature == 0 else ""))
        for line in texts:
            print(f"  {line}")

    plot_history(history, os.path.join(args.out, "history.png"))
    sample = np.array([[BOS_ID] + [index[c] for c in "the time traveller smiled"]], "int32")
    _, weights = model.get_layer("decoder")(sample, return_attention_scores=True)
    last = keras.ops.convert_to_numpy(weights)[0, -1]  # (H, T, T)
    labels = ["<bos>"] + [c if c != " " else "␣" for c in "the time traveller smiled"]
    show_heatmaps(last[None, :2], xlabel="keys: characters seen so far",
                  ylabel="queries: each character",
                  titles=[f"head {h + 1}" for h in range(2)],
                  suptitle=f"Causal self-attention of the last block (layer {args.num_layers} "
                           f"of {args.num_layers}), heads 1-2 of {last.shape[0]}, on "
                           "'the time traveller smiled'",
                  path=os.path.join(args.out, "attention.png"), xticklabels=labels,
                  yticklabels=labels)
    write_export(export_dir, lambda path: export_generator(
        model, vocabulary, path, max_length=128, standardize=standardize_tf))
    served = serve(export_dir)
    metrics = {"validation_perplexity": perplexity, "validation_loss": val_loss,
               "train_loss": float(history.history["loss"][-1]),
               "training_seconds": seconds, "prompts": prompts, "samples": samples,
               "parameters": int(model.count_params()), "saved_model": export_dir,
               "served": served}
    with open(os.path.join(args.out, "metrics.json"), "w") as file:
        json.dump(metrics, file, indent=2)
    print(f"\nwrote {args.out}/metrics.json, history.png, attention.png and saved_model/")
    return metrics


SERVED_PROMPTS = ("The Time Traveller, ", "It was")


def serve(export_dir: str) -> dict:
    """Reload the SavedModel and continue `SERVED_PROMPTS` (greedy, 40 new characters) through
    its `generate` signature, as a consumer with TensorFlow alone would; prints and returns what
    the model read (`context`) and wrote (`text`)."""
    import tensorflow as tf

    generator = tf.saved_model.load(export_dir)
    out = generator.signatures["generate"](
        prompt=tf.constant(SERVED_PROMPTS), max_new_tokens=tf.constant(40),
        temperature=tf.constant(0.0), top_k=tf.constant(0), top_p=tf.constant(1.0),
        seed=tf.constant(0))
    served = {"prompt": list(SERVED_PROMPTS),
              "context": [c.decode() for c in out["context"].numpy()],
              "text": [t.decode() for t in out["text"].numpy()]}
    print("\nthe exported `generate` signature, served with TensorFlow alone (greedy):")
    for prompt, context, text in zip(*served.values()):
        print(f"  {prompt!r} -> read as {context!r}, continued: {text!r}")
    return served


if __name__ == "__main__":
    main()
