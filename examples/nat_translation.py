"""Train a non-autoregressive translator (Mask-Predict), score it, and export it as a SavedModel.

The model (`keras_attn.models.nat_seq2seq`) is a conditional masked language model: a
Transformer encoder, a length classifier, and a decoder without causal mask that predicts every
masked target token at once. It trains with `model.fit` on targets whose tokens are masked at
random (`keras_attn.data.nat.make_cmlm_dataset`) and translates with Mask-Predict
(`keras_attn.decoding.mask_predict`): predict the length, predict all tokens in one pass, then
`--iterations - 1` times re-mask and re-predict the least sure ones. By default it learns the
built-in date-normalization task ("the 3rd of march, 2021" -> "2021-03-03"; no download); with
`--data fra.txt` a Tatoeba/Anki export. It prints exact match and corpus BLEU (0-100) on the
test split after 1, 4 and `--iterations` rounds, and writes into `--out`: metrics.json,
history.png, model.keras and saved_model/, whose `translate` signature (the same as the
autoregressive examples') serves raw strings with TensorFlow alone.

    python examples/nat_translation.py --out runs/nat
    python examples/nat_translation.py --data fra.txt --out runs/nat_fra
"""

from __future__ import annotations

import json
import os
import sys
import time

from example_utils import clear_export_dir, import_tensorflow_quietly
from transformer_translation import MODEL_FLAGS as TRANSFORMER_FLAGS
from translation_common import (
    TASK_NAMES,
    held_out_scores,
    load_and_describe,
    optimizer,
    parse_args,
    print_samples,
    serve_and_compare,
    served_inputs,
)

DEFAULTS = {
    "dates": {"num_examples": 20000, "epochs": 12, "batch_size": 128, "learning_rate": 2e-3,
              "out": "runs/nat", "num_layers": 2, "embed_dim": 64, "num_heads": 4,
              "ffn_dim": 128, "dropout": 0.1, "iterations": 10, "length_beam": 1,
              "warmup_steps": 0, "label_smoothing": 0.0, "precision": "float32"},
    # The autoregressive example's tuned settings (examples/transformer_translation.py), so
    # the two compare at the same size and training budget.
    "tatoeba": {"num_examples": None, "epochs": 4, "batch_size": 64, "learning_rate": 1e-3,
                "out": "runs/nat_tatoeba", "num_layers": 2, "embed_dim": 128,
                "num_heads": 4, "ffn_dim": 512, "dropout": 0.1, "max_length": 12,
                "min_freq": 2, "iterations": 10, "length_beam": 3, "warmup_steps": 300,
                "label_smoothing": 0.0, "precision": "mixed_bfloat16"},
}

# The model-size options, and the two decoding options of Mask-Predict (parse_args shows
# them in --help with their per-task defaults).
MODEL_FLAGS = {
    **TRANSFORMER_FLAGS,
    "iterations": (int, ("Mask-Predict rounds T of the reported score and the export (the "
                         "scores after 1 and 4 rounds are printed too)")),
    "length_beam": (int, ("candidate target lengths decoded per input, the best mean "
                          "log-probability wins")),
}

USAGE = (
    "python examples/nat_translation.py --out runs/nat",
    "python examples/nat_translation.py --epochs 2 --num-examples 2000 --out /tmp/nat",
    "python examples/nat_translation.py --iterations 4 --length-beam 2 --out runs/nat4",
    "python examples/nat_translation.py --data fra.txt --out runs/nat_fra",
)

# Options of the shared command line that this example does not implement.
_UNSUPPORTED = (("beam_size", 1, "--beam-size (use --length-beam)"),
                ("strategy", "default", "--strategy"), ("resume", False, "--resume"),
                ("interrupt_after", None, "--interrupt-after"),
                ("label_smoothing", 0.0, "--label-smoothing"),
                ("pad_to_max", False, "--pad-to-max (its batches are always padded)"))


def build_model(data, args):
    from keras_attn.models import nat_seq2seq

    return nat_seq2seq(
        data.source_vocab_size, data.target_vocab_size, num_layers=args.num_layers,
        embed_dim=args.embed_dim, num_heads=args.num_heads, ffn_dim=args.ffn_dim,
        dropout=args.dropout, max_target_length=data.target_length,
    )


def translate(model, data, sources: list[str], iterations: int, length_beam: int):
    """Mask-Predict translations of token-string sources, in batches of 256."""
    from keras_attn.decoding import mask_predict

    strings = []
    for start in range(0, len(sources), 256):
        ids = data.encode_source(sources[start:start + 256], standardize=False)
        tokens, _ = mask_predict(model, ids, iterations, length_beam=length_beam)
        strings += data.decode(tokens)
    return strings


def score(model, data, pairs, iterations: int, length_beam: int) -> tuple[dict, list]:
    """`held_out_scores` after `iterations` rounds with the decoding time, and
    `(source, prediction, reference)` for each pair."""
    references = [data.target_joiner.join(target.split()) for _, target in pairs]
    start = time.perf_counter()
    predictions = translate(model, data, [s for s, _ in pairs], iterations, length_beam)
    seconds = time.perf_counter() - start
    return ({"iterations": iterations, **held_out_scores(data, pairs, predictions),
             "decode_seconds": seconds},
            list(zip([s for s, _ in pairs], predictions, references)))


def check_export(model, data, args, raw_texts: list[str]) -> dict:
    """Exports the translator, serves `raw_texts` and odd inputs with the reloaded SavedModel,
    prints them, and compares them with the same computation in Python."""
    from keras_attn.export import export_nat_translator, make_nat_translate_fn

    if args.overwrite:
        clear_export_dir(args.export_dir)
    options = {"iterations": args.iterations, "length_beam": args.length_beam,
               "standardize": data.standardize_tf, "joiner": data.target_joiner}
    export_nat_translator(model, data.source_vectorizer, data.target_vectorizer,
                          args.export_dir, **options)
    texts = served_inputs(data, raw_texts)
    in_python = make_nat_translate_fn(model, data.source_vectorizer,
                                      data.target_vectorizer.get_vocabulary(),
                                      **options)(texts)
    matches = serve_and_compare(
        args.export_dir, texts, in_python, data,
        "score: mean log-probability of the output tokens (0 = sure, -inf = empty input)")
    # The graph's translations must also equal mask_predict + decode in Python.
    sources = [data.standardize(text.decode()) for text in texts.numpy()]
    decoded = translate(model, data, sources, args.iterations, args.length_beam)
    decoded = ["" if not source.split() else text for source, text in zip(sources, decoded)]
    served = [t.decode() for t in in_python["translation"].numpy()]
    matches = matches and served == decoded
    print(f"  Same as mask_predict + decode in Python: {served == decoded}")
    return {"export_dir": args.export_dir, "export_matches_python": matches}


def main(argv=None) -> dict:
    args = parse_args(__doc__.splitlines()[0], DEFAULTS, argv, MODEL_FLAGS, USAGE)
    for key, default, flag in _UNSUPPORTED:
        if getattr(args, key, default) != default:
            sys.exit(f"nat_translation.py: error: {flag} is not supported by this example")
    import_tensorflow_quietly()
    import keras

    from keras_attn.data.nat import make_cmlm_dataset
    from keras_attn.decoding.mask_predict import check_mask_predict_args
    from keras_attn.models import compile_cmlm
    from keras_attn.viz import plot_history

    keras.utils.set_random_seed(args.seed)
    keras.config.set_dtype_policy(args.precision)
    os.makedirs(args.out, exist_ok=True)
    data, raw = load_and_describe(args)

    model = build_model(data, args)
    check_mask_predict_args(model, args.iterations, args.length_beam, None)  # before training
    train = make_cmlm_dataset(data, "train", args.batch_size, shuffle=True, seed=args.seed)
    compile_cmlm(model, optimizer(args, int(train.cardinality())))
    validation = (make_cmlm_dataset(data, "validation", args.batch_size, seed=args.seed)
                  if data.validation else None)
    start = time.perf_counter()
    history = model.fit(train, validation_data=validation, epochs=args.epochs, shuffle=False,
                        verbose=2 if os.environ.get("CI") else 1)
    train_seconds = time.perf_counter() - start
    keras.config.set_dtype_policy("float32")
    model.save(os.path.join(args.out, "model.keras"))

    pairs = data.test[: args.max_test]
    rounds = sorted({1, 4, args.iterations})
    results, samples = {}, None
    for iterations in rounds:
        results[iterations], found = score(model, data, pairs, iterations, args.length_beam)
        if iterations == args.iterations:
            samples = found
    bleu_tokens = "characters" if data.target_joiner == "" else "words"
    print(f"test split, {len(pairs)} held-out pairs, length beam {args.length_beam}; "
          f"{train_seconds:.0f} s of training:")
    for iterations in rounds:
        r = results[iterations]
        print(f"  {iterations:2d} Mask-Predict round{'s' if iterations > 1 else ' '}: exact "
              f"match {100 * r['exact_match']:6.2f}%, corpus BLEU {r['bleu']:6.2f} (0-100, "
              f"over {bleu_tokens}), decoded in {r['decode_seconds']:.1f} s")
    print_samples(samples[:5], raw)
    if history.history:
        plot_history(history, path=os.path.join(args.out, "history.png"),
                     title=f"Mask-Predict translator on {TASK_NAMES[args.task]}: losses and "
                           "accuracies (tokens: masked positions only)")

    final = results[args.iterations]
    metrics = {
        "model": "nat", "task": args.task, "num_test": len(pairs),
        "exact_match": final["exact_match"], "bleu": final["bleu"], "bleu_scale": "0-100",
        "bleu_tokens": bleu_tokens, "iterations": args.iterations,
        "length_beam": args.length_beam,
        "by_iterations": {str(k): v for k, v in results.items()},
        "train_seconds": train_seconds, "epochs": args.epochs,
        "epochs_run": len(history.history.get("loss", [])), "precision": args.precision,
        "model_options": {key: getattr(args, key) for key in args.model_options},
        "num_params": int(model.count_params()),
        "final_loss": float(history.history["loss"][-1]) if history.history else None,
    }
    metrics.update(check_export(model, data, args, [raw.get(s, s) for s, _, _ in samples[:3]]))
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    print(f"metrics, plots and the SavedModel are in {args.out}/")
    return metrics


if __name__ == "__main__":
    main(sys.argv[1:])
