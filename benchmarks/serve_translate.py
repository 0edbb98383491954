"""Serving English-French translators: quality and sentences/s through the exported SavedModel.

Takes trained models and serves them the way a user would: the autoregressive Transformer of
`examples/transformer_translation.py --data` exported with greedy decoding and with beam 4,
the non-autoregressive one of `examples/nat_translation.py --data` exported with 1, 2, 4 and 10
Mask-Predict iterations, each loaded back with `tf.saved_model.load` and called through its
`translate` signature (raw strings in, strings out, decoding inside the graph); and, for
comparison, the keras-hub recipe model of `translation_time_to_bleu.py` decoded with
keras-hub's `GreedySampler` (the recipe's decoding: the decoder rerun over the prefix each
step), compiled with `tf.function`; its tokenization and detokenization run in Python and are
timed with it, as the SavedModels' are inside their graphs.

For each: corpus BLEU (0-100, words) and exact match on the held-out split, and sentences/s
at batch 1 (`--single` sentences one by one) and at batch 256 (`--batches` batches, fewer
sentences when the split is smaller), after a warm-up call of each size, with the ratio to AT
greedy. The speeds are measured side by side (`side_by_side_speed`): each sentence and each
batch is served by every translator in turn, so that the ratios hold on a shared machine
whose speed moves during the run. The AT's beam ranks
with the length penalty its run used and the NAT decodes with the length beam its run used
(both from the run's metrics.json); `--example-args "--length-penalty ALPHA"` overrides the
AT's.

    python examples/transformer_translation.py --data ../shared/data/fra-eng.txt
    python examples/nat_translation.py --data ../shared/data/fra-eng.txt
    python benchmarks/translation_time_to_bleu.py   # writes the keras-hub recipe model
    python benchmarks/serve_translate.py
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import tempfile
import time

from _common import example_module, header

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "..", "..", "shared", "data", "fra-eng.txt")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=DATA, help="(default: %(default)s)")
    parser.add_argument("--at", default="runs/transformer_tatoeba",
                        help="run directory of the Transformer example (its model.keras)")
    parser.add_argument("--nat", default="runs/nat_tatoeba",
                        help="run directory of the NAT example (its model.keras)")
    parser.add_argument("--keras-hub", default="runs/time_to_bleu/keras_hub_recipe.keras",
                        help="the keras-hub recipe model written by translation_time_to_bleu.py")
    parser.add_argument("--split", choices=("validation", "test"), default="test")
    parser.add_argument("--single", type=int, default=256,
                        help="sentences served one by one (default: %(default)s)")
    parser.add_argument("--batches", type=int, default=4, help="batches of 256 served")
    parser.add_argument("--example-args", default="",
                        help="data flags the runs were made with, e.g. \"--num-examples 3000\" "
                             "(the AT and NAT runs must share them; the keras-hub row always "
                             "uses word vocabularies)")
    parser.add_argument("--out", default="runs/serve_translate")
    args = parser.parse_args(argv)
    for flag in ("single", "batches"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be at least 1. Received: --{flag} {getattr(args, flag)}")
    return args


def quality(translate_batch, sources, references) -> dict:
    """Corpus BLEU (0-100, words) and exact match of `translate_batch`, a function from a list
    of source strings to a list of translations, over `sources` in batches of 256."""
    from keras_attn.metrics import corpus_bleu, exact_match

    predictions = []
    for start in range(0, len(sources), 256):
        predictions += translate_batch(sources[start:start + 256])
    return {"bleu": 100 * corpus_bleu([p.split() for p in predictions],
                                      [r.split() for r in references]),
            "exact_match": exact_match(predictions, references)}


def side_by_side_speed(translators: dict, sources, single: int, batches: int) -> dict:
    """Sentences/s at batch 1 (the first `single` sources one by one) and at batch 256
    (`batches` batches) of every `translators[label]` (a `translate_batch`), measured side
    by side: every sentence, and every batch, is served by each translator in turn, the order
    reversed from one to the next, so that a slow or fast moment of a shared machine falls on
    all of them alike (timed one after the other, the two-round NAT served 1.35x AT greedy's
    sentences/s one day and 0.59x the next). One warm-up call of each size first. Returns
    `{label: {"per_s_batch_1", "per_s_batch_256"}}`."""
    labels = list(translators)
    singles = [[source] for source in sources[:single]]
    chunks = [chunk for chunk in (sources[i * 256:(i + 1) * 256] for i in range(batches))
              if chunk]
    result = {label: {} for label in labels}
    for key, calls in (("per_s_batch_1", singles), ("per_s_batch_256", chunks)):
        seconds = dict.fromkeys(labels, 0.0)
        for label in labels:
            translators[label](calls[0])
        for index, texts in enumerate(calls):
            for label in (labels if index % 2 == 0 else labels[::-1]):
                start = time.perf_counter()
                translators[label](texts)
                seconds[label] += time.perf_counter() - start
        for label in labels:
            result[label][key] = sum(map(len, calls)) / seconds[label]
    return result


def served(export_dir: str):
    """`translate_batch` of a SavedModel's `translate` signature."""
    import tensorflow as tf

    signature = tf.saved_model.load(export_dir).signatures["translate"]
    return lambda texts: [t.decode() for t in
                          signature(text=tf.constant(texts))["translation"].numpy()]


def keras_hub_translate(model, data):
    """`translate_batch` of the keras-hub recipe model with keras-hub's GreedySampler."""
    import keras
    import keras_hub
    import tensorflow as tf

    from keras_attn.tokens import BOS_ID, EOS_ID

    sampler = keras_hub.samplers.GreedySampler()

    @tf.function(reduce_retracing=True)
    def generate(source):
        prompt = tf.concat([tf.fill([tf.shape(source)[0], 1], BOS_ID),
                            tf.zeros([tf.shape(source)[0], data.target_length - 1], tf.int32)],
                           axis=1)

        def next_token(prompt, cache, index):
            probabilities = model([source, prompt], training=False)[:, index - 1, :]
            return probabilities, None, cache

        return sampler(next_token, prompt, stop_token_ids=[EOS_ID], index=1)

    def translate_batch(texts):
        ids = data.encode_source(texts, standardize=False)
        return data.decode(keras.ops.convert_to_numpy(generate(tf.constant(ids)))[:, 1:])

    return translate_batch


def check_same_data(data, example_args, runs) -> None:
    """Stops unless every run directory's model learned this data (same split and
    vocabularies): another split would score pairs its model trained on."""
    from keras_attn.recipes.translation import data_options

    ours = data_options(example_args, data)
    for run in runs:
        path = os.path.join(run, "metrics.json")
        if not os.path.exists(path):
            continue
        with open(path) as f:
            theirs = json.load(f).get("data_options", {})
        different = sorted(key for key in ours if key != "task" and theirs.get(key) != ours[key])
        if different:
            raise SystemExit(f"{run} was trained on other data ({', '.join(different)}): pass "
                             "its data flags with --example-args")


def at_length_penalty(run: str, example_args) -> float:
    """The length penalty the AT's beam ranks with: `--length-penalty` when `--example-args`
    gives it, else the one the run ranked with (its metrics.json, when there is one)."""
    from keras_attn.recipes.translation import (
        DEFAULT_LENGTH_PENALTY,
        run_length_penalty,
    )

    if "length_penalty" in example_args.given:
        return example_args.length_penalty
    path = os.path.join(run, "metrics.json")
    if not os.path.exists(path):
        return DEFAULT_LENGTH_PENALTY
    with open(path) as f:
        return run_length_penalty(json.load(f))


def main(argv=None) -> None:
    args = parse_args(argv)
    example_module("example_utils").import_tensorflow_quietly()
    import keras

    from keras_attn.data.pairs import preprocess
    from keras_attn.export import export_nat_translator, export_translator
    from keras_attn.recipes.translation import load_data

    example = example_module("transformer_translation")
    DEFAULTS, MODEL_FLAGS = example.DEFAULTS, example.MODEL_FLAGS
    parse_example_args = example_module("translation_args").parse_args

    header("Serving English-French translators through their SavedModels")
    exports = tempfile.mkdtemp(prefix="serve_translate_")
    example_args = parse_example_args(
        "serve", DEFAULTS, ["--data", args.data, "--out", exports,
                            *shlex.split(args.example_args)], MODEL_FLAGS)
    data = load_data(example_args)  # as the examples load it: the same vocabularies and split
    check_same_data(data, example_args, (args.at, args.nat))
    pairs = getattr(data, args.split)
    sources = [source for source, _ in pairs]
    references = [target for _, target in pairs]
    assert all(preprocess(s) == s for s in sources[:100]), "sources must be standardized"
    options = data.text_options
    rows, translators = {}, {}
    if os.path.exists(os.path.join(args.at, "model.keras")):
        at = keras.models.load_model(os.path.join(args.at, "model.keras"))
        length_penalty = at_length_penalty(args.at, example_args)
        for beam in (1, 4):
            path = os.path.join(exports, f"at_beam{beam}")
            export_translator(at, data.source_vectorizer, data.target_vectorizer, path,
                              max_length=data.target_length, beam_size=beam,
                              length_penalty=length_penalty, **options)
            label = "AT greedy" if beam == 1 else f"AT beam {beam}"
            translators[label] = served(path)
            rows[label] = quality(translators[label], sources, references)
            print(label, rows[label], flush=True)
    else:
        print(f"no {args.at}/model.keras: AT rows skipped")
    if os.path.exists(os.path.join(args.nat, "model.keras")):
        nat = keras.models.load_model(os.path.join(args.nat, "model.keras"))
        with open(os.path.join(args.nat, "metrics.json")) as f:
            length_beam = json.load(f)["length_beam"]
        for iterations in (1, 2, 4, 10):
            path = os.path.join(exports, f"nat_{iterations}")
            export_nat_translator(nat, data.source_vectorizer, data.target_vectorizer, path,
                                  iterations=iterations, length_beam=length_beam, **options)
            label = (f"NAT, {iterations} iteration{'s' if iterations > 1 else ''}, "
                     f"length beam {length_beam}")
            translators[label] = served(path)
            rows[label] = quality(translators[label], sources, references)
            print(label, rows[label], flush=True)
    else:
        print(f"no {args.nat}/model.keras: NAT rows skipped")
    if os.path.exists(args.keras_hub):
        import keras_hub  # noqa: F401  (registers the recipe's layers)

        hub = keras.models.load_model(args.keras_hub)
        word_args = parse_example_args(
            "serve", DEFAULTS, ["--data", args.data, "--out", exports, "--tokenizer", "word",
                                *shlex.split(args.example_args)], MODEL_FLAGS)
        words = load_data(word_args) if example_args.tokenizer != "word" else data
        label = "keras-hub recipe, GreedySampler (not exported)"
        translators[label] = keras_hub_translate(hub, words)
        rows[label] = quality(translators[label], sources, references)
        print(label, rows[label], flush=True)
    else:
        print(f"no {args.keras_hub}: keras-hub row skipped")
    if not translators:
        raise SystemExit("nothing to serve: pass --at, --nat or --keras-hub runs that exist")
    print(f"speed, side by side: {min(args.single, len(sources))} sentences one by one, "
          f"{min(args.batches, -(-len(sources) // 256))} batches of up to 256, each served by "
          "every translator in turn", flush=True)
    for label, speed in side_by_side_speed(translators, sources, args.single,
                                           args.batches).items():
        rows[label].update(speed)
    greedy = rows.get("AT greedy")
    for r in rows.values():  # the ratios the side-by-side timing is there for
        for key in ("per_s_batch_1", "per_s_batch_256"):
            r[key + "_vs_at_greedy"] = r[key] / greedy[key] if greedy else None
    print(f"\n| translator | BLEU ({args.split}) | exact match | sentences/s, batch 1 | "
          "x AT greedy | sentences/s, batch 256 | x AT greedy |")
    print("|---|---|---|---|---|---|---|")
    for label, r in rows.items():
        ratios = [("-" if r[key + "_vs_at_greedy"] is None
                   else f"{r[key + '_vs_at_greedy']:.2f}")
                  for key in ("per_s_batch_1", "per_s_batch_256")]
        print(f"| {label} | {r['bleu']:.2f} | {100 * r['exact_match']:.1f}% | "
              f"{r['per_s_batch_1']:.1f} | {ratios[0]} | {r['per_s_batch_256']:.0f} | "
              f"{ratios[1]} |")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "serve_translate.json"), "w") as f:
        json.dump({"split": args.split, "num_pairs": len(pairs), "rows": rows}, f, indent=2)
    print(f"wrote {args.out}/serve_translate.json")


if __name__ == "__main__":
    main()
