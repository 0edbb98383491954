"""What the translation examples (and the translation benchmarks) share: data and training
(scoring and serving are `keras_attn.recipes.translation_eval`). Their command line is
`examples/translation_args.py`, beside the scripts.

`run(name, args, build_model)` trains `build_model(data, args)` on the built-in dates (or a
Tatoeba/Anki export given with `--data`), then prints exact match and corpus BLEU (0-100, the
scale of sacrebleu) on the test split with a few sample translations, draws their
cross-attention heatmaps, and exports a SavedModel whose `translate` signature serves raw
strings. Everything a run makes goes into `--out`: `metrics.json`, `history.png`,
`attention_<i>.png`, `model.keras` (the trained Keras model) and `saved_model/` (unless
`--export-dir` says otherwise); a run refuses to replace an earlier run's results unless
`--overwrite` is given.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable

from keras_attn.recipes.runtime import fit_verbosity, time_budget_callback
from keras_attn.recipes.translation_eval import (
    check_export,
    draw_attention,
    print_samples,
    score,
    validation_ablations,
)

# The length penalty of keras_attn's beam search, and so of runs written before
# `--length-penalty` existed (their metrics.json has no "length_penalty").
DEFAULT_LENGTH_PENALTY = 0.6

TASK_NAMES = {"dates": "the built-in dates", "tatoeba": "--data/--download"}

# The share of a --time-budget over which the learning rate decays (measured on English-French:
# benchmarks/RESULTS.md, "BLEU against training seconds").
DECAY_FRACTION = 0.3

# The share of a --time-budget over which the learning rate warms up when --warmup-steps is not
# given (counted from the end of the first step, which traces the training function): on a
# quiet 2-core machine 5% of 700 s is about the 300 steps the --epochs runs warm up over.
WARMUP_FRACTION = 0.05

# The share of a --time-budget whose weights --average-checkpoints averages (the second half of
# the decay; benchmarks/RESULTS.md, "The examples' `--data` runs").
AVERAGE_FRACTION = 0.15


def make_strategy(name: str):
    """The distribution strategy; call before any other TensorFlow work."""
    import tensorflow as tf

    if name == "default":
        return tf.distribute.get_strategy()
    if name == "multi_worker":
        from keras_attn.distribute import multi_worker_strategy

        return multi_worker_strategy()
    cpus = tf.config.list_physical_devices("CPU")
    if len(tf.config.list_physical_devices("GPU")) < 2 and len(cpus) == 1:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * 2
        )
    devices = [d.name for d in tf.config.list_logical_devices("GPU")] or [
        d.name for d in tf.config.list_logical_devices("CPU")
    ]
    return tf.distribute.MirroredStrategy(devices)


def load_data(args):
    """The built-in dates, or sentence pairs from `--data` / `--download`."""
    from keras_attn.data.dates import load_dates_translation
    from keras_attn.data.pairs import load_tatoeba

    if args.task == "dates":
        return load_dates_translation(num_examples=args.num_examples, seed=args.seed)
    words = args.tokenizer == "word"
    return load_tatoeba(path=args.data, download=args.download, num_examples=args.num_examples,
                        max_length=args.max_length, seed=args.seed,
                        min_freq=args.min_freq if words else None,
                        validation_fraction=0.02, tokenizer=args.tokenizer,
                        vocab_size=None if words else args.vocab_size)


def load_and_describe(args):
    """`load_data(args)` and `raw_sources(args)`, with one line describing the splits; sets
    `args.data_seconds` (reading the pairs and learning the vocabularies)."""
    start = time.perf_counter()
    data = load_data(args)
    args.data_seconds = time.perf_counter() - start
    unit = {"dates": "tokens", "tatoeba": None}[args.task] or {
        "word": "words", "sentencepiece": "SentencePiece pieces"}[args.tokenizer]
    print(f"{args.task}: {len(data.train)} train / {len(data.validation)} validation / "
          f"{len(data.test)} test pairs; vocab {data.source_vocab_size} -> "
          f"{data.target_vocab_size} {unit}; lengths {data.source_length} -> "
          f"{data.target_length}; loaded in {args.data_seconds:.1f} s; unknown source tokens "
          f"in the test split: {100 * data.unknown_rate([s for s, _ in data.test]):.2f}%")
    return data, raw_sources(args)


def data_options(args, data) -> dict:
    """What makes a run's data what it is: its options, vocabulary sizes, and a fingerprint of
    its training sources (two runs with the same fingerprint trained on the same split)."""
    import hashlib

    sources = "\n".join(source for source, _ in data.train).encode("utf-8")
    options = {"task": args.task, "num_examples": args.num_examples, "seed": args.seed}
    if args.task == "tatoeba":
        options.update(data=os.path.basename(args.data or "fra.txt"), max_length=args.max_length,
                       tokenizer=args.tokenizer,
                       **({"min_freq": args.min_freq} if args.tokenizer == "word" else
                          {"vocab_size": args.vocab_size}))
    return {**options, "source_vocab_size": data.source_vocab_size,
            "target_vocab_size": data.target_vocab_size, "source_length": data.source_length,
            "target_length": data.target_length,
            "train_sources_sha1": hashlib.sha1(sources).hexdigest()}


def save_vocabularies(data, out: str) -> None:
    """OUT/vocabulary/{source,target}.txt: the token of every id, one a line (and the
    SentencePiece models as {source,target}.model)."""
    folder = os.path.join(out, "vocabulary")
    os.makedirs(folder, exist_ok=True)
    for side in ("source", "target"):
        vectorizer = getattr(data, f"{side}_vectorizer")
        with open(os.path.join(folder, f"{side}.txt"), "w", encoding="utf-8") as f:
            f.write("\n".join(vectorizer.get_vocabulary()) + "\n")
        if hasattr(vectorizer, "model"):
            with open(os.path.join(folder, f"{side}.model"), "wb") as f:
                f.write(vectorizer.model)


def raw_sources(args) -> dict[str, str]:
    """The source sentences as written, by their token strings: what the user typed.

    `TranslationData` keeps token strings ("the 1 st of march , 2 0 4 2"); this maps them back
    to the text they came from ("the 1st of march, 2042") for the console and the plots.
    """
    if args.task == "dates":
        from keras_attn.data.dates import load_dates, to_tokens

        raw = load_dates(num_examples=args.num_examples, seed=args.seed)
        return {to_tokens(source): source for split in raw for source, _ in split}
    from keras_attn.data import pairs

    # The file load_tatoeba read (downloads are cached, so this fetches nothing again).
    path = args.data if args.data is not None else pairs._download_fra_eng()
    with open(path, encoding="utf-8-sig") as f:
        lines = f.read().splitlines()
    sources = {}
    for line in lines:
        source = line.split("\t")[0].strip()
        sources.setdefault(pairs.preprocess(source), source)
    return sources


def run_length_penalty(metrics: dict) -> float:
    """The length penalty a run's beam ranked with, from its metrics.json (`metrics`); runs
    written before `--length-penalty` ranked with `DEFAULT_LENGTH_PENALTY`."""
    return metrics.get("length_penalty", DEFAULT_LENGTH_PENALTY)


class _Interrupted(SystemExit):
    pass


def _Interrupt(after: int):
    """A callback that ends the process after `after` epochs, as a kill would."""
    import keras

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            if epoch + 1 >= after:
                print(f"interrupted after epoch {epoch + 1}", flush=True)
                raise _Interrupted(3)

    return Interrupt()


# With --time-budget the budget ends training; this only bounds Keras' epoch loop.
MAX_EPOCHS = 100_000



def optimizer(args, steps_per_epoch: int):
    """Adam with gradient clipping, a linear warm-up of `args.warmup_steps` to
    `args.learning_rate`, then a cosine decay to 2% of it at the end of `args.epochs` epochs of
    `steps_per_epoch` steps (the training dataset's `cardinality()`); with `--time-budget`,
    the same shape over the budget's seconds, set every step by `fit_plan`'s callback."""
    import keras

    if args.time_budget is not None:
        return keras.optimizers.Adam(args.learning_rate, clipnorm=1.0)
    steps = args.epochs * steps_per_epoch
    if not 0 <= args.warmup_steps < steps:
        raise ValueError(
            f"Argument `--warmup-steps` must be at least 0 and below the {steps} training "
            f"steps ({args.epochs} epochs of {steps_per_epoch}). "
            f"Received: --warmup-steps {args.warmup_steps}")
    warmup = args.warmup_steps
    learning_rate = keras.optimizers.schedules.CosineDecay(
        0.0 if warmup else args.learning_rate, steps - warmup, alpha=0.02,
        warmup_target=args.learning_rate if warmup else None, warmup_steps=warmup)
    return keras.optimizers.Adam(learning_rate, clipnorm=1.0)


def fit_plan(args) -> tuple[int, list]:
    """`(epochs, callbacks)` of `model.fit`: `args.epochs` and no callback, or with
    `--time-budget` `MAX_EPOCHS` and the callback that fits the learning rate to the budget and
    stops training (`keras_attn.recipes.runtime.time_budget_callback`; its `summary()` after
    `fit`)."""
    if args.time_budget is None:
        return args.epochs, []
    average = getattr(args, "average_checkpoints", 1)
    # Without --warmup-steps the warm-up is a share of the budget's seconds, so that it is the
    # same share of a short budget or of a loaded machine's fewer steps.
    warmup_steps, warmup_seconds = ((args.warmup_steps, None) if "warmup_steps" in args.given
                                    else (0, WARMUP_FRACTION * args.time_budget))
    print(f"training for {args.time_budget:g} s (--time-budget): the learning rate warms up "
          + (f"over {warmup_steps} steps" if warmup_seconds is None else
             f"over {warmup_seconds:g} s ({100 * WARMUP_FRACTION:.0f}% of the budget)")
          + f", stays at {args.learning_rate:g}, and decays over "
          f"the last {100 * DECAY_FRACTION:.0f}% of the time"
          + (f"; the model kept averages {average} checkpoints of the last "
             f"{100 * AVERAGE_FRACTION:.0f}%" if average > 1 else "")
          + "; the epoch count Keras shows is only an upper bound")
    return MAX_EPOCHS, [time_budget_callback(args.time_budget, args.learning_rate,
                                             warmup_steps, DECAY_FRACTION,
                                             average_checkpoints=average,
                                             average_fraction=AVERAGE_FRACTION,
                                             warmup_seconds=warmup_seconds)]


def short_run_note(args, defaults: dict) -> str | None:
    """A warning for runs much shorter than the defaults (smoke tests), whose translations are
    mostly wrong, or None."""
    task_defaults = defaults[args.task]
    shorter = []
    if args.time_budget is None and args.epochs < task_defaults["epochs"]:
        shorter.append(f"{args.epochs} epochs (default {task_defaults['epochs']})")
    if (args.num_examples or 10**9) < (task_defaults["num_examples"] or 10**9):
        shorter.append(f"{args.num_examples} examples (default "
                       f"{task_defaults['num_examples'] or 'all'})")
    if not shorter:
        return None
    return ("note: a short run (" + ", ".join(shorter) + ") checks that everything works; "
            "its translations are expected to be mostly wrong")


def compile_translator(model, args, steps_per_epoch: int) -> None:
    """Compiles `model` as the examples train it: `optimizer(args, steps_per_epoch)`, the masked
    cross-entropy with `args.label_smoothing`, masked token accuracy."""
    from keras_attn.metrics import MaskedAccuracy, MaskedSequenceLoss

    model.compile(optimizer=optimizer(args, steps_per_epoch),
                  loss=MaskedSequenceLoss(label_smoothing=args.label_smoothing),
                  metrics=[MaskedAccuracy()])


def training_dataset(data, args):
    """The shuffled training batches: pairs of equal length batched together and cut to their
    longest sentence (`TranslationData.make_dataset(group_by_length=True)`), unless
    `--pad-to-max`."""
    return data.make_dataset("train", args.batch_size, shuffle=True, seed=args.seed,
                             group_by_length=not args.pad_to_max)


def run(name: str, args, build_model: Callable, defaults: dict | None = None) -> dict:
    """Train, score, draw, export; returns the metrics written to OUT/metrics.json (`defaults`
    of the script: a short run says its translations are not meant to be right).

    `args` is what `examples/translation_args.py`'s `parse_args` returns. The scripts call
    `import_tensorflow_quietly()` (`examples/example_utils.py`) before importing this module."""
    strategy = make_strategy(args.strategy)
    import keras

    from keras_attn.distribute import WorkerBackupAndRestore, is_chief, shard_by_data
    from keras_attn.viz import plot_history

    if args.batch_size % strategy.num_replicas_in_sync:
        raise ValueError(
            "Argument `--batch-size` is the global batch and must be a multiple of the "
            f"{strategy.num_replicas_in_sync} replicas. Received: --batch-size {args.batch_size}")
    chief = is_chief(strategy)  # only the chief writes to OUT
    keras.utils.set_random_seed(args.seed)
    keras.config.set_dtype_policy(args.precision)
    backup = os.path.join(args.out, "backup")
    if chief:
        os.makedirs(args.out, exist_ok=True)
        if not args.resume:  # before the model, whose variables the chief broadcasts: no
            shutil.rmtree(backup, ignore_errors=True)  # worker can restore a stale backup
    data, raw = load_and_describe(args)

    train = training_dataset(data, args)
    validation = (data.make_dataset("validation", args.batch_size,
                                    group_by_length=not args.pad_to_max)
                  if data.validation else None)
    with strategy.scope():
        model = build_model(data, args)
        compile_translator(model, args, int(train.cardinality()))
    epochs, callbacks = fit_plan(args)
    callbacks.append(WorkerBackupAndRestore(backup, strategy))
    if args.interrupt_after is not None:
        callbacks.append(_Interrupt(args.interrupt_after))
    if args.strategy == "multi_worker":  # each worker keeps its slice of every global batch
        train = shard_by_data(train)
        validation = shard_by_data(validation) if validation is not None else None
    start = time.perf_counter()
    # The dataset shuffles itself; shuffle=False tells Keras so (it warns otherwise).
    history = model.fit(train, validation_data=validation, epochs=epochs, shuffle=False,
                        callbacks=callbacks, verbose=fit_verbosity())
    train_seconds = time.perf_counter() - start
    budget = callbacks[0].summary() if args.time_budget is not None else {}
    keras.config.set_dtype_policy("float32")
    if not chief:  # the chief scores, draws and exports the same weights
        print("training done; the chief writes metrics, plots and the export")
        return {"epochs_run": len(history.history.get("loss", [])), "chief": False}

    model.save(os.path.join(args.out, "model.keras"))
    save_vocabularies(data, args.out)
    metrics, samples = score(model, data, args)
    if args.task == "tatoeba":
        metrics["validation_bleu_without"] = validation_ablations(
            model, data, args, callbacks[0].final_weights if budget else None)
    metrics.update(train_seconds=train_seconds,
                   epochs=None if args.time_budget is not None else args.epochs,
                   task=args.task, **budget, data_seconds=args.data_seconds,
                   data_options=data_options(args, data),
                   epochs_run=len(history.history.get("loss", [])),
                   model=name, precision=args.precision, strategy=args.strategy,
                   beam_size=args.beam_size, length_penalty=args.length_penalty,
                   model_options={key: getattr(args, key) for key in args.model_options},
                   num_params=int(model.count_params()),
                   final_loss=float(history.history["loss"][-1]) if history.history else None)
    correct = round(metrics["exact_match"] * metrics["num_test"])
    print(f"test exact match {100 * metrics['exact_match']:.2f}% ({correct} of "
          f"{metrics['num_test']} held-out pairs), corpus BLEU {metrics['bleu']:.2f} "
          f"(0-100, over {metrics['bleu_tokens']}); {train_seconds:.0f} s of training"
          + (f" ({budget['trained_s']:.0f} s counted against the budget, "
             f"{budget['steps']} steps)" if budget else ""))
    if "validation" in metrics:
        without = metrics.get("validation_bleu_without", {})
        print(f"validation BLEU {metrics['validation']['bleu']:.2f}, exact match "
              f"{100 * metrics['validation']['exact_match']:.2f}% "
              f"({metrics['validation']['num_test']} pairs)"
              + "".join(f"; {text} {without[key]:.2f}" for key, text in (
                  ("greedy", "greedy decoding"),
                  ("final_weights", "the final weights instead of the average"))
                  if key in without))
    print(f"unknown tokens: {100 * metrics['source_unknown_rate']:.2f}% of the test inputs' "
          f"tokens, {100 * metrics['output_unknown_rate']:.2f}% of the output words")
    print_samples(samples[:5], raw)
    note = short_run_note(args, defaults) if defaults else None
    if note:
        print(note)

    draw_attention(model, data, [s for s, _, _ in samples[:3]], args.out, raw)
    if history.history:
        plot_history(history, path=os.path.join(args.out, "history.png"),
                     title=f"{name} on {TASK_NAMES[args.task]}: masked cross-entropy and "
                           "token accuracy (padding ignored)")
    metrics.update(check_export(model, data, args,
                                [raw.get(s, s) for s, _, _ in samples[:3]]))
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    print(f"metrics, plots and the SavedModel are in {args.out}/")
    return metrics
