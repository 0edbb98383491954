"""Greedy generation at pretrained sizes: Hugging Face transformers, keras-hub and keras_attn.

Two shapes, random weights (no download): the GPT-2-small shape (12 layers, d 768, 12 heads,
vocab 50,257, learned positions, LayerNorm, GELU, tied embeddings) and a Llama shape (12
layers, d 768, 12 query heads sharing 4 key/value heads, FFN 2,048, vocab 32,000, RoPE,
RMSNorm, SwiGLU, untied). Each contender generates greedily from the same random prompt of 16
tokens exactly 48 new tokens (no early stop), at batch 1 and 8, each point in a fresh
subprocess (so its peak resident memory is its own): one warm-up call (tracing), then
`--rounds` timed calls, median. The contenders:

- `hf`: transformers' `GPT2LMHeadModel` / `LlamaForCausalLM.generate` (torch CPU,
  `torch.set_num_threads(2)`, `inference_mode`);
- `keras_hub`: `GPT2CausalLM` / `LlamaCausalLM.generate` (TensorFlow, `sampler="greedy"`);
- `keras_attn`: a keras_attn model built from the same architecture spec and canonical weights
  `keras_attn.checkpoints` produces (see `keras_attn_generate`, the phase-2 slot: it runs only
  once `keras_attn.checkpoints.build_model` exists).

At batch 1 generation reads every weight once per token, so the table also gives the weight
bytes read per second (weights read per token x tokens per second; the token embedding is
counted once when tied, not at all when untied, since a lookup reads one row) against the
machine's memory bandwidth measured with NumPy in the same run (`np.max` over 1 GiB: reading;
`np.copyto` of 1 GiB: reading + writing, both counted; the best of 1 and `--threads` threads).

    flock /work/heavy.lock python benchmarks/pretrained_generation.py
    python benchmarks/pretrained_generation.py --shapes llama --contenders hf --batch 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

from _common import GIB, cpu_model, median, rss_bytes

CONTENDERS = ("hf", "keras_hub", "keras_attn")
# Hugging Face configs of the two shapes (the keras_attn spec is parsed from these).
CONFIGS = {
    "gpt2": {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 50257,
             "n_positions": 1024, "n_embd": 768, "n_layer": 12, "n_head": 12,
             "activation_function": "gelu_new", "resid_pdrop": 0.0, "embd_pdrop": 0.0,
             "attn_pdrop": 0.0, "bos_token_id": 50256, "eos_token_id": 50256,
             "tie_word_embeddings": True},
    "llama": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 32000,
              "hidden_size": 768, "intermediate_size": 2048, "num_hidden_layers": 12,
              "num_attention_heads": 12, "num_key_value_heads": 4,
              "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
              "bos_token_id": 1, "eos_token_id": 2, "tie_word_embeddings": False},
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--contenders", nargs="+", default=list(CONTENDERS),
                        choices=CONTENDERS)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3, help="timed calls per point")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--worker", nargs=3, metavar=("SHAPE", "CONTENDER", "BATCH"),
                        help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def prompt_ids(shape: str, batch: int, length: int):
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.integers(10, CONFIGS[shape]["vocab_size"], (batch, length)).astype("int32")


def weights_read_per_token(spec, shapes) -> int:
    """Weight elements one decoding step reads: everything but the embedding tables, which are
    looked up a row at a time (the token embedding is read whole for tied logits)."""
    import numpy as np

    tables = {"position_embedding/embeddings", "token_type_embedding/embeddings"}
    if not spec.tie_word_embeddings:
        tables.add("token_embedding/embeddings")
    return sum(int(np.prod(shape)) for key, shape in shapes.items() if key not in tables)


def hf_generate(shape: str, prompt, new_tokens: int, threads: int):
    import torch
    import transformers

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = dict(CONFIGS[shape])
    cls = getattr(transformers, config.pop("architectures")[0])
    config.pop("model_type")
    model = cls(getattr(transformers, cls.__name__.replace("LMHeadModel", "Config").replace(
        "ForCausalLM", "Config"))(**config)).eval()
    ids = torch.tensor(prompt, dtype=torch.long)
    mask = torch.ones_like(ids)

    def generate():
        with torch.inference_mode():
            return model.generate(ids, attention_mask=mask, do_sample=False,
                                  max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                  pad_token_id=config["eos_token_id"])

    return generate, sum(p.numel() * p.element_size() for p in model.parameters())


def keras_hub_generate(shape: str, prompt, new_tokens: int, threads: int):
    import keras_hub
    import numpy as np
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    config = CONFIGS[shape]
    if shape == "gpt2":
        backbone = keras_hub.models.GPT2Backbone(
            vocabulary_size=config["vocab_size"], num_layers=config["n_layer"],
            num_heads=config["n_head"], hidden_dim=config["n_embd"],
            intermediate_dim=4 * config["n_embd"], dropout=0.0,
            max_sequence_length=config["n_positions"])
        model = keras_hub.models.GPT2CausalLM(backbone=backbone, preprocessor=None)
    else:
        backbone = keras_hub.models.LlamaBackbone(
            vocabulary_size=config["vocab_size"], num_layers=config["num_hidden_layers"],
            num_query_heads=config["num_attention_heads"],
            num_key_value_heads=config["num_key_value_heads"],
            hidden_dim=config["hidden_size"], intermediate_dim=config["intermediate_size"],
            layer_norm_epsilon=config["rms_norm_eps"], rope_max_wavelength=config["rope_theta"])
        model = keras_hub.models.LlamaCausalLM(backbone=backbone, preprocessor=None)
    model.compile(sampler="greedy")
    batch, length = prompt.shape
    padded = np.zeros((batch, length + new_tokens), "int32")
    padded[:, :length] = prompt
    inputs = {"token_ids": tf.constant(padded), "padding_mask": tf.constant(padded != 0)}

    def generate():
        return model.generate(inputs, stop_token_ids=None)

    return generate, sum(int(np.prod(v.shape)) * 4 for v in backbone.weights)  # float32


def keras_attn_generate(shape: str, prompt, new_tokens: int, threads: int):
    """The phase-2 slot: keras_attn's model from the spec and canonical weights of the shape
    (random, as for the others), generating greedily with keras_attn.decoding.generate."""
    import numpy as np
    import tensorflow as tf

    import keras_attn as ka
    from keras_attn import checkpoints

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    spec = checkpoints.spec_from_hf_config(CONFIGS[shape])
    rng = np.random.default_rng(0)
    weights = {key: (0.02 * rng.standard_normal(shape)).astype("float32")
               for key, shape in checkpoints.canonical_shapes(spec).items()}
    # ---- PHASE 2: the loader the `models` helper's assembly provides --------------------
    model = checkpoints.build_model(spec, weights)
    total = prompt.shape[1] + new_tokens

    def generate():
        return ka.decoding.generate(model, prompt, total, eos_id=spec.vocab_size + 1)  # no stop
    # --------------------------------------------------------------------------------------

    return generate, sum(array.nbytes for array in weights.values())


def worker(args) -> None:
    """One point in this fresh process: build, warm up, time; print one JSON line."""
    import numpy as np

    from keras_attn import checkpoints

    shape, contender, batch = args.worker[0], args.worker[1], int(args.worker[2])
    prompt = prompt_ids(shape, batch, args.prompt)
    build = {"hf": hf_generate, "keras_hub": keras_hub_generate,
             "keras_attn": keras_attn_generate}[contender]
    start = time.perf_counter()
    generate, weight_bytes = build(shape, prompt, args.new_tokens, args.threads)
    built = time.perf_counter() - start
    start = time.perf_counter()
    out = generate()
    warmup = time.perf_counter() - start
    generated = int(np.shape(out["token_ids"] if isinstance(out, dict) else out)[1])
    times = []
    for _ in range(args.rounds):
        start = time.perf_counter()
        generate()
        times.append(time.perf_counter() - start)
    spec = checkpoints.spec_from_hf_config(CONFIGS[shape])
    read = weights_read_per_token(spec, checkpoints.canonical_shapes(spec)) * 4
    print(json.dumps({
        "shape": shape, "contender": contender, "batch": batch, "seconds": times,
        "tokens_per_second": batch * args.new_tokens / median(times),
        "generated_length": generated, "build_seconds": built, "warmup_seconds": warmup,
        "weight_bytes": weight_bytes, "read_bytes_per_token": read,
        "peak_rss_bytes": rss_bytes(field="VmHWM")}), flush=True)


def bandwidth(threads: int, size_bytes: int = 1 << 30, repeats: int = 5) -> dict[str, float]:
    """NumPy memory bandwidth, the best of 1 and `threads` threads: GB/s reading (`np.max`,
    which does next to no arithmetic per byte) and copying (`np.copyto`, read + write
    counted)."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    source = np.ones(size_bytes // 4, np.float32)
    target = np.empty_like(source)
    pool = ThreadPoolExecutor(threads)
    parts = list(zip(np.array_split(target, threads), np.array_split(source, threads)))

    def best(fn) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    read = min(best(source.max), best(lambda: list(pool.map(lambda p: p[1].max(), parts))))
    copy = min(best(lambda: np.copyto(target, source)),
               best(lambda: list(pool.map(lambda p: np.copyto(*p), parts))))
    pool.shutdown()
    return {"read": size_bytes / read / 1e9, "copy": 2 * size_bytes / copy / 1e9}


def run_point(shape: str, contender: str, batch: int, args) -> dict | None:
    command = [sys.executable, os.path.abspath(__file__), "--worker", shape, contender,
               str(batch), "--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens),
               "--rounds", str(args.rounds), "--threads", str(args.threads)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode or not lines:
        reason = (result.stderr.strip().splitlines() or ["no output"])[-1]
        print(f"<!-- {shape} {contender} batch {batch}: {reason[:200]} -->", flush=True)
        return None
    return json.loads(lines[-1])


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    import numpy as np
    import torch
    import transformers

    from keras_attn import checkpoints

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"# Greedy generation at pretrained sizes ({time.strftime('%Y-%m-%d %H:%M %Z')})")
    print(f"cpu: {cpu_model()} x {os.cpu_count()}, {args.threads} threads each; load avg "
          f"{load}; torch {torch.__version__}, transformers {transformers.__version__}, "
          f"numpy {np.__version__}; prompt {args.prompt} + {args.new_tokens} new tokens, "
          f"{args.rounds} timed calls per point (median), a fresh process per point")
    contenders = list(args.contenders)
    if "keras_attn" in contenders and not hasattr(checkpoints, "build_model"):
        contenders.remove("keras_attn")
        print("keras_attn: not yet measured (keras_attn.checkpoints.build_model, phase 2)")
    memory = bandwidth(args.threads)
    print(f"NumPy memory bandwidth: {memory['read']:.1f} GB/s reading, {memory['copy']:.1f} "
          "GB/s copying (read + write), the best of 1 and "
          f"{args.threads} threads\n")
    print("| shape | batch | contender | tokens/s | peak RSS (GiB) | weights read/token (MB) "
          "| weight GB/s | of NumPy read |")
    print("|---|---|---|---|---|---|---|---|")
    for shape in args.shapes:
        for batch in args.batch:
            rotation = batch % len(contenders)  # who goes first changes from point to point
            for contender in contenders[rotation:] + contenders[:rotation]:
                point = run_point(shape, contender, batch, args)
                if point is None:
                    continue
                read = point["read_bytes_per_token"]
                rate = read * point["tokens_per_second"] / batch / 1e9
                weight_rate = f"{rate:.1f}" if batch == 1 else "-"
                share = f"{rate / memory['read']:.0%}" if batch == 1 else "-"
                print(f"| {shape} | {batch} | {contender} | {point['tokens_per_second']:.1f} | "
                      f"{point['peak_rss_bytes'] / GIB:.2f} | {read / 1e6:.0f} | {weight_rate} "
                      f"| {share} |", flush=True)


if __name__ == "__main__":
    main()
