"""BLEU against training seconds: keras_attn's translation example and the keras-hub recipe.

Both translators learn the same English-French pairs (`--data`: the same pairs in the same
train/validation/test split, from `keras_attn.data.pairs.load_tatoeba` as the example loads
them), one after the other in one run, and are scored the same way: greedy translations of the
held-out split, detokenized into words, corpus BLEU (0-100, over words) and exact match
against the same references.

- keras_attn: `examples/transformer_translation.py --data` with its defaults (vocabularies,
  model, batch, length-grouped batches), the example's own code, run
  once per budget with `--time-budget BUDGET`: each run's warm-up (the first 5% of the
  seconds) and decay (the last 30%) are fitted to its budget, and it is scored when the budget is spent, as a user asking for "the best model in
  N seconds" gets it. Both models are scored greedily here (the example's own scores use its
  `--beam-size`, 4 for `--data`).
  Reading the pairs and learning the vocabularies come before the budget (printed apart).
- keras-hub: the Transformer recipe of keras.io/keras-hub ("English-to-Spanish translation
  with KerasHub") at the size it is usually run: `TokenAndPositionEmbedding`, 2
  `TransformerEncoder` + 2 `TransformerDecoder` blocks (embed 256, intermediate 512, 8 heads),
  dropout 0.5 before the vocabulary projection, RMSprop (1e-3, constant), batch 64, every batch
  padded to the longest sentence allowed, on word vocabularies (words seen twice; the
  reference figure of earlier rounds), decoded with keras-hub's `GreedySampler`, which reruns
  the decoder over the prefix each step (`serve_translate.keras_hub_translate`). Its learning
  rate is constant, so one run serves every budget: when its training time passes a budget,
  training pauses (the pause is not counted) and the model is scored.

Writes OUT/time_to_bleu.json, OUT/time_to_bleu.png (BLEU against training seconds) and
OUT/keras_hub_recipe.keras (the trained recipe model, for `serve_translate.py`), and prints
the table of benchmarks/RESULTS.md with the machine's load at the start and the end.

    python benchmarks/translation_time_to_bleu.py
    python benchmarks/translation_time_to_bleu.py --budgets 175 --recipe-budgets 175 350 700
    python benchmarks/translation_time_to_bleu.py --models keras_attn --split validation \\
        --budgets 300 --example-args "--tokenizer word"
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import time

from _common import example_module, header

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "shared", "data", "fra-eng.txt")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=DATA, help="Tatoeba/Anki pairs (default: %(default)s)")
    parser.add_argument("--budgets", type=float, nargs="+", default=[175, 350, 700],
                        help="training seconds after which to score (default: %(default)s)")
    parser.add_argument("--recipe-budgets", type=float, nargs="+", default=None,
                        help="the keras-hub recipe's budgets, when they differ from --budgets "
                             "(one run serves them all: e.g. keras_attn at 175 s against the "
                             "recipe's whole 700 s) (default: --budgets)")
    parser.add_argument("--split", choices=("validation", "test"), default="test",
                        help="held-out pairs to score (default: %(default)s)")
    parser.add_argument("--models", nargs="+", choices=("keras_attn", "keras_hub"),
                        default=["keras_attn", "keras_hub"])
    parser.add_argument("--example-args", default="",
                        help="extra flags for the keras_attn example, e.g. \"--embed-dim 256\"")
    parser.add_argument("--out", default="runs/time_to_bleu")
    return parser.parse_args(argv)


class Budgets:
    """Pauses training at each budget of training seconds to score the model.

    A Keras callback: `on_train_batch_end` compares the training time so far (wall time since
    the first batch began, minus the pauses) with the next budget; past it, `score()` runs
    and its result is kept with the training seconds and steps; after the last budget it stops
    training. If training ends first, the final model is scored for the remaining budgets.
    """

    def __init__(self, budgets, score):
        import keras

        outer = self

        class Callback(keras.callbacks.Callback):
            def on_train_begin(self, logs=None):
                outer.start, outer.paused, outer.steps = time.perf_counter(), 0.0, 0

            def on_train_batch_end(self, batch, logs=None):
                outer.steps += 1
                if outer.pending and outer.trained() >= outer.pending[0]:
                    outer.record(self.model)
                    if not outer.pending:
                        self.model.stop_training = True

        self.callback = Callback()
        self.pending, self.score, self.results = sorted(budgets), score, []

    def trained(self) -> float:
        return time.perf_counter() - self.start - self.paused

    def record(self, model, ended=False):
        trained, pause = self.trained(), time.perf_counter()
        result = self.score(model)
        self.paused += time.perf_counter() - pause
        budgets = list(self.pending) if ended else [self.pending[0]]
        for budget in budgets:
            self.results.append({"budget_s": budget, "trained_s": round(trained, 1),
                                 "steps": self.steps, **result})
            print(f"  {budget:6.0f} s budget: {trained:6.1f} s trained, {self.steps} steps, "
                  f"BLEU {result['bleu']:.2f}, exact match {100 * result['exact_match']:.1f}%",
                  flush=True)
        self.pending = self.pending[len(budgets):]


def batched(translate_batch, sources, batch_size=256):
    """`translate_batch` over `sources` in batches of `batch_size`."""
    return [text for start in range(0, len(sources), batch_size)
            for text in translate_batch(sources[start:start + batch_size])]


def scorer(data, split: str, translate_fn):
    """`score(model)`: corpus BLEU (0-100, words) and exact match of greedy translations."""
    from keras_attn.metrics import corpus_bleu, exact_match
    from keras_attn.tokens import UNK

    pairs = getattr(data, split)
    sources = [source for source, _ in pairs]
    references = [target for _, target in pairs]

    def score(model):
        predictions = translate_fn(model, sources)
        words = [word for p in predictions for word in p.split()]
        return {"bleu": 100 * corpus_bleu([p.split() for p in predictions],
                                          [r.split() for r in references]),
                "exact_match": exact_match(predictions, references),
                "output_unknown_rate": sum(UNK in w for w in words) / max(len(words), 1)}

    return score


def load_average() -> str:
    """The 1-, 5- and 15-minute load averages of the machine (other jobs slow timed runs)."""
    try:
        with open("/proc/loadavg") as f:
            return " ".join(f.read().split()[:3])
    except OSError:
        return "unknown"


def keras_hub_recipe(data):
    """The keras.io/keras-hub Transformer translator at 2 + 2 blocks, compiled as the recipe."""
    import keras
    import keras_hub

    embed, intermediate, heads = 256, 512, 8
    source = keras.Input((None,), dtype="int32", name="encoder_inputs")
    x = keras_hub.layers.TokenAndPositionEmbedding(
        data.source_vocab_size, data.source_length, embed, mask_zero=True)(source)
    for _ in range(2):
        x = keras_hub.layers.TransformerEncoder(intermediate, heads)(x)
    target = keras.Input((None,), dtype="int32", name="decoder_inputs")
    y = keras_hub.layers.TokenAndPositionEmbedding(
        data.target_vocab_size, data.target_length, embed, mask_zero=True)(target)
    for _ in range(2):
        y = keras_hub.layers.TransformerDecoder(intermediate, heads)(y, x)
    y = keras.layers.Dropout(0.5)(y)
    probabilities = keras.layers.Dense(data.target_vocab_size, activation="softmax")(y)
    model = keras.Model([source, target], probabilities, name="keras_hub_recipe")
    model.compile("rmsprop", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def run_keras_attn(example_argv, budgets, split, out):
    """One `--time-budget` run of the example per budget, each scored at its end."""
    import keras

    from keras_attn.recipes.translation import (
        compile_translator,
        fit_plan,
        load_data,
        training_dataset,
    )
    from keras_attn.recipes.translation_eval import translate

    example = example_module("transformer_translation")
    DEFAULTS, MODEL_FLAGS, build_model = example.DEFAULTS, example.MODEL_FLAGS, example.build_model
    parse_args = example_module("translation_args").parse_args

    args = parse_args("keras_attn", DEFAULTS, example_argv + ["--time-budget", "1"],
                      MODEL_FLAGS)
    start = time.perf_counter()
    data = load_data(args)
    data_seconds = time.perf_counter() - start
    print(f"  pairs read and vocabularies learned in {data_seconds:.1f} s ({args.tokenizer}; "
          f"{data.source_vocab_size} -> {data.target_vocab_size} ids)", flush=True)
    score = scorer(data, split,
                   lambda model, sources: translate(model, data, sources, 1, args.length_penalty))
    results = []
    for budget in sorted(budgets):
        args.time_budget = budget
        keras.backend.clear_session()
        keras.utils.set_random_seed(args.seed)
        keras.config.set_dtype_policy(args.precision)
        model = build_model(data, args)
        train = training_dataset(data, args)
        compile_translator(model, args, int(train.cardinality()))
        epochs, callbacks = fit_plan(args)
        model.fit(train, epochs=epochs, shuffle=False, verbose=2, callbacks=callbacks)
        keras.config.set_dtype_policy("float32")
        summary = callbacks[0].summary()
        result = score(model)
        results.append({"budget_s": budget, "trained_s": summary["trained_s"],
                        "steps": summary["steps"], **result})
        print(f"  {budget:6.0f} s budget: {summary['trained_s']:6.1f} s trained, "
              f"{summary['steps']} steps, BLEU {result['bleu']:.2f}, exact match "
              f"{100 * result['exact_match']:.1f}%, [UNK] in "
              f"{100 * result['output_unknown_rate']:.2f}% of the output words", flush=True)
    options = {key: getattr(args, key) for key in (
        "batch_size", "learning_rate", "label_smoothing", "precision",
        "tokenizer", "vocab_size" if args.tokenizer == "sentencepiece" else "min_freq",
        *args.model_options)}
    options["warmup"] = (f"{args.warmup_steps} steps" if "warmup_steps" in args.given
                         else f"{summary['warmup_s']:g} s of the last budget")
    return results, {"params": int(model.count_params()), "options": options,
                     "data_seconds": round(data_seconds, 1)}


def run_keras_hub(example_argv, budgets, split, out):
    import keras

    from keras_attn.recipes.translation import load_data

    example = example_module("transformer_translation")
    DEFAULTS, MODEL_FLAGS = example.DEFAULTS, example.MODEL_FLAGS
    parse_args = example_module("translation_args").parse_args

    args = parse_args("keras_hub", DEFAULTS, example_argv + ["--tokenizer", "word"], MODEL_FLAGS)
    keras.backend.clear_session()
    keras.utils.set_random_seed(args.seed)
    keras.config.set_dtype_policy("float32")
    data = load_data(args)
    model = keras_hub_recipe(data)
    from serve_translate import keras_hub_translate

    watch = Budgets(budgets, scorer(data, split,
                                    lambda model, sources: batched(keras_hub_translate(model, data),
                                                                   sources)))
    train = data.make_dataset("train", 64, shuffle=True, seed=args.seed)
    model.fit(train, epochs=1000, shuffle=False, verbose=2, callbacks=[watch.callback])
    model.save(os.path.join(out, "keras_hub_recipe.keras"))  # for serve_translate.py
    return watch.results, {"params": int(model.count_params()),
                           "options": {"batch_size": 64, "optimizer": "rmsprop 1e-3"}}


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name, rows in results.items():
        ax.plot([0] + [r["trained_s"] for r in rows], [0] + [r["bleu"] for r in rows],
                marker="o", label=name)
    if results.get("keras_hub"):  # the level keras_attn is asked to reach, and when it does
        ax.axhline(results["keras_hub"][-1]["bleu"], color="gray", linestyle=":", linewidth=1,
                   label="the recipe's final BLEU")
    ax.set_xlabel("training seconds (2 CPU cores)")
    ax.set_ylabel("corpus BLEU on held-out pairs (0-100)")
    ax.set_title("English-French (Tatoeba): BLEU against training time\n"
                 "(keras_attn: one --time-budget run per point)", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    args = parse_args(argv)
    if not os.path.exists(args.data):
        raise SystemExit(f"no data at {args.data}: pass --data fra-eng.txt")
    header("Translation: BLEU against training seconds, keras_attn and the keras-hub recipe")
    print(f"load average at the start: {load_average()}", flush=True)
    example_module("example_utils").import_tensorflow_quietly()
    os.makedirs(args.out, exist_ok=True)
    example_argv = ["--data", args.data, "--out", os.path.join(args.out, "unused"),
                    "--overwrite", *shlex.split(args.example_args)]
    results, details = {}, {}
    for name in args.models:
        print(f"{name}:", flush=True)
        run = run_keras_attn if name == "keras_attn" else run_keras_hub
        budgets = args.recipe_budgets if name == "keras_hub" and args.recipe_budgets else (
            args.budgets)
        results[name], details[name] = run(example_argv, budgets, args.split, args.out)
    print(f"\n| model | budget (s) | trained (s) | steps | BLEU ({args.split}) | exact match |")
    print("|---|---|---|---|---|---|")
    for name, rows in results.items():
        for r in rows:
            print(f"| {name} | {r['budget_s']:.0f} | {r['trained_s']:.0f} | {r['steps']} | "
                  f"{r['bleu']:.2f} | {100 * r['exact_match']:.1f}% |")
    for name, detail in details.items():
        print(f"{name}: {detail['params']:,} parameters; {detail['options']}")
    load = load_average()
    print(f"load average at the end: {load}")
    with open(os.path.join(args.out, "time_to_bleu.json"), "w") as f:
        json.dump({"split": args.split, "results": results, "details": details,
                   "example_args": args.example_args, "load_average_end": load}, f, indent=2)
    plot(results, os.path.join(args.out, "time_to_bleu.png"))
    print(f"wrote {args.out}/time_to_bleu.json and time_to_bleu.png")


if __name__ == "__main__":
    main()
