"""What the translation examples (and benchmarks) do with a trained translator: translate the
held-out splits and score them (exact match, corpus BLEU, unknown-token rates), draw
cross-attention heatmaps, print samples as typed, and check that the exported `translate`
signature answers what the model answers in Python. `keras_attn.recipes.translation` trains;
this module evaluates and serves.
"""

from __future__ import annotations

import os

from keras_attn.recipes.runtime import write_export


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
    metrics = {"export_dir": args.export_dir, "export_matches_python": matches}
    if getattr(args, "export_format", "tf_saved_model") == "onnx":
        metrics.update(check_onnx_export(model, data, args, [
            t.decode("utf-8") for t in texts.numpy()]))
    return metrics


def check_onnx_export(model, data, args, texts: list[str]) -> dict:
    """Writes the ONNX export (`keras_attn.export_decoding.export_seq2seq`: the encoder and
    the one-token decode step) into `onnx/` beside the SavedModel, decodes `texts` greedily
    with it in onnxruntime (`keras_attn.export_steps.greedy`) and compares the tokens with
    Python's greedy decoding."""
    import shutil

    import numpy as np

    from keras_attn import decoding, export_steps
    from keras_attn.export_decoding import export_seq2seq

    folder = os.path.join(os.path.dirname(os.path.abspath(args.export_dir)), "onnx")
    if os.path.isfile(os.path.join(folder, export_steps.METADATA)):
        shutil.rmtree(folder)  # an earlier run's ONNX export (the run may replace it)
    export_seq2seq(model, folder, "onnx", data.target_length, decoding.special_ids(model))
    ids = data.encode_source(texts)
    expected = decoding.generate(model, ids, data.target_length, sampler="greedy")
    matches = bool(np.array_equal(export_steps.greedy(folder, ids),
                                  np.asarray(expected)))
    print(f"ONNX export (encoder + decode step, onnxruntime) in {folder}: greedy tokens "
          f"equal to Python's: {matches}")
    return {"onnx_export_dir": folder, "onnx_matches_python": matches}


def serving_note(data) -> str:
    """What a consumer of this run's SavedModel needs besides TensorFlow."""
    if data.word_start is None:
        return "  serving needs TensorFlow alone"
    return ("  serving needs TensorFlow and tensorflow-text: `import tensorflow_text` before "
            "`tf.saved_model.load` (its SentencePiece op is in the graph)")
