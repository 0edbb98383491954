"""Generate text with a pretrained checkpoint loaded into keras_attn, and export it.

    python examples/pretrained_generate.py CHECKPOINT_DIR --prompt "The time machine" \\
        [--prompt ...] [--max-new-tokens 48] [--temperature 0] [--top-k 0] [--top-p 1] \\
        [--seed 0] [--dtype float32] [--out runs/pretrained] [--overwrite] [--stream]

CHECKPOINT_DIR is a Hugging Face checkpoint directory (`config.json`, safetensors weights,
tokenizer files) of a Llama, Mistral, Qwen2 or GPT-2 causal LM, e.g. one downloaded with
`huggingface-cli download Qwen/Qwen2.5-0.5B --local-dir checkpoints/qwen2.5-0.5b`. The script
loads it without torch (`keras_attn.checkpoints.from_pretrained`), generates a continuation of
each prompt with the checkpoint's own end and padding ids (greedy at `--temperature 0`, else
seeded sampling with `--top-k` / `--top-p`), prints the text and the tokens per second, and
writes `OUT/saved_model` (a `generate` signature taking strings, the tokenizer inside the graph;
served with TensorFlow and tensorflow-text's ops) and `OUT/metrics.json`. With `--stream` it
then prints each prompt's continuation to the terminal as it is generated
(`CausalLM.generate(..., stream=True)`).
"""

from __future__ import annotations

import argparse
import json
import os
import time

from example_utils import (
    HelpFormatter,
    check_run_dirs,
    import_tensorflow_quietly,
    non_negative,
    number,
)

DTYPES = ("float32", "bfloat16", "float16")


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=HelpFormatter)
    parser.add_argument("checkpoint", help="a Hugging Face checkpoint directory")
    parser.add_argument("--prompt", action="append", default=None,
                        help="a prompt (repeat for a batch) (default: 'The')")
    parser.add_argument("--max-new-tokens", type=int, default=48,
                        help="tokens to generate per prompt")
    parser.add_argument("--temperature", type=non_negative, default=0.0, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=0,
                        help="sample among the k likeliest tokens; 0 = every token")
    parser.add_argument("--top-p", type=number(0, strict=True, maximum=1), default=1.0,
                        help="sample among the likeliest tokens holding this probability; "
                             "1 = every token")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sampling")
    parser.add_argument("--dtype", choices=DTYPES, default=None,
                        help="the model's dtype (default: the checkpoint's)")
    parser.add_argument("--out", default="runs/pretrained_generate",
                        help="directory for metrics.json and saved_model/")
    parser.add_argument("--max-length", type=int, default=None,
                        help="positions of the exported generator: prompt and new tokens "
                             "(default: 2 * --max-new-tokens + 8, at least 64; at most a "
                             "GPT-2's positions)")
    parser.add_argument("--no-export", action="store_true", help="skip the SavedModel")
    parser.add_argument("--stream", action="store_true",
                        help="also print each continuation as it is generated")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results of an earlier run in --out")
    args = parser.parse_args(argv)
    if not os.path.isfile(os.path.join(args.checkpoint, "config.json")):
        parser.error(f"{args.checkpoint} has no config.json: pass a Hugging Face checkpoint "
                     "directory (e.g. from `huggingface-cli download ... --local-dir DIR`)")
    if args.max_new_tokens < 1:
        parser.error(f"--max-new-tokens must be at least 1, got {args.max_new_tokens}")
    if args.top_k < 0 or args.seed < 0:
        parser.error("--top-k and --seed must be >= 0")
    if args.max_length is not None and (args.no_export or args.max_length < 3):
        parser.error("--max-length sets the exported generator's positions: at least 3, and "
                     f"not with --no-export. Received: --max-length {args.max_length}")
    args.prompt = args.prompt or ["The"]
    return args


def export_length(args, spec) -> int:
    """The exported generator's positions: `--max-length`, or its default; refused (exit)
    beyond a checkpoint's learned positions."""
    if args.max_length is None:
        length = max(64, 2 * args.max_new_tokens + 8)
        return min(length, spec.max_sequence_length) if spec.position == "learned" else length
    if spec.position == "learned" and args.max_length > spec.max_sequence_length:
        raise SystemExit(f"--max-length must be at most the checkpoint's {spec.max_sequence_length} "
                         f"learned positions. Received: --max-length {args.max_length}")
    return args.max_length


def generate(model, tokenizer, spec, prompts, args) -> tuple[list[str], float, int]:
    """Continuations of `prompts` (the texts), tokens per second, and the tokens generated."""
    import numpy as np

    from keras_attn import decoding
    from keras_attn.checkpoints import generation_ids

    ids = generation_ids(spec)
    rows = tokenizer.encode(prompts, truncate=False, pad=False).to_list()
    if spec.bos_token_id is not None:  # an empty prompt starts from <bos> (as the export)
        rows = [row or [spec.bos_token_id] for row in rows]
    if not all(rows):
        raise SystemExit("a prompt encoded to no tokens and the checkpoint has no <bos>: "
                         "give some text")
    lengths = np.array([len(row) for row in rows], "int32")
    prompt_ids = np.full((len(rows), lengths.max()), ids["pad_id"], "int32")  # (B, P)
    for i, row in enumerate(rows):
        prompt_ids[i, :len(row)] = row
    max_length = prompt_ids.shape[1] + args.max_new_tokens
    settings = {"max_length": max_length, "max_new_tokens": args.max_new_tokens,
                "prompt_lengths": lengths, "sampler": sampler_of(args), **ids}
    # Warm-up: the same program (one new token), so that the timing leaves out its tracing.
    decoding.generate(model, prompt_ids, **dict(settings, max_new_tokens=1))
    start = time.perf_counter()
    tokens = np.asarray(decoding.generate(model, prompt_ids, **settings))  # (B, L)
    seconds = time.perf_counter() - start
    ends = set(np.atleast_1d(ids["stop_token_ids"] or ()).tolist())
    texts, count = [], 0
    for row, length in zip(tokens, lengths):
        new = []
        for token in row[length:length + args.max_new_tokens]:
            count += 1
            if int(token) in ends:
                break
            new.append(int(token))
        texts.append(tokenizer.decode([new]).numpy()[0].decode("utf-8"))
    return texts, count / seconds, count


def sampler_of(args):
    """`--temperature` 0: greedy; else seeded sampling with `--top-k` and `--top-p`."""
    from keras_attn import decoding

    if args.temperature > 0:
        return decoding.TopP(args.top_p, k=args.top_k, temperature=args.temperature,
                             seed=args.seed)
    return "greedy"


def stream(model, tokenizer, spec, prompts, args) -> list[str]:
    """Print each prompt's continuation as it is generated (`CausalLM.generate(...,
    stream=True)`, one prompt at a time); the continuations."""
    from keras_attn.checkpoints import generation_ids
    from keras_attn.preprocessing import CausalLMPreprocessor, PretrainedTokenizer
    from keras_attn.tasks import CausalLM

    layer = PretrainedTokenizer.from_tokenizer(
        tokenizer, start_token_id=spec.bos_token_id, end_token_ids=tuple(spec.eos_token_ids),
        pad_token_id=generation_ids(spec)["pad_id"])
    lm = CausalLM(model, CausalLMPreprocessor(layer), sampler=sampler_of(args))
    texts = []
    for prompt in prompts:
        length = max(1, len(layer.tokenize([prompt]).to_list()[0]))
        print(f"--- {prompt!r} (streamed)\n{prompt}", end="", flush=True)
        pieces = []
        for piece in lm.generate(prompt, max_length=length + args.max_new_tokens,
                                 max_new_tokens=args.max_new_tokens, strip_prompt=True,
                                 stream=True):
            print(piece, end="", flush=True)
            pieces.append(piece)
        print()
        texts.append("".join(pieces))
    return texts


def main(argv=None) -> dict:
    args = parse_args(argv)
    export_dir = None if args.no_export else os.path.join(args.out, "saved_model")
    problem = check_run_dirs(args.out, export_dir, args.overwrite)
    if problem:
        raise SystemExit(problem)
    import_tensorflow_quietly()
    from keras_attn.checkpoints import from_pretrained
    from keras_attn.recipes.runtime import write_export

    start = time.perf_counter()
    model, tokenizer, spec = from_pretrained(args.checkpoint, dtype=args.dtype)
    if spec.task != "causal_lm":
        raise SystemExit(f"{args.checkpoint} is a {spec.source}, not a causal language model")
    max_length = None if export_dir is None else export_length(args, spec)
    print(f"loaded {spec.source} ({spec.num_layers} layers, d {spec.hidden_dim}, "
          f"{model.count_params():,} parameters, {model.weights[0].dtype}) in "
          f"{time.perf_counter() - start:.1f} s")
    texts, rate, count = generate(model, tokenizer, spec, args.prompt, args)
    for prompt, text in zip(args.prompt, texts):
        print(f"--- {prompt!r}\n{prompt}{text}")
    print(f"{count} tokens in the batch of {len(texts)}: {rate:.1f} tokens per second")
    metrics = {"checkpoint": os.path.abspath(args.checkpoint), "source": spec.source,
               "dtype": str(model.weights[0].dtype), "prompts": args.prompt,
               "texts": texts, "tokens": count, "tokens_per_second": rate,
               "settings": {"max_new_tokens": args.max_new_tokens,
                            "temperature": args.temperature, "top_k": args.top_k,
                            "top_p": args.top_p, "seed": args.seed}}
    if args.stream:
        metrics["streamed_texts"] = stream(model, tokenizer, spec, args.prompt, args)
    os.makedirs(args.out, exist_ok=True)
    if export_dir is not None:
        from keras_attn.export_generator import export_checkpoint_generator

        # The earlier SavedModel is replaced only once the new one is written.
        write_export(export_dir, lambda path: export_checkpoint_generator(
            model, tokenizer, spec, path, max_length))
        metrics["saved_model"] = export_dir
        metrics["export_max_length"] = max_length
        print(f"exported the generate signature (max_length {max_length}) to {export_dir}")
    with open(os.path.join(args.out, "metrics.json"), "w", encoding="utf-8") as file:
        json.dump(metrics, file, ensure_ascii=False, indent=1)
    return metrics


if __name__ == "__main__":
    main()
