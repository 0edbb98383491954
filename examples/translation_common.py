"""What the two translation examples share: arguments, data, training, scoring, export.

`run(name, args, build_model)` trains `build_model(data, args)` on the built-in dates (or a
Tatoeba/Anki export given with `--data`), then prints exact match and corpus BLEU on the test
split with a few sample translations, draws their cross-attention heatmaps, writes
`OUT/metrics.json`, and exports a SavedModel whose `translate` signature serves raw strings.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def parse_args(description: str, defaults: dict, argv=None) -> argparse.Namespace:
    """The command line both examples accept; `defaults` sets the per-model values."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--data", default=None,
                        help="tab-separated sentence pairs (Tatoeba/Anki export, e.g. fra.txt); "
                             "default: the built-in date-normalization task")
    parser.add_argument("--download", action="store_true",
                        help="with no --data: fetch the public English-French pairs instead")
    parser.add_argument("--num-examples", type=int, default=None,
                        help="dates to generate, or pairs to read from --data")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=None)
    parser.add_argument("--learning-rate", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default=None, help="directory for metrics.json and PNGs")
    parser.add_argument("--export-dir", default=None,
                        help="SavedModel directory (default saved_models/<model>_<data>)")
    parser.add_argument("--beam-size", type=int, default=1, help="1 = greedy decoding")
    parser.add_argument("--strategy", choices=("default", "mirrored", "multi_worker"),
                        default="default",
                        help="mirrored: tf.distribute.MirroredStrategy over all devices "
                             "(two logical CPUs when there is a single CPU); multi_worker: "
                             "MultiWorkerMirroredStrategy over the cluster in TF_CONFIG (run the "
                             "same command on every worker; --batch-size is the global batch)")
    parser.add_argument("--resume", action="store_true",
                        help="continue an interrupted run from OUT/backup (with multi_worker, "
                             "OUT must be storage that every worker sees)")
    parser.add_argument("--precision", choices=("float32", "mixed_bfloat16", "mixed_float16"),
                        default="float32")
    parser.add_argument("--max-test", type=int, default=2000,
                        help="test pairs to decode for the scores")
    # Testing hook: stop as if killed after this many epochs (the backup survives).
    parser.add_argument("--interrupt-after", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    task = "dates" if args.data is None and not args.download else "tatoeba"
    for key, value in defaults[task].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.task = task
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


def score(model, data, args) -> tuple[dict, list]:
    """Exact match and corpus BLEU of the test split, and the predictions."""
    from keras_attn.metrics import corpus_bleu, exact_match

    pairs = data.test[: args.max_test]
    references = [data.target_joiner.join(target.split()) for _, target in pairs]
    predictions = translate(model, data, [s for s, _ in pairs], args.beam_size)
    split = (lambda s: list(s)) if data.target_joiner == "" else (lambda s: s.split())
    return {
        "exact_match": exact_match(predictions, references),
        "bleu": corpus_bleu([split(p) for p in predictions], [split(r) for r in references]),
        "num_test": len(pairs),
    }, list(zip([s for s, _ in pairs], predictions, references))


def draw_attention(model, data, sources: list[str], out_dir: str) -> list[str]:
    """One heatmap file per sample: which source token each output token attended to.

    The Transformer shows every head of its last decoder layer side by side; the Bahdanau model
    its single additive-attention distribution.
    """
    from keras_attn.viz import show_heatmaps

    predictions, weights = translate(model, data, sources, 1, return_attention=True)
    paths = []
    for i, (source, prediction, w) in enumerate(zip(sources, predictions, weights)):
        source_tokens = source.split()
        output_tokens = (list(prediction) if data.target_joiner == "" else prediction.split())
        output_tokens = (output_tokens + ["<eos>"])[: w.shape[0]]
        steps, keys = len(output_tokens), max(len(source_tokens), 1)
        if w.ndim == 4:  # (T_out, layers, heads, S): last layer, one panel per head
            panels = w[:steps, -1, :, :keys].transpose(1, 0, 2)[None]  # (1, H, T, S)
            titles = [f"head {h}" for h in range(panels.shape[1])]
        else:  # (T_out, S)
            panels = w[None, None, :steps, :keys]  # (1, 1, T, S)
            titles = ["additive attention"]
        cols = panels.shape[1]
        paths.append(show_heatmaps(
            panels, xlabel="source tokens", ylabel="output tokens", titles=titles,
            path=os.path.join(out_dir, f"attention_{i}.png"),
            figsize=(0.35 * keys * cols + 1.5, 0.3 * steps + 1.5),
            xticklabels=source_tokens, yticklabels=output_tokens,
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


def run(name: str, args, build_model: Callable) -> dict:
    """Train, score, draw, export; returns the metrics written to OUT/metrics.json."""
    strategy = make_strategy(args.strategy)
    import keras
    import tensorflow as tf

    from keras_attn.distribute import WorkerBackupAndRestore, is_chief, shard_by_data
    from keras_attn.export import export_translator, make_translate_fn
    from keras_attn.metrics import MaskedAccuracy, MaskedSequenceLoss
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
    data = load_data(args)
    print(f"{args.task}: {len(data.train)} train / {len(data.validation)} validation / "
          f"{len(data.test)} test pairs; vocab {data.source_vocab_size} -> "
          f"{data.target_vocab_size}; lengths {data.source_length} -> {data.target_length}")

    steps = args.epochs * -(-len(data.train) // args.batch_size)
    learning_rate = keras.optimizers.schedules.CosineDecay(args.learning_rate, steps, alpha=0.02)
    with strategy.scope():
        model = build_model(data, args)
        model.compile(optimizer=keras.optimizers.Adam(learning_rate, clipnorm=1.0),
                      loss=MaskedSequenceLoss(), metrics=[MaskedAccuracy()])
    callbacks = [WorkerBackupAndRestore(backup, strategy)]
    if args.interrupt_after is not None:
        callbacks.append(_Interrupt(args.interrupt_after))
    train = data.make_dataset("train", args.batch_size, shuffle=True, seed=args.seed)
    validation = data.make_dataset("validation", args.batch_size) if data.validation else None
    if args.strategy == "multi_worker":  # each worker keeps its slice of every global batch
        train = shard_by_data(train)
        validation = shard_by_data(validation) if validation is not None else None
    start = time.perf_counter()
    history = model.fit(train, validation_data=validation, epochs=args.epochs, shuffle=False,
                        callbacks=callbacks, verbose=2 if os.environ.get("CI") else 1)
    train_seconds = time.perf_counter() - start
    keras.config.set_dtype_policy("float32")
    if not chief:  # the chief scores, draws and exports the same weights
        print("training done; the chief writes metrics, plots and the export")
        return {"epochs_run": len(history.history.get("loss", [])), "chief": False}

    metrics, samples = score(model, data, args)
    metrics.update(train_seconds=train_seconds, epochs=args.epochs, task=args.task,
                   epochs_run=len(history.history.get("loss", [])),
                   model=name, precision=args.precision, strategy=args.strategy,
                   final_loss=float(history.history["loss"][-1]) if history.history else None)
    print(f"test exact match {metrics['exact_match']:.4f}, corpus BLEU {metrics['bleu']:.4f} "
          f"on {metrics['num_test']} held-out pairs ({train_seconds:.0f} s training)")
    for source, prediction, reference in samples[:5]:
        print(f"  {source!r:45} -> {prediction!r}  (reference {reference!r})")

    draw_attention(model, data, [s for s, _, _ in samples[:3]], args.out)
    if history.history:
        plot_history(history, path=os.path.join(args.out, "history.png"))

    export_dir = args.export_dir or os.path.join("saved_models", f"{name}_{args.task}")
    export_translator(model, data.source_vectorizer, data.target_vectorizer, export_dir,
                      max_length=data.target_length, beam_size=args.beam_size,
                      standardize=data.standardize_tf, joiner=data.target_joiner)
    raw = tf.constant([s for s, _, _ in samples[:8]])
    served = tf.saved_model.load(export_dir).signatures["translate"](text=raw)["translation"]
    in_python = make_translate_fn(model, data.source_vectorizer,
                                  data.target_vectorizer.get_vocabulary(), data.target_length,
                                  args.beam_size, standardize=data.standardize_tf,
                                  joiner=data.target_joiner)(raw)
    metrics["export_dir"] = export_dir
    metrics["export_matches_python"] = bool(tf.reduce_all(served == in_python))
    print(f"exported to {export_dir}/ (translate signature agrees with Python: "
          f"{metrics['export_matches_python']})")
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    return metrics
