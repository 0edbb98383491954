"""Fine-tune a pretrained causal language model on a text file with LoRA
(`keras_attn.tasks.CausalLM`): validation perplexity and samples before and after, the merged
model saved as `.keras` and exported as a SavedModel whose `generate` signature takes strings.

CHECKPOINT_DIR is a Hugging Face causal LM directory (Llama, Mistral, Qwen2, GPT-2:
config.json, safetensors weights, tokenizer files), e.g. one downloaded with `huggingface-cli
download Qwen/Qwen2.5-0.5B --local-dir DIR`. Without one the script builds a tiny
Llama-architecture checkpoint offline into OUT/checkpoint (`keras_attn.recipes.
tiny_llama_checkpoint`: a byte-level BPE tokenizer trained on the training text, random weights
from --seed), so it runs from a clone; from random weights the low-rank updates learn the
text's statistics from nothing, so the perplexities are high, but they fall.

The text (--data, The Time Machine at ../shared/data/timemachine.txt from the project root by
default; any plain-text file) is cut into passages of about --passage-chars characters at line
ends; the last --validation-fraction of them validate. Each passage is one training row: the
tokenizer's template, its tokens, the end id, cut at --sequence-length
(`keras_attn.preprocessing.CausalLMPreprocessor`).

Written to --out: `metrics.json` (perplexities, samples, settings), `model.keras` (the merged
model with its tokenizer) and `saved_model/` (served by TensorFlow with tensorflow-text's ops).

    python examples/finetune_lm.py
    python examples/finetune_lm.py path/to/Qwen2.5-0.5B --data book.txt --rank 8 --epochs 1
"""

from __future__ import annotations

import argparse
import json
import math
import os
import time

from example_utils import (
    HelpFormatter,
    check_run_dirs,
    import_tensorflow_quietly,
    number,
    positive,
)

DEFAULT_DATA = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                             os.pardir, os.pardir, "shared", "data",
                                             "timemachine.txt"))
PROMPTS = ("The Time Traveller", "It was")


def _count(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter,
                                     epilog="\n\n".join(__doc__.split("\n\n")[1:4]))
    parser.add_argument("checkpoint", nargs="?", default=None,
                        help="a Hugging Face causal LM directory (default: a tiny Llama built "
                             "offline into OUT/checkpoint)")
    parser.add_argument("--data", default=DEFAULT_DATA, help="a plain-text file")
    parser.add_argument("--out", default="runs/finetune_lm", help="the run's directory")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace an earlier run's files in --out")
    parser.add_argument("--rank", type=_count, default=8, help="LoRA's rank")
    parser.add_argument("--alpha", type=positive, default=None,
                        help="LoRA's scale is alpha / rank (default: rank, a scale of 1)")
    parser.add_argument("--targets", nargs="+", default=None,
                        help="the projections LoRA adapts (default: keras-hub's query and value "
                             "for your checkpoint; query, key, value and the FFN's hidden and gate for the "
                             "built one, whose random weights have everything to learn)")
    parser.add_argument("--epochs", type=_count, default=3)
    parser.add_argument("--batch-size", type=_count, default=8)
    parser.add_argument("--learning-rate", type=positive, default=None,
                        help="AdamW's (default: 1e-2 for the built checkpoint, 2e-4 for yours)")
    parser.add_argument("--sequence-length", type=_count, default=128,
                        help="ids per training row")
    parser.add_argument("--passage-chars", type=_count, default=600,
                        help="characters per passage (cut at line ends)")
    parser.add_argument("--max-passages", type=_count, default=None,
                        help="use only the first N passages (a quick run)")
    parser.add_argument("--validation-fraction", type=number(0, strict=True, maximum=1,
                                                             strict_maximum=True),
                        default=0.1, help="the share of passages, from the end, that validate")
    parser.add_argument("--prompt", action="append", default=None,
                        help=f"a prompt to sample before and after (repeatable; default: "
                             f"{' and '.join(repr(p) for p in PROMPTS)})")
    parser.add_argument("--max-length", type=_count, default=48,
                        help="ids of a sample, prompt included")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default=None,
                        help="the model's dtype (default: the checkpoint's)")
    parser.add_argument("--no-export", action="store_true", help="skip the SavedModel")
    parser.add_argument("--seed", type=int, default=0)
    tiny = parser.add_argument_group("the built checkpoint (without CHECKPOINT_DIR)")
    tiny.add_argument("--tiny-hidden-dim", type=_count, default=64)
    tiny.add_argument("--tiny-layers", type=_count, default=2)
    tiny.add_argument("--tiny-intermediate-dim", type=_count, default=128)
    tiny.add_argument("--tiny-vocabulary-size", type=_count, default=1000)
    args = parser.parse_args(argv)
    if args.max_length < 4:
        parser.error(f"argument --max-length: expected at least 4, got {args.max_length}")
    args.prompt = args.prompt or list(PROMPTS)
    return args


def passages(path: str, size: int) -> list[str]:
    """The file's text as passages of about `size` characters, cut at line ends."""
    with open(path, encoding="utf-8") as file:
        lines = [line.strip() for line in file]
    out, current = [], []
    for line in lines:
        if line:
            current.append(line)
        if current and (not line or sum(map(len, current)) >= size):
            out.append(" ".join(current))
            current = []
    if current:
        out.append(" ".join(current))
    return [text for text in out if len(text) > 20]


def perplexity(lm, texts, batch_size) -> float:
    """exp of the mean next-token cross-entropy over the texts' real tokens."""
    loss = lm.evaluate(texts, batch_size=batch_size, verbose=0, return_dict=True)["loss"]
    return math.exp(loss)


def main(argv=None) -> dict:
    args = parse_args(argv)
    export_dir = None if args.no_export else os.path.join(args.out, "saved_model")
    problem = check_run_dirs(args.out, export_dir, args.overwrite)
    if problem:
        raise SystemExit(problem)
    if not os.path.isfile(args.data):
        raise SystemExit(f"--data: no such file: {args.data}")
    import_tensorflow_quietly()
    import keras

    from keras_attn.recipes.runtime import clear_export_dir, fit_verbosity
    from keras_attn.tasks import CausalLM

    keras.utils.set_random_seed(args.seed)
    texts = passages(args.data, args.passage_chars)[:args.max_passages]
    cut = max(1, round(len(texts) * (1 - args.validation_fraction)))
    train, validation = texts[:cut], texts[cut:] or texts[-1:]
    print(f"{args.data}: {len(train)} training and {len(validation)} validation passages")
    os.makedirs(args.out, exist_ok=True)
    checkpoint = args.checkpoint
    if checkpoint is None:
        from keras_attn.recipes.tiny_checkpoints import tiny_llama_checkpoint

        checkpoint = tiny_llama_checkpoint(
            os.path.join(args.out, "checkpoint"), train, seed=args.seed,
            vocabulary_size=args.tiny_vocabulary_size, hidden_dim=args.tiny_hidden_dim,
            num_layers=args.tiny_layers, intermediate_dim=args.tiny_intermediate_dim,
            max_sequence_length=max(args.sequence_length + 1, args.max_length),
            overwrite=args.overwrite)
    lm = CausalLM.from_pretrained(checkpoint, dtype=args.dtype,
                                  sequence_length=args.sequence_length)
    learning_rate = args.learning_rate or (1e-2 if args.checkpoint is None else 2e-4)
    if args.targets is None:
        args.targets = (["query", "value"] if args.checkpoint is not None else
                        ["query", "key", "value", "hidden", "gate"])
    lm.compile(optimizer=keras.optimizers.AdamW(learning_rate, weight_decay=0.0))
    before = {"perplexity": perplexity(lm, validation, args.batch_size),
              "samples": lm.generate(args.prompt, max_length=args.max_length)}
    print(f"validation perplexity before: {before['perplexity']:.2f}")
    adapted = lm.enable_lora(args.rank, args.targets, args.alpha)
    lm.compile(optimizer=keras.optimizers.AdamW(learning_rate, weight_decay=0.0))
    trainable = sum(int(math.prod(w.shape)) for w in lm.trainable_weights)
    print(f"LoRA rank {args.rank} on {len(adapted)} projections: {trainable:,} trainable of "
          f"{lm.count_params():,} parameters")
    start = time.perf_counter()
    history = lm.fit(train, validation_data=validation, epochs=args.epochs,
                     batch_size=args.batch_size, verbose=fit_verbosity())
    seconds = time.perf_counter() - start
    after = {"perplexity": perplexity(lm, validation, args.batch_size),
             "samples": lm.generate(args.prompt, max_length=args.max_length)}
    print(f"validation perplexity after:  {after['perplexity']:.2f} ({seconds:.0f} s of "
          "training)")
    for prompt, old, new in zip(args.prompt, before["samples"], after["samples"]):
        print(f"  {prompt!r}\n    before: {old!r}\n    after:  {new!r}")
    lm.save(os.path.join(args.out, "model.keras"))  # LoRA merged into the kernels
    metrics = {"checkpoint": os.path.abspath(checkpoint),
               "built_checkpoint": args.checkpoint is None,
               "data": os.path.abspath(args.data),
               "passages": {"train": len(train), "validation": len(validation)},
               "validation_perplexity_before": before["perplexity"],
               "validation_perplexity": after["perplexity"],
               "samples_before": dict(zip(args.prompt, before["samples"])),
               "samples": dict(zip(args.prompt, after["samples"])),
               "lora": {"rank": args.rank, "alpha": args.alpha, "targets": args.targets,
                        "adapted": adapted, "trainable_parameters": trainable},
               "parameters": lm.count_params(), "train_seconds": seconds,
               "history": {key: [float(v) for v in values]
                           for key, values in history.history.items()},
               "settings": {key: value for key, value in vars(args).items()
                            if key not in ("checkpoint", "data", "out")}
               | {"learning_rate": learning_rate}}
    if export_dir is not None:
        clear_export_dir(export_dir)
        lm.export(export_dir, max_length=max(args.max_length, 64))
        metrics["saved_model"] = export_dir
        metrics["served"] = serve(export_dir, args.prompt)
    with open(os.path.join(args.out, "metrics.json"), "w") as file:
        json.dump(metrics, file, indent=2)
    print(f"wrote {args.out}/metrics.json, model.keras"
          + ("" if export_dir is None else " and saved_model/"))
    return metrics


def serve(export_dir: str, prompts) -> dict:
    """The exported `generate` signature's greedy continuations of `prompts` (TensorFlow and
    tensorflow-text alone)."""
    import tensorflow as tf
    import tensorflow_text  # noqa: F401 - registers the tokenizer's ops

    generator = tf.saved_model.load(export_dir).signatures["generate"]
    out = generator(prompt=tf.constant(list(prompts)), max_new_tokens=tf.constant(24),
                    temperature=tf.constant(0.0), top_k=tf.constant(0),
                    top_p=tf.constant(1.0), seed=tf.constant(0))
    served = {p: t.decode("utf-8") for p, t in zip(prompts, out["text"].numpy())}
    print("served by the SavedModel (greedy):")
    for prompt, text in served.items():
        print(f"  {prompt!r} -> {text!r}")
    return served


if __name__ == "__main__":
    main()
