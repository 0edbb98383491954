"""Train a non-autoregressive translator (Mask-Predict), score it, and export it as a SavedModel.

The model (`keras_attn.models.nat_seq2seq`) is a conditional masked language model: a
Transformer encoder, a length classifier, and a decoder without causal mask that predicts every
masked target token at once. It trains with `model.fit` on targets whose tokens are masked at
random (`keras_attn.data.nat.make_cmlm_dataset`) and translates with Mask-Predict
(`keras_attn.decoding.mask_predict`): predict the length, predict all tokens in one pass, then
`--iterations - 1` times re-mask and re-predict the least sure ones. By default it learns the
built-in date-normalization task ("the 3rd of march, 2021" -> "2021-03-03"; no download); with
`--data fra.txt` a Tatoeba/Anki export. It prints exact match and corpus BLEU (0-100) on the
test split after 1, 2, 4 and `--iterations` rounds, and writes into `--out`: metrics.json,
history.png, model.keras, vocabulary/ and saved_model/, whose `translate` signature (the same
as the autoregressive examples') serves raw strings.

With `--teacher RUN` it learns from a teacher instead of the references (sequence-level
knowledge distillation, Kim & Rush 2016, as Mask-Predict trains): RUN is a finished run of
`examples/transformer_translation.py` on the same data (same split and vocabularies, checked);
its model translates the training sources with beam search (`--teacher-beam`), and those
translations become the training targets. The teacher's translating time is reported apart
from the training time (and cached in RUN, so the next student reuses it). The NAT also starts
from the teacher's weights (`--init teacher`, the default with `--teacher`; it needs the
teacher's model sizes): the encoder is the same, and the decoder differs only in its
self-attention mask and the `<mask>` embedding row, so only the length predictor starts
untrained.

    python examples/nat_translation.py --out runs/nat
    python examples/nat_translation.py --data fra.txt --out runs/nat_fra
    python examples/transformer_translation.py --data fra.txt --out runs/at_fra
    python examples/nat_translation.py --data fra.txt --teacher runs/at_fra --out runs/nat_kd
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time

from example_utils import import_tensorflow_quietly
from transformer_translation import MODEL_FLAGS
from translation_args import TASK_NAMES, parse_args

# The shared translation code (`keras_attn.recipes.translation`) imports TensorFlow: the
# functions below import it when called, after `main` has parsed the arguments.

DEFAULTS = {
    "dates": {"num_examples": 20000, "epochs": 12, "batch_size": 128, "learning_rate": 2e-3,
              "out": "runs/nat", "num_layers": 2, "embed_dim": 64, "num_heads": 4,
              "ffn_dim": 128, "dropout": 0.1, "iterations": 10, "length_beam": 1,
              "warmup_steps": 0, "label_smoothing": 0.0, "precision": "float32",
              "teacher_beam": 4},
    # The autoregressive example's tuned settings (examples/transformer_translation.py), so
    # the two compare at the same size and training budget, but for the batch: 32 lost 0.5
    # BLEU at 10 rounds against 64 here (one run each, benchmarks/RESULTS.md).
    "tatoeba": {"num_examples": None, "epochs": 4, "batch_size": 64, "learning_rate": 1e-3,
                "out": "runs/nat_tatoeba", "num_layers": 2, "embed_dim": 128,
                "num_heads": 4, "ffn_dim": 512, "dropout": 0.0, "max_length": 12,
                "min_freq": 2, "tokenizer": "sentencepiece", "vocab_size": 4000,
                "iterations": 10, "length_beam": 3, "warmup_steps": 300,
                "label_smoothing": 0.0, "precision": "mixed_bfloat16", "teacher_beam": 4},
}

# The decoding options of Mask-Predict and the teacher (parse_args shows them in --help with
# their per-task defaults); the model-size options are the Transformer example's.
SCRIPT_FLAGS = {
    "iterations": (int, ("Mask-Predict rounds T of the reported score and the export (the "
                         "scores after 1, 2 and 4 rounds are printed too)")),
    "length_beam": (int, ("candidate target lengths decoded per input, the best mean "
                          "log-probability wins")),
    "teacher": (str, ("a finished run of transformer_translation.py on the same data "
                      "(same --data, --num-examples, --max-length, --seed and vocabulary "
                      "options): train on its beam translations of the training sources "
                      "instead of the references (default: none, train on the references)")),
    "teacher_beam": (int, "beam size of the teacher's translations"),
    "init": (str, ("the NAT's starting weights: 'teacher' (the --teacher model's encoder, "
                   "decoder blocks, norms, head and token embeddings; the teacher needs the "
                   "same --num-layers, --embed-dim, --num-heads and --ffn-dim) or 'random' "
                   "(default: 'teacher' with --teacher, else 'random')")),
}

USAGE = (
    "python examples/nat_translation.py --out runs/nat",
    ("python examples/nat_translation.py --epochs 2 --num-examples 2000 --out /tmp/nat"
     "   # a quick check that everything runs: most translations come out wrong"),
    "python examples/nat_translation.py --iterations 4 --length-beam 2 --out runs/nat4",
    "python examples/nat_translation.py --data fra.txt --out runs/nat_fra",
    ("python examples/nat_translation.py --data fra.txt --teacher runs/transformer_tatoeba "
     "--out runs/nat_kd"),
)

# Options of the shared command line that this example does not implement: not in its --help,
# refused when given.
UNSUPPORTED = {
    "export_format": ("--export-format is not an option of the NAT example (Mask-Predict has "
                      "no one-token decode step to export)"),
    "beam_size": "--beam-size is not an option of the NAT example (it has --length-beam)",
    "length_penalty": ("--length-penalty is not an option of the NAT example (its candidate "
                       "lengths rank by mean log-probability)"),
    "strategy": "--strategy is not supported by the NAT example (it trains on one device)",
    "resume": "--resume is not supported by the NAT example",
    "interrupt_after": "--interrupt-after is not supported by the NAT example",
    "label_smoothing": "--label-smoothing is not supported by the NAT example (compile_cmlm "
                       "has no smoothing)",
}


def build_model(data, args):
    from keras_attn.models import nat_seq2seq

    return nat_seq2seq(
        data.source_vocab_size, data.target_vocab_size, num_layers=args.num_layers,
        hidden_dim=args.embed_dim, num_heads=args.num_heads, intermediate_dim=args.ffn_dim,
        dropout=args.dropout, max_target_length=data.target_length,
    )


def token_counts(vectorizer, texts: list[str]):
    """The number of tokens `vectorizer` makes of each text (before padding or truncation)."""
    import numpy as np
    import tensorflow as tf

    if hasattr(vectorizer, "count_tokens"):  # subword pieces
        return vectorizer.count_tokens(tf.constant(texts)).numpy()
    return np.array([len(text.split()) for text in texts])


def teacher_metrics(data, args) -> dict:
    """The teacher run's metrics.json; exits when it was trained on other data options."""
    from keras_attn.recipes.translation import data_options

    with open(os.path.join(args.teacher, "metrics.json")) as f:
        teacher = json.load(f)
    ours = data_options(args, data)
    theirs = teacher.get("data_options", {})
    different = sorted(key for key in ours if theirs.get(key) != ours[key])
    if different:
        sys.exit(f"nat_translation.py: error: the teacher in {args.teacher} was trained on other "
                 "data: " + "; ".join(f"{key} {theirs.get(key)!r} there, {ours[key]!r} here"
                                      for key in different)
                 + ". Give this run the teacher's data options.")
    return teacher


@contextlib.contextmanager
def float32_policy():
    """The teacher is loaded and translates as it was saved: under the float32 policy."""
    import keras

    saved = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")
    try:
        yield
    finally:
        keras.config.set_dtype_policy(saved)


def load_teacher(args):
    """The teacher run's model (under the float32 policy, as it was saved)."""
    import keras

    with float32_policy():
        return keras.models.load_model(os.path.join(args.teacher, "model.keras"),
                                       compile=False)


def distilled_pairs(data, args, teacher: dict) -> tuple[list, dict]:
    """The training sources paired with the teacher's beam translations (sequence-level
    knowledge distillation), and what it took: the teacher's translating seconds, apart from
    any training time. The translations are cached in the teacher's run directory.
    `teacher` is the teacher's metrics (`teacher_metrics`)."""
    import hashlib

    from keras_attn.recipes.translation import data_options, run_length_penalty
    from keras_attn.recipes.translation_eval import translate

    ours = data_options(args, data)
    sources = [source for source, _ in data.train]
    length_penalty = run_length_penalty(teacher)  # the teacher ranks as its own run did
    cache = os.path.join(args.teacher, f"distilled_train_beam{args.teacher_beam}.json")
    key = hashlib.sha1(json.dumps([ours, args.teacher_beam, length_penalty]).encode()).hexdigest()
    found = None
    if os.path.exists(cache):
        with open(cache) as f:
            found = json.load(f)
    if found is not None and found.get("key") == key:
        translations, seconds, cached = found["translations"], found["seconds"], True
    else:
        print(f"the teacher ({args.teacher}) translates the {len(sources)} training sources "
              f"with beam {args.teacher_beam} (length penalty {length_penalty:g}) ...",
              flush=True)
        model = load_teacher(args)
        start = time.perf_counter()
        with float32_policy():
            translations = translate(model, data, sources, args.teacher_beam, length_penalty)
        seconds, cached = time.perf_counter() - start, False
        with open(cache, "w") as f:
            json.dump({"key": key, "seconds": seconds, "translations": translations}, f)
    # A teacher's output that is empty or longer than the target length cannot be a target.
    counts = token_counts(data.target_vectorizer, translations)
    kept = [(source, target) for source, target, count in zip(sources, translations, counts)
            if 0 < count < data.target_length]
    if not kept:
        sys.exit(f"nat_translation.py: error: none of the teacher's {len(sources)} translations "
                 f"has 1 to {data.target_length - 1} target tokens: the teacher in "
                 f"{args.teacher} has not learned to translate yet")
    info = {"teacher": args.teacher, "teacher_beam": args.teacher_beam,
            "teacher_length_penalty": length_penalty,
            "teacher_seconds": seconds, "teacher_cached": cached,
            "teacher_train_seconds": teacher.get("train_seconds"),
            "teacher_test_bleu": teacher.get("bleu"),
            "distilled_pairs": len(kept), "teacher_outputs_dropped": len(sources) - len(kept),
            "targets_changed": sum(t != r for (_, r), t in zip(data.train, translations))
            / max(len(sources), 1)}
    print(f"distillation: {len(kept)} training pairs with the teacher's translations as "
          f"targets ({100 * info['targets_changed']:.1f}% differ from the references; "
          f"{info['teacher_outputs_dropped']} empty or too long dropped); the teacher "
          f"translated them in {seconds:.0f} s{' (cached earlier)' if cached else ''}, not "
          "counted in the training time below", flush=True)
    return kept, info


def start_from_teacher(model, args) -> dict:
    """Copy the teacher's weights into the NAT (`initialize_from_seq2seq`); what was copied."""
    from keras_attn.models import initialize_from_seq2seq

    try:
        report = initialize_from_seq2seq(model, load_teacher(args))
    except ValueError as error:
        sys.exit(f"nat_translation.py: error: --init teacher: {error} (give the NAT the "
                 "teacher's --num-layers, --embed-dim, --num-heads and --ffn-dim, or --init "
                 "random)")
    print(f"starting from the teacher's weights: {report['copied']} variables copied; left "
          f"as initialised: {', '.join(report['kept'])} and the <mask> embedding row",
          flush=True)
    return report


def translate(model, data, sources: list[str], iterations: int, length_beam: int):
    """Mask-Predict translations of token-string sources, in batches of 256."""
    from keras_attn.decoding import mask_predict

    strings = []
    for start in range(0, len(sources), 256):
        ids = data.encode_source(sources[start:start + 256], standardize=False)
        tokens, _ = mask_predict(model, ids, iterations=iterations, length_beam=length_beam)
        strings += data.decode(tokens)
    return strings


def score(model, data, pairs, iterations: int, length_beam: int) -> tuple[dict, list]:
    """`held_out_scores` after `iterations` rounds with the decoding time, and
    `(source, prediction, reference)` for each pair."""
    from keras_attn.recipes.translation_eval import held_out_scores

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
    from keras_attn.recipes.runtime import write_export
    from keras_attn.recipes.translation_eval import serve_and_compare, served_inputs

    options = {"iterations": args.iterations, "length_beam": args.length_beam,
               **data.text_options}
    write_export(args.export_dir, lambda path: export_nat_translator(
        model, data.source_vectorizer, data.target_vectorizer, path, **options))
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
    args = parse_args(__doc__.splitlines()[0], DEFAULTS, argv, MODEL_FLAGS, USAGE,
                      unsupported=UNSUPPORTED, script_flags=SCRIPT_FLAGS)
    if args.teacher is not None and not os.path.isfile(os.path.join(args.teacher,
                                                                    "metrics.json")):
        sys.exit(f"nat_translation.py: error: --teacher {args.teacher} holds no finished run "
                 "of transformer_translation.py (no metrics.json)")
    if args.init is None:
        args.init = "random" if args.teacher is None else "teacher"
    if args.init not in ("random", "teacher"):
        sys.exit(f"nat_translation.py: error: --init must be 'random' or 'teacher'; received "
                 f"{args.init!r}")
    if args.init == "teacher" and args.teacher is None:
        sys.exit("nat_translation.py: error: --init teacher needs --teacher")
    import_tensorflow_quietly()
    import keras

    from keras_attn.data.nat import make_cmlm_dataset
    from keras_attn.decoding.mask_predict import check_mask_predict_args
    from keras_attn.models import compile_cmlm
    from keras_attn.recipes.runtime import fit_verbosity
    from keras_attn.recipes.translation import (
        data_options,
        fit_plan,
        load_and_describe,
        optimizer,
        save_vocabularies,
        short_run_note,
    )
    from keras_attn.recipes.translation_eval import print_samples
    from keras_attn.viz import plot_history

    keras.utils.set_random_seed(args.seed)
    os.makedirs(args.out, exist_ok=True)
    data, raw = load_and_describe(args)
    teacher = teacher_metrics(data, args) if args.teacher is not None else None
    keras.config.set_dtype_policy(args.precision)
    model = build_model(data, args)
    check_mask_predict_args(model, args.iterations, args.length_beam, None)  # before training
    # Before the teacher's translating: a teacher of other sizes is refused at once.
    init = start_from_teacher(model, args) if args.init == "teacher" else None
    train_pairs, teacher = (distilled_pairs(data, args, teacher) if teacher is not None
                            else (data.train, {}))
    if init is not None:
        teacher["init"] = init
    grouped = not args.pad_to_max
    train = make_cmlm_dataset(data, train_pairs, args.batch_size, shuffle=True, seed=args.seed,
                              group_by_length=grouped)
    compile_cmlm(model, optimizer(args, int(train.cardinality())))
    validation = (make_cmlm_dataset(data, "validation", args.batch_size, seed=args.seed,
                                    group_by_length=grouped)
                  if data.validation else None)
    epochs, callbacks = fit_plan(args)
    start = time.perf_counter()
    history = model.fit(train, validation_data=validation, epochs=epochs, shuffle=False,
                        callbacks=callbacks, verbose=fit_verbosity())
    train_seconds = time.perf_counter() - start
    budget = callbacks[0].summary() if callbacks else {}
    keras.config.set_dtype_policy("float32")
    model.save(os.path.join(args.out, "model.keras"))
    save_vocabularies(data, args.out)

    pairs = data.test[: args.max_test]
    rounds = sorted({1, 2, 4, args.iterations})
    results, samples = {}, None
    for iterations in rounds:
        results[iterations], found = score(model, data, pairs, iterations, args.length_beam)
        if iterations == args.iterations:
            samples = found
    bleu_tokens = "characters" if data.target_joiner == "" else "words"
    print(f"test split, {len(pairs)} held-out pairs, length beam {args.length_beam}; "
          f"{train_seconds:.0f} s of training"
          + (f" on the teacher's translations (its {teacher['teacher_seconds']:.0f} s of "
             "translating not counted)" if teacher else "") + ":")
    for iterations in rounds:
        r = results[iterations]
        print(f"  {iterations:2d} Mask-Predict round{'s' if iterations > 1 else ' '}: exact "
              f"match {100 * r['exact_match']:6.2f}%, corpus BLEU {r['bleu']:6.2f} (0-100, "
              f"over {bleu_tokens}), decoded in {r['decode_seconds']:.1f} s")
    print_samples(samples[:5], raw)
    note = short_run_note(args, DEFAULTS)
    if note:
        print(note)
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
        "source_unknown_rate": final["source_unknown_rate"],
        "output_unknown_rate": final["output_unknown_rate"],
        "train_seconds": train_seconds, **budget, **teacher, "init_from": args.init,
        "epochs": None if args.time_budget is not None else args.epochs,
        "data_seconds": args.data_seconds, "data_options": data_options(args, data),
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
