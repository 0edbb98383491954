"""What the two translation examples share: arguments, data, training, scoring, export.

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

import argparse
import json
import os
import shutil
import time
from collections.abc import Callable

from example_utils import check_run_dirs, clear_export_dir, import_tensorflow_quietly

# `keras_attn.data.dates.describe_formats()`, kept here so that `--help` answers at once,
# without importing TensorFlow (a test checks that the two agree).
DATES_HELP = """\
The built-in dates task reads 19 formats of dates from 1950 to 2049
and writes ISO 8601 dates; here are the formats for 2021-03-03:
  wednesday, march 3 2021  3/3/21                   03 mar 2021
  the 3rd of march, 2021   march 3rd, 2021          2021/03/03
  3 march 2021             mar 3, 2021              wednesday 3 march 2021
  03.03.2021               03/03/2021               wed, 3 mar 21
  the third of march 2021  march third, 2021        3rd march 2021
  03-mar-2021              march 3, '21             wed mar 3 2021
  2021-3-3
Slashes are month first (3/4/21 is March 4) unless the year comes first; dots are day
first (04.03.2021 is March 4); two-digit years 00-49 are 2000-2049, 50-99 are
1950-1999; upper case is read as lower case. Anything else (other years, day-first
slashes, other languages, times, impossible dates such as february 30) still gets an
ISO date. The exported translator's `score` is clearly lower for text that is no date
at all, but a date just outside the formats (31/12/2021, february 30) can come back
wrong with a confident score: check the dates you rely on."""

TASK_NAMES = {"dates": "the built-in dates", "tatoeba": "--data/--download"}


def _default_text(defaults: dict, key: str) -> str:
    """`(default: ...)` for an option whose default depends on the task."""
    values = {task: defaults[task].get(key) for task in defaults}
    if len(set(map(repr, values.values()))) == 1:
        return f"(default: {next(iter(values.values()))})"
    shown = ", ".join(f"{value} for {TASK_NAMES[task]}" for task, value in values.items())
    return f"(default: {shown})"


def parse_args(description: str, defaults: dict, argv=None, model_flags: dict | None = None,
               usage_examples: tuple[str, ...] = ()) -> argparse.Namespace:
    """The command line both examples accept.

    Args:
        description: first line of `--help`.
        defaults: `{"dates": {...}, "tatoeba": {...}}`, the per-task values of the options
            left unset on the command line (`--help` shows both).
        argv: list of arguments. Defaults to `None` (`sys.argv[1:]`).
        model_flags: `{name: (type, help)}` of the model-size options (`--num-layers`, ...),
            with their defaults in `defaults`.
        usage_examples: command lines shown at the end of `--help`.

    Returns:
        The parsed arguments, every per-task default filled in, `task` set to "dates" or
        "tatoeba", `model_options` the names of `model_flags`, and `export_dir` resolved
        (`OUT/saved_model` unless given).
    """
    epilog = "examples:\n" + "\n".join(f"  {line}" for line in usage_examples)
    epilog += "\n\n" + DATES_HELP
    parser = argparse.ArgumentParser(description=description, epilog=epilog,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=None,
                        help="tab-separated sentence pairs (Tatoeba/Anki export, e.g. fra.txt) "
                             "(default: the built-in date-normalization task, no download)")
    parser.add_argument("--download", action="store_true",
                        help="with no --data: fetch the public English-French pairs instead")
    parser.add_argument("--num-examples", type=int, default=None,
                        help="dates to generate, or pairs to read from --data "
                             + _default_text(defaults, "num_examples").replace("None", "all"))
    parser.add_argument("--epochs", type=int, default=None,
                        help="training epochs " + _default_text(defaults, "epochs"))
    parser.add_argument("--batch-size", type=int, default=None,
                        help="training pairs per step " + _default_text(defaults, "batch_size"))
    parser.add_argument("--learning-rate", type=float, default=None,
                        help="peak Adam learning rate, cosine-decayed over the run "
                             + _default_text(defaults, "learning_rate"))
    for name, (kind, text) in (model_flags or {}).items():
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=None,
                            help=f"{text} {_default_text(defaults, name)}")
    parser.add_argument("--max-length", type=int, default=None,
                        help="with --data: longest sentence in tokens; longer pairs are dropped "
                             + _default_text({"tatoeba": defaults["tatoeba"]}, "max_length"))
    parser.add_argument("--min-freq", type=int, default=None,
                        help="with --data: words seen fewer times become [UNK] "
                             + _default_text({"tatoeba": defaults["tatoeba"]}, "min_freq"))
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    parser.add_argument("--out", default=None,
                        help="directory for everything the run makes: metrics.json, PNGs and "
                             "the SavedModel " + _default_text(defaults, "out"))
    parser.add_argument("--export-dir", default=None,
                        help="SavedModel directory (default: OUT/saved_model)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results and SavedModel of an earlier run in OUT "
                             "(default: refuse)")
    parser.add_argument("--beam-size", type=int, default=1,
                        help="1 = greedy decoding (default: %(default)s)")
    parser.add_argument("--strategy", choices=("default", "mirrored", "multi_worker"),
                        default="default",
                        help="mirrored: tf.distribute.MirroredStrategy over all devices "
                             "(two logical CPUs when there is a single CPU); multi_worker: "
                             "MultiWorkerMirroredStrategy over the cluster in TF_CONFIG (run the "
                             "same command on every worker; --batch-size is the global batch) "
                             "(default: %(default)s)")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted run from OUT/backup (with multi_worker, "
                             "OUT must be storage that every worker sees)")
    parser.add_argument("--precision", choices=("float32", "mixed_bfloat16", "mixed_float16"),
                        default=None, help="Keras dtype policy of training "
                        + _default_text(defaults, "precision"))
    parser.add_argument("--label-smoothing", type=float, default=None,
                        help="mass of each target token spread over the vocabulary in the loss "
                             + _default_text(defaults, "label_smoothing"))
    parser.add_argument("--warmup-steps", type=int, default=None,
                        help="steps of linear learning-rate warm-up before the cosine decay "
                             + _default_text(defaults, "warmup_steps"))
    parser.add_argument("--pad-to-max", action="store_true",
                        help="pad every batch (training and validation) to the longest "
                             "sentence allowed instead of batching sentences of equal length "
                             "(slower; for comparison)")
    parser.add_argument("--max-test", type=int, default=2000,
                        help="test pairs to decode for the scores (default: %(default)s)")
    # Testing hook: stop as if killed after this many epochs (the backup survives).
    parser.add_argument("--interrupt-after", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    task = "dates" if args.data is None and not args.download else "tatoeba"
    for key, value in defaults[task].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.task = task
    args.model_options = list(model_flags or {})
    args.export_dir = args.export_dir or os.path.join(args.out, "saved_model")
    problem = check_run_dirs(args.out, args.export_dir, args.overwrite)
    if problem:
        parser.error(problem)
    return args


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
    return load_tatoeba(path=args.data, download=args.download, num_examples=args.num_examples,
                        max_length=args.max_length, seed=args.seed, min_freq=args.min_freq,
                        validation_fraction=0.02)


def load_and_describe(args):
    """`load_data(args)` and `raw_sources(args)`, with one line describing the splits."""
    data = load_data(args)
    print(f"{args.task}: {len(data.train)} train / {len(data.validation)} validation / "
          f"{len(data.test)} test pairs; vocab {data.source_vocab_size} -> "
          f"{data.target_vocab_size}; lengths {data.source_length} -> {data.target_length}")
    return data, raw_sources(args)


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


def translate(model, data, sources: list[str], beam_size: int, return_attention=False):
    """Decode token-string sources in batches; returns strings (and attention if asked)."""
    import numpy as np

    from keras_attn import decoding

    strings, attention = [], []
    for start in range(0, len(sources), 256):
        ids = data.encode_source(sources[start:start + 256], standardize=False)
        if beam_size == 1:
            out = decoding.greedy_search(model, ids, data.target_length,
                                         return_attention=return_attention)
        else:
            out = decoding.beam_search(model, ids, data.target_length, beam_size=beam_size,
                                       return_attention=return_attention)
        tokens, weights = out if return_attention else (out, None)
        strings += data.decode(tokens)
        if return_attention:
            attention.append(np.asarray(weights))
    if return_attention:
        return strings, np.concatenate(attention)
    return strings


def held_out_scores(data, pairs, predictions: list[str]) -> dict:
    """Exact match (a fraction) and corpus BLEU (0-100) of `predictions` for `pairs`.

    BLEU is `keras_attn.metrics.corpus_bleu` times 100, the scale sacrebleu reports, over
    characters for the dates (whose targets are character tokens) and over words otherwise.
    """
    from keras_attn.metrics import corpus_bleu, exact_match

    references = [data.target_joiner.join(target.split()) for _, target in pairs]
    split = list if data.target_joiner == "" else str.split
    bleu = corpus_bleu([split(p) for p in predictions], [split(r) for r in references])
    return {
        "exact_match": exact_match(predictions, references),
        "bleu": 100.0 * bleu,
        "bleu_scale": "0-100",
        "bleu_tokens": "characters" if data.target_joiner == "" else "words",
        "num_test": len(pairs),
    }


def score(model, data, args) -> tuple[dict, list]:
    """`held_out_scores` of the first `--max-test` test pairs, and `(source, prediction,
    reference)` for each."""
    pairs = data.test[: args.max_test]
    predictions = translate(model, data, [s for s, _ in pairs], args.beam_size)
    references = [data.target_joiner.join(target.split()) for _, target in pairs]
    return (held_out_scores(data, pairs, predictions),
            list(zip([s for s, _ in pairs], predictions, references)))


def draw_attention(model, data, sources: list[str], out_dir: str,
                   raw: dict[str, str] | None = None) -> list[str]:
    """One heatmap file per sample: which source token each output token attended to.

    The Transformer shows every head of its last decoder layer side by side; the Bahdanau model
    its single additive-attention distribution. Each figure is titled with the input as written
    (`raw` maps token strings to it) and the prediction.
    """
    from keras_attn.viz import show_heatmaps

    raw = raw or {}
    predictions, weights = translate(model, data, sources, 1, return_attention=True)
    paths = []
    for i, (source, prediction, w) in enumerate(zip(sources, predictions, weights)):
        source_tokens = source.split()
        output_tokens = (list(prediction) if data.target_joiner == "" else prediction.split())
        output_tokens = (output_tokens + ["<eos>"])[: w.shape[0]]
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
          "alone:")
    rows = [(text.decode(), translation.decode(),
             f"score {value:7.3f}" + ("  truncated" if truncated else ""))
            for text, translation, value, truncated in zip(
                texts.numpy(), served["translation"].numpy(), served["score"].numpy(),
                served["truncated"].numpy())]
    print("\n".join(_table(rows)))
    print(f"  {score_help};\n"
          f"  truncated: the input had more than {data.source_length} tokens. "
          f"Same outputs as translating in Python: {matches}")
    return matches


def check_export(model, data, args, raw_texts: list[str]) -> dict:
    """Exports the translator, serves `raw_texts` (and `ODD_INPUTS`) with the reloaded
    SavedModel, prints the outputs with their scores, and compares them with Python."""
    from keras_attn.export import export_translator, make_translate_fn

    if args.overwrite:
        clear_export_dir(args.export_dir)
    export_translator(model, data.source_vectorizer, data.target_vectorizer, args.export_dir,
                      max_length=data.target_length, beam_size=args.beam_size,
                      standardize=data.standardize_tf, joiner=data.target_joiner)
    texts = served_inputs(data, raw_texts)
    in_python = make_translate_fn(model, data.source_vectorizer,
                                  data.target_vectorizer.get_vocabulary(), data.target_length,
                                  args.beam_size, standardize=data.standardize_tf,
                                  joiner=data.target_joiner)(texts)
    matches = serve_and_compare(
        args.export_dir, texts, in_python, data,
        "score: length-normalised log-probability (0 = sure, lower = less sure, -inf = "
        "empty input)")
    return {"export_dir": args.export_dir, "export_matches_python": matches}


def optimizer(args, steps_per_epoch: int):
    """Adam with gradient clipping, a linear warm-up of `args.warmup_steps` to
    `args.learning_rate`, then a cosine decay to 2% of it at the end of `args.epochs` epochs of
    `steps_per_epoch` steps (the training dataset's `cardinality()`)."""
    import keras

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


def run(name: str, args, build_model: Callable) -> dict:
    """Train, score, draw, export; returns the metrics written to OUT/metrics.json."""
    import_tensorflow_quietly()
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
    callbacks = [WorkerBackupAndRestore(backup, strategy)]
    if args.interrupt_after is not None:
        callbacks.append(_Interrupt(args.interrupt_after))
    if args.strategy == "multi_worker":  # each worker keeps its slice of every global batch
        train = shard_by_data(train)
        validation = shard_by_data(validation) if validation is not None else None
    start = time.perf_counter()
    # The dataset shuffles itself; shuffle=False tells Keras so (it warns otherwise).
    history = model.fit(train, validation_data=validation, epochs=args.epochs, shuffle=False,
                        callbacks=callbacks, verbose=2 if os.environ.get("CI") else 1)
    train_seconds = time.perf_counter() - start
    keras.config.set_dtype_policy("float32")
    if not chief:  # the chief scores, draws and exports the same weights
        print("training done; the chief writes metrics, plots and the export")
        return {"epochs_run": len(history.history.get("loss", [])), "chief": False}

    model.save(os.path.join(args.out, "model.keras"))
    metrics, samples = score(model, data, args)
    metrics.update(train_seconds=train_seconds, epochs=args.epochs, task=args.task,
                   epochs_run=len(history.history.get("loss", [])),
                   model=name, precision=args.precision, strategy=args.strategy,
                   model_options={key: getattr(args, key) for key in args.model_options},
                   num_params=int(model.count_params()),
                   final_loss=float(history.history["loss"][-1]) if history.history else None)
    correct = round(metrics["exact_match"] * metrics["num_test"])
    print(f"test exact match {100 * metrics['exact_match']:.2f}% ({correct} of "
          f"{metrics['num_test']} held-out pairs), corpus BLEU {metrics['bleu']:.2f} "
          f"(0-100, over {metrics['bleu_tokens']}); {train_seconds:.0f} s of training")
    print_samples(samples[:5], raw)

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
