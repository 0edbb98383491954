"""What strings cost: `CausalLM.generate` on strings against the same call on token ids.

The strings path tokenizes the prompts (the checkpoint's byte-level BPE, TensorFlow ops),
decodes, and detokenizes the continuations; the ids path is given the prompts already
tokenized (`generate_preprocess` run once, outside the timing) and returns ids. Both decode the
same prompts greedily to the same `--max-length`, alternating in one process; the ratio of the medians is the cost of strings in and out.

The model is a small Llama-architecture checkpoint with random weights built offline
(`keras_attn.recipes.tiny_llama_checkpoint`); with `--checkpoint DIR` any checkpoint the
loader reads.

    python benchmarks/task_overhead.py
"""

from __future__ import annotations

import argparse
import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from _common import header, median, time_alternating


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", default=None, help="a checkpoint directory (default: "
                        "a tiny Llama built offline)")
    parser.add_argument("--hidden-dim", type=int, default=64, help="the built checkpoint's width")
    parser.add_argument("--num-layers", type=int, default=2, help="the built checkpoint's layers")
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=9)
    args = parser.parse_args()

    import numpy as np

    from keras_attn.recipes import tiny_llama_checkpoint
    from keras_attn.tasks import CausalLM

    header("CausalLM.generate: strings against token ids")
    text = ("The Time Traveller (for so it will be convenient to speak of him) was expounding "
            "a recondite matter to us. His grey eyes shone and twinkled, and his usually pale "
            "face was flushed and animated.")
    checkpoint = args.checkpoint or tiny_llama_checkpoint(
        os.path.join(tempfile.mkdtemp(), "tiny-llama"),
        [text[i:i + 64] for i in range(0, len(text) - 64, 3)], hidden_dim=args.hidden_dim,
        num_layers=args.num_layers, intermediate_dim=4 * args.hidden_dim,
        max_sequence_length=max(256, args.max_length))
    lm = CausalLM.from_pretrained(checkpoint, dtype="float32")
    prompts = ["The Time Traveller", "His grey eyes", "a recondite matter", "and animated"]
    prompts = (prompts * args.batch_size)[:args.batch_size]
    new = args.max_length
    packed = lm.preprocessor.generate_preprocess(prompts, args.max_length, new)
    token_array = packed["token_ids"].numpy()  # (B, P), right-padded
    ids = {"token_ids": token_array, "padding_mask": np.arange(token_array.shape[1])[None]
           < packed["lengths"].numpy()[:, None]}

    def strings():
        return lm.generate(prompts, max_length=args.max_length)

    def token_ids():
        return lm.generate(ids, max_length=args.max_length)

    texts = strings()
    print(f"{len(prompts)} prompts, max_length {args.max_length}, width {args.hidden_dim}, "
          f"{args.num_layers} layers: {texts[0]!r:.80}")
    times = time_alternating({"strings": strings, "ids": token_ids}, args.rounds)
    ratios = sorted(s / i for s, i in zip(times["strings"], times["ids"]))
    print("| path | median ms |\n|---|---|")
    for name in ("ids", "strings"):
        print(f"| {name} | {1000 * median(times[name]):.1f} |")
    print(f"strings / ids: {median(times['strings']) / median(times['ids']):.3f} "
          f"(per-round ratios {ratios[len(ratios) // 4]:.3f}-{ratios[3 * len(ratios) // 4]:.3f}"
          f", {args.rounds} rounds)")


if __name__ == "__main__":
    main()
