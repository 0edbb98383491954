"""What the translation examples (and the translation benchmarks) share: data, training,
scoring, export. Their command line is `examples/translation_args.py`, beside the scripts.

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

from keras_attn.recipes.runtime import fit_verbosity, time_budget_callback, write_export

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


def translate(model, data, sources: list[str], beam_size: int,
              length_penalty: float) -> list[str]:
    """Decode token-string sources in batches of 256 (greedy when `beam_size` is 1, else beam
    search ranking by `length_penalty`); returns the translations as text
    (`TranslationData.decode`)."""
    from keras_attn import decoding

    strings = []
    for start in range(0, len(sources), 256):
        ids = data.encode_source(sources[start:start + 256], standardize=False)
        sampler = decoding.Beam(beam_size, length_penalty)  # Beam(1) is greedy search
        tokens = decoding.generate(model, ids, data.target_length, sampler=sampler)
        strings += data.decode(tokens)
    return strings


def held_out_scores(data, pairs, predictions: list[str]) -> dict:
    """Exact match (a fraction) and corpus BLEU (0-100) of `predictions` for `pairs`, and how
    often the inputs and outputs hold `[UNK]`.

    BLEU is `keras_attn.metrics.corpus_bleu` times 100, the scale sacrebleu reports, over
    characters for the dates (whose targets are character tokens) and over words otherwise
    (subword outputs are detokenized into words first: BLEU never counts pieces).
    `source_unknown_rate` is the share of the inputs' tokens the source vocabulary does not
    know, `output_unknown_rate` the share of output words that are (or hold) `[UNK]`.
    """
    from keras_attn.metrics import corpus_bleu, exact_match
    from keras_attn.tokens import UNK

    references = [data.target_joiner.join(target.split()) for _, target in pairs]
    split = list if data.target_joiner == "" else str.split
    bleu = corpus_bleu([split(p) for p in predictions], [split(r) for r in references])
    words = [word for p in predictions for word in p.split()]
    return {
        "exact_match": exact_match(predictions, references),
        "bleu": 100.0 * bleu,
        "bleu_scale": "0-100",
        "bleu_tokens": "characters" if data.target_joiner == "" else "words",
        "num_test": len(pairs),
        "source_unknown_rate": data.unknown_rate([source for source, _ in pairs]),
        "output_unknown_rate": (sum(UNK in word for word in words) / len(words)
                                if words else 0.0),
    }


def score(model, data, args) -> tuple[dict, list]:
    """`held_out_scores` of the first `--max-test` test pairs (with those of the whole
    validation split under "validation", if there is one), and `(source, prediction,
    reference)` for each test pair."""
    pairs = data.test[: args.max_test]
    predictions = translate(model, data, [s for s, _ in pairs], args.beam_size,
                            args.length_penalty)
    references = [data.target_joiner.join(target.split()) for _, target in pairs]
    metrics = held_out_scores(data, pairs, predictions)
    if data.validation:  # what tuning reads (the test pairs stay for the final figure)
        sources = [s for s, _ in data.validation]
        metrics["validation"] = held_out_scores(
            data, data.validation,
            translate(model, data, sources, args.beam_size, args.length_penalty))
    return metrics, list(zip([s for s, _ in pairs], predictions, references))


def validation_ablations(model, data, args, final_weights=None) -> dict:
    """Validation BLEU without this run's evaluation choices, for the record of what they
    bring: `"greedy"` (when `args.beam_size` > 1) and `"final_weights"` (the weights at the end
    of training instead of the checkpoint average, when `final_weights` are given; decoded
    with `args.beam_size` and `args.length_penalty`). The model's weights are left as they came."""
    if not data.validation:
        return {}
    sources = [s for s, _ in data.validation]
    found = {}
    if args.beam_size > 1:
        greedy = translate(model, data, sources, 1, args.length_penalty)  # (unused by greedy)
        found["greedy"] = held_out_scores(data, data.validation, greedy)["bleu"]
    if final_weights is not None:
        averaged = [w.numpy() if hasattr(w, "numpy") else w for w in model.get_weights()]
        for weight, value in zip(model.trainable_weights, final_weights):
            weight.assign(value)
        found["final_weights"] = held_out_scores(
            data, data.validation,
            translate(model, data, sources, args.beam_size, args.length_penalty))["bleu"]
        model.set_weights(averaged)
    return found


def draw_attention(model, data, sources: list[str], out_dir: str,
                   raw: dict[str, str] | None = None) -> list[str]:
    """One heatmap file per sample: which source token each output token attended to.

    The Transformer shows every head of its last decoder layer side by side; the Bahdanau model
    its single additive-attention distribution. Each figure is titled with the input as written
    (`raw` maps token strings to it) and the prediction.
    """
    import numpy as np

    from keras_attn import decoding
    from keras_attn.tokens import EOS_ID, PAD_ID
    from keras_attn.viz import show_heatmaps

    raw = raw or {}
    source_ids = data.encode_source(sources, standardize=False)  # (N, S)
    output_ids, weights = decoding.generate(model, source_ids, data.target_length,
                                            return_attention_scores=True)  # (N, T), (N, T, ...)
    output_ids, weights = np.asarray(output_ids), np.asarray(weights)
    predictions = data.decode(output_ids)
    # The axes show the model's own tokens: words, characters or subword pieces, [UNK] where
    # the vocabulary does not know a word.
    source_vocabulary = data.source_vectorizer.get_vocabulary()
    target_vocabulary = data.target_vectorizer.get_vocabulary()
    paths = []
    for i, (source, prediction, w) in enumerate(zip(sources, predictions, weights)):
        source_tokens = [source_vocabulary[t] for t in source_ids[i] if t != PAD_ID]
        ids = output_ids[i].tolist()
        ids = ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids
        output_tokens = ([target_vocabulary[t] for t in ids] + ["<eos>"])[: w.shape[0]]
        steps, keys = len(output_tokens), max(len(source_tokens), 1)
        if w.ndim == 4:  # (T_out, layers, heads, S): last layer, one panel per head
            num_layers = w.shape[1]
            panels = w[:steps, -1, :, :keys].transpose(1, 0, 2)[None]  # (1, H, T, S)
            titles = [f"head {h + 1}" for h in range(panels.shape[1])]
            what = (f"Cross-attention of the last decoder layer (layer {num_layers} of "
                    f"{num_layers}), one panel per head")
        else:  # (T_out, S)
            panels = w[None, None, :steps, :keys]  # (1, 1, T, S)
            titles = None
            what = "Additive (Bahdanau) attention: each decoder step over the source tokens"
        paths.append(show_heatmaps(
            panels, xlabel="source tokens", ylabel="output tokens", titles=titles,
            path=os.path.join(out_dir, f"attention_{i}.png"),
            xticklabels=source_tokens, yticklabels=output_tokens,
            suptitle=(f"{what}\ninput: {raw.get(source, source)!r}\n"
                      f"prediction: {prediction!r}"),
        ))
    return paths


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


def _table(rows: list[tuple[str, str, str]]) -> list[str]:
    """Lines `'input' -> 'output' note`, the first two columns padded to their longest entry
    (never cut: the console shows whole inputs and outputs)."""
    shown = [(repr(a), repr(b), note) for a, b, note in rows]
    width_a = max((len(a) for a, _, _ in shown), default=0)
    width_b = max((len(b) for _, b, _ in shown), default=0)
    return [f"  {a.ljust(width_a)} -> {b.ljust(width_b)}  {note}".rstrip()
            for a, b, note in shown]


def print_samples(samples: list[tuple[str, str, str]], raw: dict[str, str]) -> None:
    """Prints `(source, prediction, reference)` triples, each source as the user wrote it."""
    print("sample test translations (input as written -> model output):")
    print("\n".join(_table([
        (raw.get(source, source), prediction,
         "correct" if prediction == reference else f"expected {reference!r}")
        for source, prediction, reference in samples])))


# Inputs a served translator meets that it was not trained on, shown after the export.
ODD_INPUTS = ("", "hello world")


def served_inputs(data, raw_texts: list[str]):
    """`raw_texts`, `ODD_INPUTS` and the first text repeated until it is longer than the source
    length, as a string tensor `(N,)`: what `check_export` serves."""
    import tensorflow as tf

    repeats = data.source_length // max(1, len(data.standardize(raw_texts[0]).split())) + 1
    return tf.constant(list(raw_texts) + list(ODD_INPUTS) + [" ".join(raw_texts[:1] * repeats)])


def serve_and_compare(export_dir: str, texts, in_python: dict, data, score_help: str) -> bool:
    """Serves `texts` with the reloaded SavedModel's `translate` signature, prints what it
    returns, and whether it equals `in_python` (the same function's outputs in Python)."""
    import numpy as np
    import tensorflow as tf

    served = tf.saved_model.load(export_dir).signatures["translate"](text=texts)
    matches = (all(bool(tf.reduce_all(served[key] == in_python[key]))
                   for key in ("translation", "truncated"))
               and bool(np.allclose(served["score"], in_python["score"], atol=1e-4)))
    print(f"exported to {export_dir}/; its `translate` signature, served with TensorFlow "
          + ("alone:" if data.word_start is None else "and tensorflow-text:"))
    rows = [(text.decode(), translation.decode(),
             f"score {value:7.3f}" + ("  truncated" if truncated else ""))
            for text, translation, value, truncated in zip(
                texts.numpy(), served["translation"].numpy(), served["score"].numpy(),
                served["truncated"].numpy())]
    print("\n".join(_table(rows)))
    print(f"  {score_help};\n"
          f"  truncated: the input had more than {data.source_length} tokens. "
          f"Same outputs as translating in Python: {matches}")
    print(serving_note(data))
    return matches


def check_export(model, data, args, raw_texts: list[str]) -> dict:
    """Exports the translator, serves `raw_texts` (and `ODD_INPUTS`) with the reloaded
    SavedModel, prints the outputs with their scores, and compares them with Python."""
    from keras_attn.export import export_translator, make_translate_fn

    write_export(args.export_dir, lambda path: export_translator(
        model, data.source_vectorizer, data.target_vectorizer, path,
        max_length=data.target_length, beam_size=args.beam_size,
        length_penalty=args.length_penalty, **data.text_options))
    texts = served_inputs(data, raw_texts)
    in_python = make_translate_fn(model, data.source_vectorizer,
                                  data.target_vectorizer.get_vocabulary(), data.target_length,
                                  args.beam_size, args.length_penalty,
                                  **data.text_options)(texts)
    matches = serve_and_compare(
        args.export_dir, texts, in_python, data,
        "score: length-normalised log-probability (0 = sure, lower = less sure, -inf = "
        "empty input)")
    return {"export_dir": args.export_dir, "export_matches_python": matches}


def serving_note(data) -> str:
    """What a consumer of this run's SavedModel needs besides TensorFlow."""
    if data.word_start is None:
        return "  serving needs TensorFlow alone"
    return ("  serving needs TensorFlow and tensorflow-text: `import tensorflow_text` before "
            "`tf.saved_model.load` (its SentencePiece op is in the graph)")


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
