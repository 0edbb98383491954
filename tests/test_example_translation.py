"""The translation examples: `--help`, run directories, and smoke runs (metrics.json, heatmaps,
export inside OUT, a clean console, mirrored strategy, resume).

The full default runs (quality targets) are `slow` tests.
"""

import ast
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest
from translation_fixtures import write_pairs_file

pytestmark = pytest.mark.tf_only  # tf.data, SavedModels, the examples

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SMOKE = ["--num-examples", "300", "--epochs", "1", "--max-test", "20", "--batch-size", "64"]
# The scripts import this checkout's keras_attn, not another installed copy.
ENV = {**os.environ, "CI": "1",
       "PYTHONPATH": os.pathsep.join([str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")]
                                                    if p])}
# Lines a script must never show a newcomer: TensorFlow start-up noise and Keras' warning for
# `shuffle=True` with a tf.data.Dataset.
NOISE = re.compile(r"cuInit|cuda drivers|oneDNN|absl::InitializeLog|cpu_feature_guard|"
                   r"shuffle=True")


def run_example(script, tmp_path, *args, check=True, out=None):
    out = out or tmp_path / "out"
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--out", str(out), *args],
        capture_output=True, text=True, timeout=1500, cwd=str(tmp_path), env=ENV, check=False,
    )
    if check:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result, out


def examples_module(name: str):
    """Imports `name` from `examples/` or `benchmarks/` (on the tests' path: setup.cfg's
    `pythonpath`), as the scripts see their siblings."""
    import importlib

    return importlib.import_module(name)


def check_outputs(out, export=None):
    export = export or out / "saved_model"
    metrics = json.loads((out / "metrics.json").read_text())
    for key in ("exact_match", "bleu", "train_seconds", "num_test"):
        assert key in metrics
    assert 0.0 <= metrics["exact_match"] <= 1.0
    assert 0.0 <= metrics["bleu"] <= 100.0 and metrics["bleu_scale"] == "0-100"
    assert metrics["export_matches_python"] is True
    assert metrics["export_dir"] == str(export)
    assert (export / "saved_model.pb").exists()
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert "history.png" in pngs and "attention_0.png" in pngs
    assert all((out / p).stat().st_size > 2000 for p in pngs)
    return metrics


def help_text(script):
    result = subprocess.run([sys.executable, str(EXAMPLES / script), "--help"],
                            capture_output=True, text=True, timeout=120, env=ENV, check=False)
    assert result.returncode == 0, result.stderr
    return " ".join(result.stdout.split())  # argparse wraps lines where it likes


def test_help_shows_every_default_the_model_flags_and_the_date_formats():
    text = help_text("transformer_translation.py")
    for expected in (("--epochs EPOCHS training epochs (default: 14 for the built-in dates, "
                      "4 for --data/--download)"),
                     "(default: 128 for the built-in dates, 32 for --data/--download)",
                     "(default: 0.002 for the built-in dates, 0.001 for --data/--download)",
                     ("Keras dtype policy of training (default: float32 for the built-in "
                      "dates, mixed_bfloat16 for --data/--download)"),
                     ("(default: runs/transformer for the built-in dates, "
                      "runs/transformer_tatoeba for --data/--download)"),
                     "SavedModel directory (default: OUT/saved_model)",
                     ("--length-penalty ALPHA GNMT length-penalty exponent of beam search"),
                     "(default: 0.6 for the built-in dates, 1.2 for --data/--download)",
                     "--num-layers NUM_LAYERS", "--embed-dim EMBED_DIM",
                     "--num-heads NUM_HEADS", "--ffn-dim FFN_DIM", "--overwrite",
                     "examples: python examples/transformer_translation.py --out runs/transformer",
                     "the 3rd of march, 2021", "march 3, '21", "2021-3-3",
                     "dots are day first"):
        assert expected in text, expected
    assert "default: None" not in text
    text = help_text("bahdanau_translation.py")
    assert "--units UNITS size of the GRU states and of the attention (default: 128 for the " \
           "built-in dates, 256 for --data/--download)" in text
    assert "--num-heads" not in text


def test_help_lists_the_formats_of_the_dates_module():
    translation_args = examples_module("translation_args")
    from keras_attn.data.dates import FORMATS, describe_formats

    assert translation_args.DATES_HELP == describe_formats()
    assert f"reads {len(FORMATS)} formats" in describe_formats()


def test_help_states_the_recipes_constants():
    """`translation_args` keeps copies of the recipe's constants for `--help` (it must not
    import TensorFlow): they are the ones `keras_attn.recipes.translation` runs with."""
    from keras_attn.recipes import translation

    translation_args = examples_module("translation_args")
    for name in ("DEFAULT_LENGTH_PENALTY", "TASK_NAMES", "DECAY_FRACTION", "WARMUP_FRACTION",
                 "AVERAGE_FRACTION"):
        assert getattr(translation_args, name) == getattr(translation, name), name


def test_a_run_never_replaces_an_earlier_run(tmp_path):
    """Refused before any training: an earlier run's results, or an export directory that is
    not a SavedModel (never deleted, even with --overwrite)."""
    out = tmp_path / "earlier"
    out.mkdir()
    (out / "metrics.json").write_text("{}")
    result, _ = run_example("transformer_translation.py", tmp_path, out=out, check=False)
    assert result.returncode == 2
    assert "already holds the results of an earlier run" in result.stderr
    assert "--overwrite" in result.stderr
    (out / "metrics.json").unlink()
    (out / "saved_model").mkdir()
    (out / "saved_model" / "saved_model.pb").write_bytes(b"")
    result, _ = run_example("transformer_translation.py", tmp_path, out=out, check=False)
    assert result.returncode == 2 and "already holds a SavedModel" in result.stderr
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("keep me")
    result, _ = run_example("bahdanau_translation.py", tmp_path, "--export-dir", str(notes),
                            "--overwrite", check=False)
    assert result.returncode == 2 and "is not a SavedModel directory" in result.stderr
    assert (notes / "todo.txt").read_text() == "keep me"


def test_transformer_dates_smoke(tmp_path):
    """Default export inside OUT (and the ONNX one beside it), model size from the command
    line, a console that shows the inputs as written and BLEU on the 0-100 scale, without
    TensorFlow noise."""
    size = ["--num-layers", "1", "--embed-dim", "16", "--num-heads", "2", "--ffn-dim", "32"]
    result, out = run_example("transformer_translation.py", tmp_path, *SMOKE, *size,
                              "--export-format", "onnx")
    metrics = check_outputs(out)
    assert metrics["epochs_run"] == 1 and metrics["task"] == "dates"
    # The ONNX export beside the SavedModel decodes as Python does (keras_attn.export_steps).
    assert metrics["onnx_matches_python"] is True
    assert (out / "onnx" / "export.json").is_file() and metrics["onnx_export_dir"] == str(
        out / "onnx")
    assert metrics["model_options"] == {"num_layers": 1, "embed_dim": 16, "num_heads": 2,
                                        "ffn_dim": 32, "dropout": 0.1}
    assert metrics["bleu_tokens"] == "characters"
    from keras_attn.data.dates import load_dates

    typed = [source for source, _ in load_dates(num_examples=300, seed=0).test[:5]]
    # e.g. 'the 1st of march, 2042', not 'the 1 st of march , 2 0 4 2'
    assert sample_inputs(result.stdout) == typed, result.stdout
    assert re.search(r"corpus BLEU \d+\.\d\d \(0-100, over characters\)", result.stdout)
    assert "score    -inf" in result.stdout  # the empty input, served
    noise = [line for line in (result.stdout + result.stderr).splitlines()
             if NOISE.search(line)]
    assert noise == []
    # A second run into the same OUT replaces it only when asked to.
    again, _ = run_example("transformer_translation.py", tmp_path, *SMOKE, *size, check=False)
    assert again.returncode == 2 and "--overwrite" in again.stderr


def test_bahdanau_pairs_smoke(tmp_path):
    pairs = write_pairs_file(tmp_path / "fra.txt")
    smoke = [arg for arg in SMOKE if arg not in ("--epochs", "1")]
    result, out = run_example("bahdanau_translation.py", tmp_path, *smoke, "--data", str(pairs),
                              "--units", "16", "--embed-dim", "8", "--tokenizer", "word",
                              "--time-budget", "20", "--average-checkpoints", "3")
    metrics = check_outputs(out)
    # At least the first step past 17 s and the end were averaged, and the validation BLEU of
    # the final weights is recorded beside that of the average.
    assert metrics["checkpoints_averaged"] >= 2
    assert set(metrics["validation_bleu_without"]) == {"final_weights"}
    assert "the model kept averages 3 checkpoints of the last 15%" in result.stdout
    assert metrics["data_options"]["tokenizer"] == "word"
    assert 0 <= metrics["source_unknown_rate"] < 0.5
    # Training stopped at the first step past the budget. The first step traces the training
    # function and can take tens of seconds on a busy machine, so the bound above is loose; the
    # run's default epochs on these pairs would take many minutes.
    assert metrics["budget_spent"] is True and metrics["epochs"] is None
    assert 20 <= metrics["trained_s"] < 150 and metrics["steps"] >= 1
    assert "training for 20 s (--time-budget)" in result.stdout
    assert metrics["epochs_run"] >= 1 and metrics["task"] == "tatoeba"
    assert metrics["model_options"]["units"] == 16 and metrics["bleu_tokens"] == "words"
    written = {line.split("\t")[0] for line in pairs.read_text(encoding="utf-8").splitlines()}
    shown = sample_inputs(result.stdout)
    assert len(shown) == 5 and set(shown) <= written, shown  # 'I am tall.', not 'i am tall .'


def test_subword_teacher_and_distilled_nat_on_pairs(tmp_path):
    """SentencePiece vocabularies through the whole example (metrics, saved vocabularies, an
    export that serves words), then a NAT trained on that run's beam translations; a student
    with other data options is refused."""
    pairs = write_pairs_file(tmp_path / "fra.txt")
    data = ["--data", str(pairs), "--tokenizer", "sentencepiece", "--vocab-size", "40",
            "--max-test", "20", "--batch-size", "16", "--warmup-steps", "10"]
    size = ["--num-layers", "1", "--embed-dim", "32", "--num-heads", "2", "--ffn-dim", "64"]
    result, teacher = run_example("transformer_translation.py", tmp_path, *data, *size,
                                  "--epochs", "12", out=tmp_path / "teacher")
    metrics = check_outputs(teacher)
    assert metrics["data_options"]["tokenizer"] == "sentencepiece"
    assert metrics["data_options"]["source_vocab_size"] == 40
    assert metrics["source_unknown_rate"] == 0.0 and metrics["bleu_tokens"] == "words"
    # --data decodes with a beam of 4 by default; greedy's validation BLEU is recorded beside
    assert set(metrics["validation_bleu_without"]) == {"greedy"}
    assert metrics["beam_size"] == 4 and metrics["length_penalty"] == 1.2
    assert 0.0 <= metrics["validation_bleu_without"]["greedy"] <= 100.0
    assert (teacher / "vocabulary" / "target.model").stat().st_size > 100
    vocabulary = (teacher / "vocabulary" / "target.txt").read_text(encoding="utf-8").split("\n")
    assert vocabulary[1:4] == ["[UNK]", "<bos>", "<eos>"] and len(vocabulary) == 41
    assert "serving needs TensorFlow and tensorflow-text" in result.stdout
    assert "\u2581" not in result.stdout.split("sample test translations")[1]

    other, out = run_example("nat_translation.py", tmp_path, *data[:4], "--vocab-size", "50",
                             "--teacher", str(teacher), check=False)
    assert other.returncode != 0 and "vocab_size 40 there, 50 here" in other.stderr
    # A student of other sizes cannot start from the teacher: refused before it translates.
    other, out = run_example("nat_translation.py", tmp_path, *data, *size[:-1], "32",
                             "--teacher", str(teacher), check=False)
    assert other.returncode != 0 and "intermediate_dim=32" in other.stderr, other.stderr[-500:]
    assert not (teacher / "distilled_train_beam4.json").exists()
    # One epoch of however many distilled pairs the teacher's outputs leave: a short warm-up.
    result, out = run_example("nat_translation.py", tmp_path, *data[:-2], "--warmup-steps", "2",
                              *size, "--epochs", "1",
                              "--teacher", str(teacher), "--teacher-beam", "2",
                              out=tmp_path / "student")
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["teacher"] == str(teacher) and metrics["teacher_beam"] == 2
    assert metrics["teacher_length_penalty"] == 1.2  # the teacher ranks as its run did
    assert metrics["teacher_seconds"] > 0 and metrics["teacher_cached"] is False
    assert metrics["distilled_pairs"] + metrics["teacher_outputs_dropped"] == len(
        json.loads((teacher / "distilled_train_beam2.json").read_text())["translations"])
    assert metrics["export_matches_python"] is True
    assert set(metrics["by_iterations"]) == {"1", "2", "4", "10"}
    assert "translating not counted" in result.stdout
    # With --teacher the NAT starts from the teacher's weights: all but the length predictor.
    assert metrics["init"]["copied"] > 0 and "starting from the teacher's weights" in result.stdout
    assert metrics["init"]["kept"] and all("length_predictor" in path
                                           for path in metrics["init"]["kept"])


def sample_inputs(stdout):
    """The inputs of the sample translations the script printed."""
    block = stdout.split("sample test translations")[1].split("exported to")[0]
    return [ast.literal_eval(match) for match in
            re.findall(r"^  ('(?:[^'\\]|\\.)*'|\"(?:[^\"\\]|\\.)*\") +->", block,
                       flags=re.MULTILINE)]


@pytest.mark.slow
def test_mirrored_strategy_and_resume(tmp_path):
    """Two logical CPUs under MirroredStrategy; an interrupted run resumes where it stopped."""
    args = [*SMOKE[:2], "--epochs", "3", "--max-test", "10", "--strategy", "mirrored",
            "--export-dir", str(tmp_path / "export"), "--num-layers", "1", "--embed-dim", "16",
            "--num-heads", "2", "--ffn-dim", "32"]
    first, out = run_example("transformer_translation.py", tmp_path, *args,
                             "--interrupt-after", "1", check=False)
    assert first.returncode == 3, first.stderr[-3000:]
    assert "interrupted after epoch 1" in first.stdout
    assert (out / "backup").exists()
    _, out = run_example("transformer_translation.py", tmp_path, *args, "--resume")
    metrics = check_outputs(out, tmp_path / "export")
    assert metrics["strategy"] == "mirrored"
    assert metrics["epochs_run"] == 2  # epoch 1 came from the backup, not trained again


@pytest.mark.slow
def test_transformer_default_run_reaches_99_percent(tmp_path):
    _, out = run_example("transformer_translation.py", tmp_path)
    metrics = check_outputs(out)
    assert metrics["exact_match"] >= 0.99, metrics


@pytest.mark.slow
def test_bahdanau_default_run_learns_dates(tmp_path):
    _, out = run_example("bahdanau_translation.py", tmp_path)
    metrics = check_outputs(out)
    assert metrics["exact_match"] >= 0.95, metrics


def test_nat_help_lists_only_what_it_runs_and_refuses_the_rest(tmp_path):
    text = help_text("nat_translation.py")
    for expected in ("--iterations ITERATIONS", "--length-beam LENGTH_BEAM",
                     "(default: 1 for the built-in dates, 3 for --data/--download)",
                     "--teacher TEACHER", "--teacher-beam TEACHER_BEAM", "--time-budget SECONDS",
                     "--init INIT",
                     "--pad-to-max", "--tokenizer {word,sentencepiece}",
                     "examples: python examples/nat_translation.py --out runs/nat",
                     "a quick check that everything runs: most translations come out wrong"):
        assert expected in text, expected
    refused = (["--beam-size", "4"], ["--label-smoothing", "0.1"], ["--strategy", "mirrored"],
               ["--resume"], ["--length-penalty", "1.0"])
    for flag in refused:
        assert flag[0] + " " not in text  # not offered ...
        result, out = run_example("nat_translation.py", tmp_path, *flag, check=False)
        assert result.returncode == 2, result.stderr[-500:]  # ... and refused by name
        assert f"error: {flag[0]} is not" in result.stderr, result.stderr[-500:]
        assert not out.exists()  # refused before anything was made
    result, out = run_example("nat_translation.py", tmp_path, "--teacher", str(tmp_path),
                              check=False)
    assert result.returncode != 0 and "no finished run" in result.stderr
    assert not out.exists()
    for flag, message in ((["--init", "teacher"], "--init teacher needs --teacher"),
                          (["--init", "zeros"], "--init must be 'random' or 'teacher'")):
        result, out = run_example("nat_translation.py", tmp_path, *flag, check=False)
        assert result.returncode != 0 and message in result.stderr, result.stderr[-500:]
        assert not out.exists()


@pytest.mark.parametrize("script", ["transformer_translation.py", "nat_translation.py"])
@pytest.mark.parametrize("args, message", [
    (["--epochs", "0"], "--epochs must be at least 1. Received: --epochs 0"),
    (["--time-budget", "0"], "argument --time-budget: expected a finite number > 0, got '0'"),
    (["--time-budget", "60", "--epochs", "3"], "--epochs cannot be combined with --time-budget"),
    (["--tokenizer", "sentencepiece"], "--tokenizer applies to sentence pairs"),
    (["--data", "x.txt", "--tokenizer", "word", "--vocab-size", "100"],
     "--vocab-size applies to --tokenizer sentencepiece"),
    (["--data", "x.txt", "--tokenizer", "sentencepiece", "--min-freq", "3"],
     "--min-freq applies to --tokenizer word"),
    (["--average-checkpoints", "3"], "--average-checkpoints applies to --time-budget runs"),
    (["--time-budget", "60", "--average-checkpoints", "0"],
     "--average-checkpoints must be at least 1. Received: --average-checkpoints 0"),
])
def test_options_that_cannot_run_are_refused_by_name(script, args, message, tmp_path):
    """Before anything runs: e.g. `--epochs 0` names --epochs (not --warmup-steps)."""
    result, out = run_example(script, tmp_path, *args, check=False)
    assert result.returncode == 2 and message in result.stderr, result.stderr[-800:]
    assert "warmup" not in result.stderr.split("error:")[1] and not out.exists()


@pytest.mark.parametrize("value", ["-0.5", "nan", "inf"])
def test_a_negative_or_non_finite_length_penalty_is_refused_by_name(value, tmp_path):
    result, out = run_example("transformer_translation.py", tmp_path, "--length-penalty", value,
                              check=False)
    assert result.returncode == 2, result.stderr[-800:]
    assert ("argument --length-penalty: expected a finite number >= 0, "
            f"got '{value}'") in result.stderr and not out.exists()


def test_the_length_penalty_reaches_every_beam_that_scores(monkeypatch):
    """`score` ranks the test and validation beams with `args.length_penalty`."""
    import argparse

    import numpy as np

    from keras_attn import decoding
    from keras_attn.recipes import translation_eval as common

    seen = []

    def generate(model, ids, max_length, *, sampler):
        seen.append((sampler.num_beams, sampler.length_penalty))
        return np.zeros((len(ids), max_length), "int32")

    class Data:  # what `score` reads of a TranslationData
        test, validation = [("a b", "x y"), ("c", "z")], [("d", "w")]
        target_joiner, target_length = " ", 4

        def encode_source(self, sources, standardize):
            return np.ones((len(sources), 3), "int32")

        def decode(self, tokens):
            return ["x y"] * len(tokens)

        def unknown_rate(self, sources):
            return 0.0

    monkeypatch.setattr(decoding, "generate", generate)
    args = argparse.Namespace(max_test=2, beam_size=3, length_penalty=1.7)
    metrics, rows = common.score(None, Data(), args)
    assert seen == [(3, 1.7), (3, 1.7)]  # the test pairs, then the validation split
    assert metrics["exact_match"] == 0.5 and rows[0] == ("a b", "x y", "x y")


def test_serving_ranks_the_at_beam_as_its_run_did(tmp_path):
    """benchmarks/serve_translate.py: `--length-penalty` in --example-args wins, else the
    run's metrics.json, else (runs from before the option, or no metrics) the old 0.6."""
    serve = examples_module("serve_translate")
    translation_args = examples_module("translation_args")
    at = examples_module("transformer_translation")

    def example_args(*flags):
        return translation_args.parse_args("serve", at.DEFAULTS, ["--data", "pairs.txt",
                                                        "--out", str(tmp_path / "x"), *flags],
                                 at.MODEL_FLAGS)

    run = tmp_path / "run"
    run.mkdir()
    assert serve.at_length_penalty(str(run), example_args()) == 0.6  # no metrics.json
    (run / "metrics.json").write_text(json.dumps({"bleu": 1.0}))
    assert serve.at_length_penalty(str(run), example_args()) == 0.6
    (run / "metrics.json").write_text(json.dumps({"length_penalty": 1.5}))
    assert serve.at_length_penalty(str(run), example_args()) == 1.5
    assert serve.at_length_penalty(str(run), example_args("--length-penalty", "0.9")) == 0.9


def test_serving_speed_is_measured_side_by_side(monkeypatch, capsys):
    """benchmarks/serve_translate.py: every sentence (and every batch of 256) goes to each
    translator in turn, the order reversed each time, so a machine that slows down halfway
    slows all of them alike and the ratios stay those of the translators' own costs."""
    serve = examples_module("serve_translate")
    clock = [0.0]
    monkeypatch.setattr(serve.time, "perf_counter", lambda: clock[0])
    calls = []

    def translator(name: str, cost: float):
        def translate_batch(texts):
            calls.append((name, len(texts)))
            # The machine runs at a third of its speed once 40 calls have been made.
            clock[0] += cost * len(texts) * (3.0 if len(calls) > 40 else 1.0)
            return texts
        return translate_batch

    sources = [f"s{i}" for i in range(600)]
    speeds = serve.side_by_side_speed({"a": translator("a", 1.0), "b": translator("b", 2.0)},
                                      sources, single=30, batches=2)
    singles = [name for name, size in calls if size == 1]
    # A warm-up call each, then pairs in alternating order: a b, b a, a b, ...
    assert singles[:2] == ["a", "b"] and singles[2:6] == ["a", "b", "b", "a"]
    assert [size for _, size in calls].count(1) == 2 + 2 * 30
    assert [size for _, size in calls if size > 1] == [256] * 6  # warm-ups, then 2 batches each
    ratio_1 = speeds["a"]["per_s_batch_1"] / speeds["b"]["per_s_batch_1"]
    ratio_256 = speeds["a"]["per_s_batch_256"] / speeds["b"]["per_s_batch_256"]
    # Timed one after the other, b would have run 22 of its 30 sentences in the slow part.
    assert ratio_1 == pytest.approx(2.0, rel=0.1) and ratio_256 == pytest.approx(2.0, rel=0.1)
    with pytest.raises(SystemExit):
        serve.parse_args(["--single", "0"])
    assert "--single must be at least 1. Received: --single 0" in capsys.readouterr().err


def budget_callback_with_a_clock(monkeypatch, start: float):
    """`keras_attn.recipes.runtime.time_budget_callback` and the clock `[seconds]` its
    `perf_counter` reads (a test moves it)."""
    import time

    from keras_attn.recipes.runtime import time_budget_callback
    clock = [start]
    monkeypatch.setattr(time, "perf_counter", lambda: clock[0])
    return time_budget_callback, clock


def drive_budget_callback(callback, clock: list, step_seconds: dict, default: float = 1.0,
                          pauses: dict | None = None) -> list:
    """Runs a time-budget `callback` on a stand-in model until it stops training: step i takes
    `step_seconds.get(i, default)` seconds of `clock`, and after `pauses`' step counts a
    validation pass of that many seconds runs. Returns the learning rate set for each step."""

    class Model:
        stop_training = False

        class optimizer:
            learning_rate = None

    callback.set_model(Model)
    callback.on_train_begin()
    rates, step = [], 0
    while not Model.stop_training:
        callback.on_train_batch_begin(step)
        rates.append(Model.optimizer.learning_rate)
        clock[0] += step_seconds.get(step, default)
        callback.on_train_batch_end(step)
        step += 1
        if step in (pauses or {}):
            callback.on_test_begin()
            clock[0] += pauses[step]
            callback.on_test_end()
    callback.on_train_end()
    return rates


def test_time_budget_fits_the_schedule_and_stops_training(monkeypatch):
    """The learning rate warms up over the steps, stays at its peak, then decays linearly over
    the last 30% of the training time (validation passes not counted) to 2% at the budget,
    where training stops."""
    time_budget_callback, clock = budget_callback_with_a_clock(monkeypatch, 100.0)

    callback = time_budget_callback(60.0, 1e-3, warmup_steps=4)
    # every step takes 2 s; a validation pass of 50 s after step 10 is not training time
    rates = drive_budget_callback(callback, clock, {}, 2.0, pauses={10: 50.0})
    assert rates[:4] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3])
    assert rates[4:22] == pytest.approx([1e-3] * 18)  # the peak until 42 s of 60
    # then 1e-3 (1 - 0.98 (t - 42) / 18) at the t = 2 * step seconds trained
    assert rates[22:] == pytest.approx([1e-3 * (1 - 0.98 * (2 * i - 42) / 18)
                                        for i in range(22, 30)])
    assert len(rates) == 30 and callback.summary() == {
        "time_budget_s": 60.0, "trained_s": 60.0, "steps": 30, "budget_spent": True,
        "warmup_steps_done": 4, "warmup_s": None, "checkpoints_averaged": 0}


def test_time_budget_averages_the_last_checkpoints(monkeypatch):
    """With `average_checkpoints=4` over the last 15% of 60 s, the weights kept are the mean
    of their values at the first steps past 51, 54 and 57 s and at the end (60 s); the final
    weights stay available for comparison."""
    import keras

    time_budget_callback, clock = budget_callback_with_a_clock(monkeypatch, 0.0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(1e-3))
    callback = time_budget_callback(60.0, 1e-3, warmup_steps=0, average_checkpoints=4,
                                    average_fraction=0.15)
    callback.set_model(model)
    callback.on_train_begin()
    step = 0
    while not model.stop_training:
        callback.on_train_batch_begin(step)
        clock[0] += 2.0  # every step takes 2 s; "training" sets every weight to the time
        for weight in model.trainable_weights:
            weight.assign(keras.ops.full(weight.shape, clock[0]))
        callback.on_train_batch_end(step)
        step += 1
    callback.on_train_end()
    # checkpoints at 52, 54 and 58 s (the first steps past 51, 54, 57) and the end, 60 s
    for weight in model.get_weights():
        assert weight == pytest.approx(keras.ops.full(weight.shape, 56.0))
    assert [float(w.flat[0]) for w in callback.final_weights] == [60.0, 60.0]
    assert callback.summary()["checkpoints_averaged"] == 4
    with pytest.raises(ValueError, match="average_checkpoints"):
        time_budget_callback(60.0, 1e-3, warmup_steps=0, average_checkpoints=0)


def budget_rates(monkeypatch, args, step_seconds: dict) -> tuple[list, dict]:
    """The learning rates `keras_attn.recipes.translation.fit_plan(args)`'s callback sets for
    each step of a run whose step i takes `step_seconds.get(i, 1.0)` seconds, and its summary."""
    _, clock = budget_callback_with_a_clock(monkeypatch, 0.0)
    from keras_attn.recipes.translation import fit_plan

    _, (callback,) = fit_plan(args)
    rates = drive_budget_callback(callback, clock, step_seconds)
    return rates, callback.summary()


def test_time_budget_warms_up_over_a_share_of_its_seconds(monkeypatch):
    """Without --warmup-steps a --time-budget run warms up over the first 5% of the budget's
    seconds, counted from the end of the first step (which traces the training function):
    100 s, a first step of 10 s and steps of 1 s after it -> 0 for the first step, then a
    linear ramp over 5 s (5 steps), the peak until 70 s, the decay to 2% at 100 s."""
    import argparse

    args = argparse.Namespace(time_budget=100.0, learning_rate=1e-3, warmup_steps=300,
                              given=["time_budget"], average_checkpoints=1)
    rates, summary = budget_rates(monkeypatch, args, {0: 10.0})
    assert rates[:7] == pytest.approx([0.0, 0.0, 2e-4, 4e-4, 6e-4, 8e-4, 1e-3])
    assert rates[7:61] == pytest.approx([1e-3] * 54)  # trained 16 ... 69 s
    assert rates[61:] == pytest.approx([1e-3 * (1 - 0.98 * (t - 70) / 30)
                                        for t in range(70, 100)])
    assert summary["steps"] == 91 and summary["warmup_steps_done"] == 6
    assert summary["warmup_s"] == pytest.approx(5.0)
    time_budget_callback, _ = budget_callback_with_a_clock(monkeypatch, 0.0)
    with pytest.raises(ValueError, match=r"warmup_seconds=5\.0, warmup_steps=3"):
        time_budget_callback(100.0, 1e-3, warmup_steps=3, warmup_seconds=5.0)
    with pytest.raises(ValueError, match=r"warmup_seconds=0"):
        time_budget_callback(100.0, 1e-3, warmup_seconds=0)


def test_explicit_warmup_steps_keep_counting_steps_under_a_budget(monkeypatch):
    """`--warmup-steps 4` with `--time-budget 100`: the warm-up is 4 steps, whatever they take."""
    import argparse

    args = argparse.Namespace(time_budget=100.0, learning_rate=1e-3, warmup_steps=4,
                              given=["time_budget", "warmup_steps"], average_checkpoints=1)
    rates, summary = budget_rates(monkeypatch, args, {0: 10.0})
    assert rates[:5] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    assert summary["warmup_steps_done"] == 4 and summary["warmup_s"] is None


def test_warmup_longer_than_the_run_is_refused(tmp_path):
    result, _ = run_example("transformer_translation.py", tmp_path, *SMOKE,
                            "--warmup-steps", "1000", check=False)
    assert result.returncode != 0
    assert "--warmup-steps" in result.stderr and "Received: --warmup-steps 1000" in result.stderr


@pytest.mark.slow
def test_grouped_batches_of_the_shared_english_french_file():
    path = ROOT.parent / "shared" / "data" / "fra-eng.txt"
    if not path.exists():
        pytest.skip(f"{path} is not here (the shared data directory holds it)")
    import numpy as np

    from keras_attn.data.pairs import load_tatoeba

    data = load_tatoeba(str(path), max_length=12, min_freq=2, validation_fraction=0.02, seed=0,
                        verbose=0)

    def padding(dataset):
        positions = real = 0
        for (source, target_in), _ in dataset:
            positions += int(np.prod(source.shape)) + int(np.prod(target_in.shape))
            real += int(np.count_nonzero(source)) + int(np.count_nonzero(target_in))
        return 1 - real / positions

    fixed = padding(data.make_dataset("train", 64))
    grouped_dataset = data.make_dataset("train", 64, shuffle=True, group_by_length=True)
    grouped = padding(grouped_dataset)
    assert fixed > 0.4 and grouped < 0.15, (fixed, grouped)
    assert int(grouped_dataset.cardinality()) == sum(1 for _ in grouped_dataset)
