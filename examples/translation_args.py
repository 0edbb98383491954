"""The command line of the translation examples: every option, its per-task default, and the
combinations refused before anything runs.

Only argparse: the scripts parse their arguments with it before importing TensorFlow, then
hand them to `keras_attn.recipes.translation.run`. The constants below that the recipe also
uses (`DEFAULT_LENGTH_PENALTY`, `TASK_NAMES` and the time-budget fractions) are copies of
`keras_attn.recipes.translation`'s, for `--help`; a test checks that they agree.
"""

from __future__ import annotations

import argparse
import os

from example_utils import check_run_dirs, non_negative, positive, rate

# The length penalty of keras_attn's beam search, and so of runs written before
# `--length-penalty` existed (their metrics.json has no "length_penalty").
DEFAULT_LENGTH_PENALTY = 0.6

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


def _with_key(defaults: dict, key: str, value) -> dict:
    """`defaults` with `key` set to `value` in the tasks that leave it out."""
    return {task: {key: value, **task_defaults} for task, task_defaults in defaults.items()}


def _default_text(defaults: dict, key: str) -> str:
    """`(default: ...)` for an option whose default depends on the task."""
    values = {task: defaults[task].get(key) for task in defaults}
    if len(set(map(repr, values.values()))) == 1:
        return f"(default: {next(iter(values.values()))})"
    shown = ", ".join(f"{value} for {TASK_NAMES[task]}" for task, value in values.items())
    return f"(default: {shown})"


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

# Options that only mean something for sentence pairs (--data / --download).
PAIRS_ONLY = ("max_length", "min_freq", "tokenizer", "vocab_size")


def parse_args(description: str, defaults: dict, argv=None, model_flags: dict | None = None,
               usage_examples: tuple[str, ...] = (),
               unsupported: dict[str, str] | None = None,
               script_flags: dict | None = None) -> argparse.Namespace:
    """The command line the translation examples accept.

    Args:
        description: first line of `--help`.
        defaults: `{"dates": {...}, "tatoeba": {...}}`, the per-task values of the options
            left unset on the command line (`--help` shows both).
        argv: list of arguments. Defaults to `None` (`sys.argv[1:]`).
        model_flags: `{name: (type, help)}` of the model-size options (`--num-layers`, ...),
            with their defaults in `defaults`.
        usage_examples: command lines shown at the end of `--help`.
        unsupported: `{option name: why}` of shared options a script does not implement: left
            out of `--help` and refused with `why` when given. Defaults to `None`.
        script_flags: `{name: (type, help)}` of a script's own options (decoding, teacher...),
            their defaults in `defaults` (shown unless the help says its default itself).
            Defaults to `None`.

    Returns:
        The parsed arguments, every per-task default filled in, `task` set to "dates" or
        "tatoeba", `model_options` the names of `model_flags`, `given` the names of the
        options set on the command line, and `export_dir` resolved (`OUT/saved_model` unless
        given). Options that contradict each other are refused (`parser.error`, exit 2)
        before anything is made.
    """
    unsupported = unsupported or {}
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
    parser.add_argument("--time-budget", type=positive, default=None, metavar="SECONDS",
                        help="train for this many seconds instead of a number of epochs: "
                             f"warm-up (over the first {100 * WARMUP_FRACTION:.0f}%% of the "
                             "seconds unless --warmup-steps is given), then the peak learning "
                             "rate, then a decay over the last "
                             f"{100 * DECAY_FRACTION:.0f}%% of the time (validation passes not "
                             "counted); training stops when it is spent (default: none, train "
                             "--epochs)")
    parser.add_argument("--batch-size", type=int, default=None,
                        help="training pairs per step " + _default_text(defaults, "batch_size"))
    parser.add_argument("--learning-rate", type=positive, default=None,
                        help="peak Adam learning rate, cosine-decayed over the run "
                             + _default_text(defaults, "learning_rate"))
    for name, (kind, text) in {**(model_flags or {}), **(script_flags or {})}.items():
        shown = text if "(default" in text else f"{text} {_default_text(defaults, name)}"
        parser.add_argument("--" + name.replace("_", "-"), type=kind, default=None, help=shown)
    parser.add_argument("--max-length", type=int, default=None,
                        help="with --data: longest sentence in words; longer pairs are dropped "
                             + _default_text({"tatoeba": defaults["tatoeba"]}, "max_length"))
    parser.add_argument("--tokenizer", choices=("word", "sentencepiece"), default=None,
                        help="with --data: the vocabularies, learned from the training split: "
                             "words, or subword pieces (SentencePiece BPE; names, numbers and "
                             "rare words are spelled in pieces instead of becoming [UNK]; "
                             "serving then needs tensorflow-text) "
                             + _default_text({"tatoeba": defaults["tatoeba"]}, "tokenizer"))
    parser.add_argument("--vocab-size", type=int, default=None,
                        help="with --tokenizer sentencepiece: ids of each side's vocabulary "
                             + _default_text({"tatoeba": defaults["tatoeba"]}, "vocab_size"))
    parser.add_argument("--min-freq", type=int, default=None,
                        help="with --tokenizer word: words seen fewer times become [UNK] "
                             + _default_text({"tatoeba": defaults["tatoeba"]}, "min_freq"))
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    parser.add_argument("--out", default=None,
                        help="directory for everything the run makes: metrics.json, PNGs and "
                             "the SavedModel " + _default_text(defaults, "out"))
    parser.add_argument("--export-dir", default=None,
                        help="SavedModel directory (default: OUT/saved_model)")
    parser.add_argument("--export-format", choices=("tf_saved_model", "onnx"),
                        default="tf_saved_model",
                        help="onnx: also write OUT/onnx (beside the SavedModel's directory): the "
                             "encoder and the one-token decode step for onnxruntime, decoded "
                             "greedily by keras_attn.export_steps and checked against Python "
                             "(default: %(default)s)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results and SavedModel of an earlier run in OUT "
                             "(default: refuse)")
    parser.add_argument("--beam-size", type=int, default=None,
                        help="beam of the scores and the export; 1 = greedy decoding "
                             + _default_text(_with_key(defaults, "beam_size", 1), "beam_size"))
    parser.add_argument("--length-penalty", type=non_negative, default=None, metavar="ALPHA",
                        help="GNMT length-penalty exponent of beam search and of the exported "
                             "scores: hypotheses rank by log P / ((5 + length) / 6) ** ALPHA, "
                             "so a larger ALPHA favours longer translations "
                             + _default_text(_with_key(defaults, "length_penalty",
                                                       DEFAULT_LENGTH_PENALTY), "length_penalty"))
    parser.add_argument("--average-checkpoints", type=int, default=None, metavar="K",
                        help="with --time-budget: the model kept is the mean of the weights at "
                             f"K evenly spaced moments of the last {100 * AVERAGE_FRACTION:.0f}%% "
                             "of the budget, the last at its end; 1 = the final weights "
                             + _default_text(_with_key(defaults, "average_checkpoints", 1),
                                             "average_checkpoints"))
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
    parser.add_argument("--label-smoothing", type=rate, default=None,
                        help="mass of each target token spread over the vocabulary in the loss "
                             + _default_text(defaults, "label_smoothing"))
    parser.add_argument("--warmup-steps", type=int, default=None,
                        help="steps of linear learning-rate warm-up before the cosine decay; "
                             "with --time-budget the default is not a step count but the first "
                             f"{100 * WARMUP_FRACTION:.0f}%% of the budget's seconds (the same "
                             "share of any budget on any machine), and a value given here "
                             "counts steps again "
                             + _default_text(defaults, "warmup_steps").replace(
                                 "(default: ", "(default without --time-budget: "))
    parser.add_argument("--pad-to-max", action="store_true",
                        help="pad every batch (training and validation) to the longest "
                             "sentence allowed instead of batching sentences of equal length "
                             "(slower; for comparison)")
    parser.add_argument("--max-test", type=int, default=2000,
                        help="test pairs to decode for the scores (default: %(default)s)")
    # Testing hook: stop as if killed after this many epochs (the backup survives).
    parser.add_argument("--interrupt-after", type=int, default=None, help=argparse.SUPPRESS)
    for action in parser._actions:
        if action.dest in unsupported:
            action.help = argparse.SUPPRESS
    args = parser.parse_args(argv)
    args.given = [action.dest for action in parser._actions
                  if getattr(args, action.dest, None) not in (None, action.default)]
    for name in args.given:
        if name in unsupported:
            parser.error(unsupported[name])
    task = "dates" if args.data is None and not args.download else "tatoeba"
    filled = _with_key(_with_key(_with_key(defaults, "beam_size", 1), "average_checkpoints", 1),
                       "length_penalty", DEFAULT_LENGTH_PENALTY)
    for key, value in filled[task].items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    args.task = task
    args.model_options = list(model_flags or {})
    args.export_dir = args.export_dir or os.path.join(args.out, "saved_model")
    problem = _contradiction(args) or check_run_dirs(args.out, args.export_dir, args.overwrite)
    if problem:
        parser.error(problem)
    return args


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _contradiction(args) -> str | None:
    """Why the options given cannot run together, or None."""
    if args.epochs is not None and args.epochs < 1:
        return f"--epochs must be at least 1. Received: --epochs {args.epochs}"
    if args.time_budget is not None:
        for name in ("epochs", "resume", "interrupt_after"):
            if name in args.given:
                return (f"{_flag(name)} cannot be combined with --time-budget (the budget sets "
                        "how long training runs, and a resumed run would restart its clock)")
        if args.strategy == "multi_worker":
            return ("--time-budget cannot be combined with --strategy multi_worker: each "
                    "worker's clock would stop it after a different step")
    for name in ("beam_size", "average_checkpoints"):
        if getattr(args, name) < 1:
            return f"{_flag(name)} must be at least 1. Received: {_flag(name)} {getattr(args, name)}"
    if "average_checkpoints" in args.given and args.time_budget is None:
        return ("--average-checkpoints applies to --time-budget runs (it averages the weights "
                "of the budget's last moments)")
    if args.task == "dates":
        for name in PAIRS_ONLY:
            if name in args.given:
                return (f"{_flag(name)} applies to sentence pairs (--data or --download); the "
                        "built-in dates task is tokenized by character")
        return None
    if args.tokenizer == "word" and "vocab_size" in args.given:
        return ("--vocab-size applies to --tokenizer sentencepiece; a word vocabulary keeps "
                "the words seen --min-freq times")
    if args.tokenizer == "sentencepiece" and "min_freq" in args.given:
        return ("--min-freq applies to --tokenizer word; a SentencePiece vocabulary has "
                "--vocab-size ids")
    return None
