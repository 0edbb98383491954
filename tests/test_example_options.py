"""What every example script keeps, checked on all of them: number options refused by name when
they are not finite or out of range, `--help` before TensorFlow is imported (so it is quick),
defaults in `--help`, an earlier run never replaced without `--overwrite`, an earlier
SavedModel replaced only once the new one is written, and one line per epoch in logs."""

import ast
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"

# The scripts and example_utils, beside them, come from `examples/` on the tests' path
# (setup.cfg's `pythonpath`), as when a script runs.
import example_utils

SCRIPTS = ("bahdanau_translation", "char_lm", "nat_translation", "nw_regression",
           "pretrained_generate", "swin_digits", "transformer_translation")
# Every float option of the examples, with values each must refuse.
NOT_FINITE = ("nan", "inf", "-inf")
FLOAT_OPTIONS = [
    *[(script, option, value) for script in ("transformer_translation", "nat_translation")
      for option in ("--learning-rate", "--time-budget", "--dropout")
      for value in (*NOT_FINITE, "-1")],
    ("transformer_translation", "--learning-rate", "0"),
    ("transformer_translation", "--dropout", "1"),
    ("transformer_translation", "--label-smoothing", "nan"),
    ("transformer_translation", "--label-smoothing", "-0.1"),
    ("transformer_translation", "--length-penalty", "inf"),
    ("bahdanau_translation", "--dropout", "nan"),
    ("bahdanau_translation", "--learning-rate", "-1"),
    *[(script, "--learning-rate", value) for script in ("char_lm", "nw_regression",
                                                        "swin_digits")
      for value in (*NOT_FINITE, "-1", "0")],
    *[("pretrained_generate", "--temperature", value) for value in (*NOT_FINITE, "-1")],
    *[("pretrained_generate", "--top-p", value) for value in (*NOT_FINITE, "0", "1.5")],
]


def parse(script: str, argv: list[str], tmp_path) -> None:
    """Parse a script's command line as its `main` does first (nothing runs after it)."""
    module = __import__(script)
    if script.endswith("_translation"):
        module.parse_args(module.__doc__.splitlines()[0], module.DEFAULTS,
                          ["--out", str(tmp_path / "out"), *argv], module.MODEL_FLAGS,
                          script_flags=getattr(module, "SCRIPT_FLAGS", None),
                          unsupported=getattr(module, "UNSUPPORTED", None))
    elif script == "pretrained_generate":
        (tmp_path / "config.json").write_text("{}")
        module.parse_args([str(tmp_path), "--out", str(tmp_path / "out"), *argv])
    else:
        module.parse_args(["--out", str(tmp_path / "out"), *argv])


@pytest.mark.parametrize("script, option, value", FLOAT_OPTIONS)
def test_float_options_out_of_range_are_refused_by_name(script, option, value, tmp_path,
                                                        capsys):
    """`--learning-rate nan` trained to NaN weights and exported a translator answering ''
    with score nan; `--learning-rate -1`, `--time-budget inf` (100,000 epochs) ran too."""
    with pytest.raises(SystemExit) as refused:
        parse(script, [f"{option}={value}"], tmp_path)
    assert refused.value.code == 2
    error = capsys.readouterr().err
    assert f"argument {option}: expected a finite number" in error, error
    assert repr(value) in error and not (tmp_path / "out").exists()


def test_number_options_take_what_is_in_range():
    assert example_utils.positive("3e-3") == 0.003
    assert example_utils.rate("0") == 0.0 and example_utils.non_negative("0") == 0.0
    top_p = example_utils.number(0, strict=True, maximum=1)
    assert top_p("1") == 1.0
    for parse_number, text in ((example_utils.rate, "1"), (top_p, "0"),
                               (example_utils.positive, "0"), (example_utils.positive, "x")):
        with pytest.raises(Exception, match="expected a finite number"):
            parse_number(text)


BLOCKED = """
import runpy, sys
for name in ("tensorflow", "keras", "jax", "torch"):
    sys.modules[name] = None  # importing any of them now raises ImportError
sys.argv = [sys.argv[1], "--help"]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("script", SCRIPTS)
def test_help_answers_before_tensorflow_is_imported(script):
    """`nw_regression.py --help` and `swin_digits.py --help` took 17-19 s: they imported
    TensorFlow before parsing. Every script answers `--help` with TensorFlow, Keras, JAX and
    torch unimportable. (`runpy.run_path` does not put the script's folder on the path as
    `python SCRIPT` does: PYTHONPATH gives it.)"""
    result = subprocess.run(
        [sys.executable, "-c", BLOCKED, str(EXAMPLES / f"{script}.py")],
        capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join([str(EXAMPLES), str(ROOT)])})
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage:")


@pytest.mark.parametrize("script, count", [("char_lm", 14), ("pretrained_generate", 8)])
def test_help_shows_every_default(script, count, capsys):
    """`pretrained_generate.py --help` showed no defaults. `count`: the options that take a
    value (`--epochs EPOCHS ...`; one with choices shows them instead)."""
    with pytest.raises(SystemExit):
        __import__(script).parse_args(["--help"])
    text = capsys.readouterr().out
    options = [block for block in text.split("\n  -")[1:] if block.startswith("-")]
    valued = [block for block in options if block.split()[0].lstrip("-").upper().replace(
        "-", "_") in block.split()[1:2]]
    assert len(valued) == count, valued
    missing = [block.split()[0] for block in valued if "(default:" not in " ".join(
        block.split())]
    assert not missing, missing
    assert "(default: None)" not in text
    if script == "pretrained_generate":
        assert "(default: 48)" in text and "(default: the checkpoint's)" in text  # --dtype


def test_nw_regression_refuses_to_replace_an_earlier_run(tmp_path):
    """It wrote over an earlier run's metrics.json and figures without a word."""
    import nw_regression

    (tmp_path / "metrics.json").write_text('{"earlier": true}')
    with pytest.raises(SystemExit) as refused:
        nw_regression.parse_args(["--out", str(tmp_path)])
    assert refused.value.code == 2
    assert (tmp_path / "metrics.json").read_text() == '{"earlier": true}'
    assert nw_regression.parse_args(["--out", str(tmp_path), "--overwrite"]).overwrite


def test_fit_prints_a_line_per_epoch_unless_stdout_is_a_terminal(monkeypatch):
    from keras_attn.recipes.runtime import fit_verbosity

    class Stream:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

    monkeypatch.setattr(sys, "stdout", Stream(False))
    assert fit_verbosity() == 2  # a log file: one line per epoch
    monkeypatch.setattr(sys, "stdout", Stream(True))
    assert fit_verbosity() == 1  # a terminal: the progress bar


def test_every_example_fit_asks_fit_verbosity():
    """The progress bar filled redirected logs with 427 KB of control characters: every
    `fit` of the examples (and of the translation recipe they share) takes
    `verbose=fit_verbosity()`."""
    calls = []
    for path in sorted([*EXAMPLES.glob("*.py"), *(ROOT / "keras_attn" / "recipes").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "fit":
                verbose = [k.value for k in node.keywords if k.arg == "verbose"]
                calls.append((path.name, ast.unparse(verbose[0]) if verbose else None))
    assert {name for name, _ in calls} >= {"char_lm.py", "nat_translation.py",
                                           "nw_regression.py", "swin_digits.py",
                                           "translation.py"}
    assert all(verbose == "fit_verbosity()" for _, verbose in calls), calls


def saved_model(path: pathlib.Path, content: bytes) -> pathlib.Path:
    path.mkdir(parents=True)
    (path / "saved_model.pb").write_bytes(content)
    (path / "variables").mkdir()
    (path / "variables" / "variables.index").write_bytes(content)
    return path


def test_an_export_that_fails_leaves_the_earlier_saved_model(tmp_path):
    """`--overwrite` deleted the earlier SavedModel before exporting; an export that then
    failed (a bad --max-length) left nothing."""
    from keras_attn.recipes.runtime import write_export

    export_dir = saved_model(tmp_path / "saved_model", b"earlier")

    def failing(path):
        (pathlib.Path(path) / "saved_model.pb").write_bytes(b"half")
        raise ValueError("Argument `max_length` must leave room ...")

    with pytest.raises(ValueError, match="max_length"):
        write_export(str(export_dir), failing)
    assert sorted(os.listdir(tmp_path)) == ["saved_model"]  # no staging directory left
    assert (export_dir / "saved_model.pb").read_bytes() == b"earlier"
    assert (export_dir / "variables" / "variables.index").read_bytes() == b"earlier"

    def writing(path):
        (pathlib.Path(path) / "saved_model.pb").write_bytes(b"new")

    write_export(str(export_dir), writing)
    assert sorted(os.listdir(tmp_path)) == ["saved_model"]
    assert sorted(os.listdir(export_dir)) == ["saved_model.pb"]  # nothing stale kept
    assert (export_dir / "saved_model.pb").read_bytes() == b"new"
    fresh = tmp_path / "run" / "saved_model"  # a first export: the directories are made
    write_export(str(fresh), writing)
    assert (fresh / "saved_model.pb").read_bytes() == b"new"
