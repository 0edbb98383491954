"""Greedy generation at pretrained sizes: keras_attn, keras-hub and Hugging Face transformers.

Two shapes, random weights (no download): the GPT-2-small shape (12 layers, d 768, 12 heads,
FFN 3,072, vocab 50,257, learned positions, LayerNorm, tanh GELU, tied embeddings) and a Llama
shape (12 layers, d 768, 12 query heads sharing 4 key/value heads, FFN 2,048, vocab 32,000,
RoPE, RMSNorm, SwiGLU, untied). Every configuration generates greedily from the same random
prompt of 16 tokens exactly 48 new tokens (no end token), at batch 1 and 8, each in a fresh
subprocess (so its peak resident memory, VmHWM, is its own): one warm-up call (tracing,
compilation), then `--rounds` timed calls, median. The configurations:

- `hf`: transformers' `GPT2LMHeadModel` / `LlamaForCausalLM.generate(do_sample=False,
  min_new_tokens=max_new_tokens=48)` (torch CPU, `torch.set_num_threads(--threads)`,
  `inference_mode`), float32, with `OMP_WAIT_POLICY=PASSIVE` (unless set): on a shared,
  loaded machine OpenMP's spinning threads made torch 20x slower (8 Llama tokens: 10 s
  spinning, 0.5 s passive);
- `keras-hub`: `GPT2CausalLM` / `LlamaCausalLM.generate` (`sampler="greedy"`, no stop token),
  float32, on the Keras backend of the row, compiled as `compile(sampler="greedy")` leaves it
  (on TensorFlow its `jit_compile` resolves to False here: a `tf.function` without XLA);
  `keras-hub float32-xla`: the same with `compile(..., jit_compile=True)` (TensorFlow);
- `keras_attn <variant>`: `keras_attn.checkpoints.build_model` of the same architecture with
  random canonical weights (NumPy, seeded: every variant has the same weights), generating with
  `keras_attn.decoding.generate(stop_token_ids=None)`; `float32`, `bfloat16`
  (`dtype="bfloat16"`: the weights and the arithmetic) and `int8` (`model.quantize("int8")`,
  Keras' int8 path), and with `-xla` `generate(jit_compile=True)`. On the JAX backend
  `generate` is always compiled. int8 without XLA on TensorFlow and int8 on JAX run only when
  named (`--only int8`).

Agreement with float32 (the issue's goal: "greedy tokens agreeing with float32 on at least 99%
of positions"), measured against keras_attn float32 on the same backend and batch:
- `free`: the share of the 48 generated positions where the variant's own greedy sequence
  equals float32's (after a first difference the two continue from different prefixes, so
  the rest usually differs: this is the goal's measure, and the harshest);
- `first diff`: the first differing position of each row (of 48; `-` when none);
- `forced`: the share of positions where the variant, fed float32's sequence, picks float32's
  token (each step's decision on the same prefix);
- `f32 margin`: float32's top-1 minus top-2 logit at the positions where the variant decides
  otherwise on the same prefix (the first divergence is one), against the median margin over
  all positions: a difference at a margin far below the median is a near-tie that random
  weights make common (logits of random weights are flat).

At batch 1 a decoding step reads every weight once, so the table gives the bytes of weights
read per token (the variables as stored, in their dtype; the embedding tables that are only
looked up row by row are not counted, the token table is when the logits reuse it) times
tokens per second, against the machine's memory bandwidth measured with NumPy in the same run
(`np.max` over 1 GiB: reading; the best of 1 and `--threads` threads). `--probe` also measures
one `(1, 768) x (768, 65,536)` matrix-vector product through a Keras `Dense` layer in float32,
bfloat16 and int8 (TensorFlow with and without XLA, JAX) and torch: the weight bytes each path
reads per second, i.e. whether its bfloat16 / int8 weights make the step read fewer bytes.

    flock /work/heavy.lock python benchmarks/pretrained_generation.py --probe
    python benchmarks/pretrained_generation.py --shapes llama --batch 1 --only hf keras-hub
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from _common import GIB, cpu_model, median, rss_bytes

# Hugging Face configs of the two shapes (keras_attn's spec is parsed from these).
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
VARIANTS = ("float32", "float32-xla", "bfloat16", "bfloat16-xla", "int8", "int8-xla")
# (backend, contender, variant) in the order of the table.
CONFIGURATIONS = (
    [("torch", "hf", "float32"), ("tensorflow", "keras-hub", "float32"),
     ("tensorflow", "keras-hub", "float32-xla")]
    + [("tensorflow", "keras_attn", v) for v in VARIANTS]
    + [("jax", "keras-hub", "float32")]
    + [("jax", "keras_attn", v) for v in ("float32", "bfloat16", "int8")])
# Run only when named with --only: TensorFlow's int8 without XLA (Keras' int8 x int8 matmul,
# about half float32's rate in earlier runs) and int8 on JAX (the probe: 7.7x float32's time).
NOT_BY_DEFAULT = {("tensorflow", "keras_attn", "int8"), ("jax", "keras_attn", "int8")}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--prompt", type=int, default=16, help="prompt tokens")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=3, help="timed calls per configuration")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--backends", nargs="+", default=["torch", "tensorflow", "jax"],
                        choices=["torch", "tensorflow", "jax"])
    parser.add_argument("--only", nargs="+", default=None, metavar="NAME",
                        help="configurations by name: hf, keras-hub, float32, int8-xla, ...")
    parser.add_argument("--probe", action="store_true",
                        help="also the matrix-vector product probe (module docstring)")
    parser.add_argument("--worker", nargs=4, help=argparse.SUPPRESS,
                        metavar=("SHAPE", "BACKEND", "CONTENDER", "VARIANT"))
    parser.add_argument("--reference", help=argparse.SUPPRESS)  # float32's tokens (JSON)
    parser.add_argument("--probe-worker", help=argparse.SUPPRESS)  # a backend
    return parser.parse_args(argv)


def prompt_ids(shape: str, batch: int, length: int):
    import numpy as np

    rng = np.random.default_rng(0)
    return rng.integers(10, CONFIGS[shape]["vocab_size"], (batch, length)).astype("int32")


def set_threads(backend: str, threads: int) -> None:
    if backend == "tensorflow":
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    elif backend == "torch":
        import torch

        torch.set_num_threads(threads)


def hf_model(shape: str):
    import torch
    import transformers

    torch.manual_seed(0)
    config = dict(CONFIGS[shape])
    cls = getattr(transformers, config.pop("architectures")[0])
    config.pop("model_type")
    config_cls = getattr(transformers, cls.__name__.replace("LMHeadModel", "Config").replace(
        "ForCausalLM", "Config"))
    return cls(config_cls(**config)).eval()


def hf_generate(shape: str, new_tokens: int):
    import torch

    model = hf_model(shape)

    def generate(prompt):
        ids = torch.tensor(prompt, dtype=torch.long)
        with torch.inference_mode():  # exactly `new_tokens`: no end token can stop it early
            return model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                  max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                                  pad_token_id=CONFIGS[shape]["eos_token_id"]).numpy()

    tables = {"transformer.wpe.weight"} | (
        set() if CONFIGS[shape]["tie_word_embeddings"] else {"model.embed_tokens.weight"})
    read = sum(p.numel() * p.element_size() for name, p in model.named_parameters()
               if name not in tables)
    return generate, read, None


def keras_hub_generate(shape: str, new_tokens: int, xla: bool = False):
    import keras
    import keras_hub
    import numpy as np

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
    model.compile(sampler="greedy", jit_compile=xla)

    def generate(prompt):
        batch, length = prompt.shape
        padded = np.zeros((batch, length + new_tokens), "int32")
        padded[:, :length] = prompt
        inputs = {"token_ids": padded,
                  "padding_mask": np.arange(length + new_tokens)[None, :] < length}
        inputs["padding_mask"] = np.repeat(inputs["padding_mask"], batch, axis=0)
        return keras.ops.convert_to_numpy(model.generate(inputs, stop_token_ids=None)[
            "token_ids"])

    tied = config["tie_word_embeddings"]
    read = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in backbone.weights
               if "position_embedding" not in v.path
               and (tied or "token_embedding/embeddings" not in v.path))
    return generate, read, None


def random_weights(spec) -> dict:
    """Canonical weights as a checkpoint's random initialisation: normal(0, 0.02) matrices,
    unit norm scales, zero biases (seeded: the same in every process)."""
    import numpy as np

    from keras_attn import checkpoints

    rng = np.random.default_rng(0)
    weights = {}
    for key, shape in checkpoints.canonical_shapes(spec).items():
        if key.endswith("scale"):
            weights[key] = np.ones(shape, "float32")
        elif key.endswith("bias"):
            weights[key] = np.zeros(shape, "float32")
        else:
            weights[key] = (0.02 * rng.standard_normal(shape)).astype("float32")
    return weights


def keras_attn_model(shape: str, variant: str):
    import warnings

    from keras_attn import checkpoints

    spec = checkpoints.spec_from_hf_config(CONFIGS[shape])
    dtype = "bfloat16" if variant.startswith("bfloat16") else "float32"
    model = checkpoints.build_model(spec, random_weights(spec), dtype=dtype)
    if variant.startswith("int8"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model.quantize("int8")
    return model


def keras_attn_generate(shape: str, new_tokens: int, variant: str):
    import keras
    import numpy as np

    import keras_attn as ka

    model = keras_attn_model(shape, variant)
    xla = variant.endswith("-xla")

    def generate(prompt):  # the model has no padding id: every prompt position is a token
        return keras.ops.convert_to_numpy(ka.decoding.generate(
            model, prompt, prompt.shape[1] + new_tokens, stop_token_ids=None,
            jit_compile=xla))

    tied = CONFIGS[shape]["tie_word_embeddings"]
    read = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize for v in model.weights
               if "position_embedding" not in v.path
               and (tied or "token_embedding" not in v.path))

    def logits(tokens):  # (B, T) -> float32 (B, T, V), one full pass
        return keras.ops.convert_to_numpy(keras.ops.cast(
            model.predict({"token_ids": tokens, "padding_mask": np.ones_like(tokens, bool)},
                          verbose=0, batch_size=len(tokens)), "float32"))

    return generate, read, logits


def worker(args) -> None:
    """One configuration in this fresh process: build, then for each batch size (smallest
    first) warm up and time; one JSON line per batch size. The peak resident memory of a batch
    size is the process's peak after it (the larger batch's includes the smaller's)."""
    import numpy as np

    shape, backend, contender, variant = args.worker
    set_threads(backend, args.threads)
    start = time.perf_counter()
    if contender == "hf":
        generate, read, logits = hf_generate(shape, args.new_tokens)
    elif contender == "keras-hub":
        generate, read, logits = keras_hub_generate(shape, args.new_tokens,
                                                    variant.endswith("-xla"))
    else:
        generate, read, logits = keras_attn_generate(shape, args.new_tokens, variant)
    built = time.perf_counter() - start
    references = {}
    if args.reference:
        with open(args.reference) as f:
            references = json.load(f)
    for batch in sorted(args.batch):
        prompt = prompt_ids(shape, batch, args.prompt)
        start = time.perf_counter()
        tokens = np.asarray(generate(prompt))
        warmup = time.perf_counter() - start
        times = []
        for _ in range(args.rounds):
            start = time.perf_counter()
            generate(prompt)
            times.append(time.perf_counter() - start)
        result = {
            "batch": batch, "seconds": times,
            "tokens_per_second": batch * args.new_tokens / median(times),
            "generated": int(tokens.shape[1] - args.prompt), "build_seconds": built,
            "warmup_seconds": warmup, "read_bytes_per_token": read,
            "peak_rss_bytes": rss_bytes(field="VmHWM"), "tokens": tokens.tolist(),
            "prompt_kept": bool(np.array_equal(tokens[:, :args.prompt], prompt))}
        if logits is not None:
            # Decisions on float32's sequence (its own for float32): argmax, top-1 - top-2.
            reference = np.array(references.get(str(batch), tokens))
            scores = logits(reference[:, :-1])[:, args.prompt - 1:]  # (B, new, V)
            top2 = np.sort(scores, axis=-1)[..., -2:]
            result["forced_choice"] = scores.argmax(-1).tolist()
            result["margin"] = (top2[..., 1] - top2[..., 0]).tolist()
        print(json.dumps(result), flush=True)


def probe_worker(backend: str, threads: int, width: int = 65536, repeats: int = 30) -> None:
    """Seconds of one `(1, 768) x (768, width)` product through Keras' `Dense` per weight
    dtype (torch: `torch.matmul`); one JSON line `{name: [seconds, weight bytes]}`."""
    import warnings

    import numpy as np

    set_threads(backend, threads)
    rng = np.random.default_rng(0)
    kernel = (0.02 * rng.standard_normal((768, width))).astype("float32")
    x = rng.standard_normal((1, 768)).astype("float32")
    fns = {}
    if backend == "torch":
        import torch

        for dtype in ("float32", "bfloat16"):
            w = torch.tensor(kernel).to(getattr(torch, dtype))
            xt = torch.tensor(x).to(getattr(torch, dtype))
            fns[f"torch {dtype}"] = ((lambda w=w, xt=xt: torch.matmul(xt, w).float()),
                                     w.numel() * w.element_size())
    else:
        import keras

        for dtype in ("float32", "bfloat16", "int8"):
            layer = keras.layers.Dense(width, use_bias=False,
                                       dtype="bfloat16" if dtype == "bfloat16" else "float32")
            layer.build((1, 768))
            layer.kernel.assign(kernel)
            if dtype == "int8":
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    layer.quantize("int8")
            read = sum(int(np.prod(v.shape)) * np.dtype(v.dtype).itemsize
                       for v in layer.weights)
            xs = keras.ops.convert_to_tensor(x, layer.compute_dtype)
            xla_options = (False, True) if backend == "tensorflow" else (True,)
            for xla in xla_options:
                if backend == "tensorflow":
                    import tensorflow as tf

                    fn = tf.function(lambda layer=layer, xs=xs: layer(xs), jit_compile=xla)
                else:
                    import jax

                    fn = jax.jit(lambda t, n, xs, layer=layer: layer.stateless_call(t, n, xs)[0])
                    fn = (lambda fn=fn, layer=layer, xs=xs: fn(
                        [v.value for v in layer.trainable_variables],
                        [v.value for v in layer.non_trainable_variables], xs))
                name = f"{backend} {dtype}{' xla' if xla and backend == 'tensorflow' else ''}"
                fns[name] = (fn, read)
    if backend == "tensorflow":
        fns["numpy float32"] = ((lambda: x @ kernel), kernel.nbytes)
    result = {}
    for name, (fn, read) in fns.items():
        for _ in range(3):
            np.asarray(fn())
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            np.asarray(fn())
            times.append(time.perf_counter() - start)
        result[name] = [median(times), read]
    print(json.dumps(result), flush=True)


def bandwidth(threads: int, size_bytes: int = 1 << 30, repeats: int = 5) -> float:
    """NumPy's GB/s reading 1 GiB (`np.max`, next to no arithmetic per byte), the best of 1 and
    `threads` threads."""
    from concurrent.futures import ThreadPoolExecutor

    import numpy as np

    source = np.ones(size_bytes // 4, np.float32)
    parts = np.array_split(source, threads)

    def best(fn) -> float:
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    with ThreadPoolExecutor(threads) as pool:
        read = min(best(source.max), best(lambda: list(pool.map(np.max, parts))))
    return size_bytes / read / 1e9


def run(command: list[str], backend: str) -> list[dict] | str:
    """A worker's JSON lines, or the reason it gave none."""
    env = dict(os.environ, KERAS_BACKEND=backend if backend != "torch" else "tensorflow",
               TF_CPP_MIN_LOG_LEVEL="3")
    if backend == "torch":  # OpenMP threads that sleep when idle, not spin (module docstring)
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    result = subprocess.run([sys.executable, os.path.abspath(__file__)] + command,
                            capture_output=True, text=True, check=False, env=env)
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if result.returncode or not lines:
        return (result.stderr.strip().splitlines() or ["no output"])[-1][:200]
    return [json.loads(line) for line in lines]


def agreement(point: dict, reference: dict, new_tokens: int) -> dict:
    """The agreement columns (module docstring) of a variant against float32."""
    import numpy as np

    got = np.array(point["tokens"])[:, -new_tokens:]
    want = np.array(reference["tokens"])[:, -new_tokens:]
    differs = got != want
    first = [int(np.argmax(row)) if row.any() else None for row in differs]
    forced = np.array(point["forced_choice"]) == want
    margin = np.array(reference["margin"])
    return {"free": 1 - differs.mean(), "first": first, "forced": forced.mean(),
            "margins": margin[~forced].tolist(), "median_margin": float(np.median(margin))}


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker:
        worker(args)
        return
    if args.probe_worker:
        probe_worker(args.probe_worker, args.threads)
        return
    import keras
    import keras_hub
    import numpy as np
    import tensorflow as tf
    import torch
    import transformers

    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"# Greedy generation at pretrained sizes ({time.strftime('%Y-%m-%d %H:%M %Z')})")
    print(f"cpu: {cpu_model()} x {os.cpu_count()}, {args.threads} threads each; load avg "
          f"{load}; tensorflow {tf.__version__}, keras {keras.__version__}, keras-hub "
          f"{keras_hub.__version__}, torch {torch.__version__}, transformers "
          f"{transformers.__version__}, numpy {np.__version__}; prompt {args.prompt} + "
          f"{args.new_tokens} new tokens, greedy; a warm-up call, then the median of "
          f"{args.rounds} calls, a fresh process per configuration")
    memory = bandwidth(args.threads)
    print(f"NumPy memory bandwidth: {memory:.1f} GB/s reading (the best of 1 and "
          f"{args.threads} threads)\n")
    if args.probe:
        print("| probe (1, 768) x (768, 65536) | ms | weight MB | weight GB/s | / float32 time |")
        print("|---|---|---|---|---|")
        for backend in ("tensorflow", "jax", "torch"):
            if backend not in args.backends:
                continue
            result = run(["--probe-worker", backend, "--threads", str(args.threads)], backend)
            if isinstance(result, str):
                print(f"| {backend} | failed: {result} | | | |")
                continue
            result = result[0]
            base = result.get(f"{backend} float32", [None])[0]
            for name, (seconds, read) in result.items():
                ratio = f"{base / seconds:.2f}" if base else "-"
                print(f"| {name} | {seconds * 1e3:.2f} | {read / 1e6:.0f} | "
                      f"{read / seconds / 1e9:.1f} | {ratio} |", flush=True)
        print(f"load avg after the probe: {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| shape | batch | backend | contender | tokens/s | / keras-hub | / hf | peak RSS "
          "GiB | weights MB/token | weight GB/s (of NumPy read) | free | first diff | forced "
          "| f32 margin where forced differs (median over all) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    configurations = [c for c in CONFIGURATIONS if c[0] in args.backends and (
        c[1] in args.only or c[2] in args.only if args.only else c not in NOT_BY_DEFAULT)]
    common = ["--prompt", str(args.prompt), "--new-tokens", str(args.new_tokens),
              "--rounds", str(args.rounds), "--threads", str(args.threads), "--batch"]
    common += [str(b) for b in args.batch]
    with tempfile.TemporaryDirectory() as scratch:
        for shape in args.shapes:
            rates, references = {}, {}
            for backend, contender, variant in configurations:
                command = ["--worker", shape, backend, contender, variant]
                reference = references.get(backend)
                if reference is not None and contender == "keras_attn":
                    path = os.path.join(scratch, f"{shape}_{backend}.json")
                    with open(path, "w") as f:
                        json.dump({b: p["tokens"] for b, p in reference.items()}, f)
                    command += ["--reference", path]
                points = run(command + common, backend)
                name = row_name(contender, variant)
                if isinstance(points, str):
                    print(f"| {shape} | | {backend} | {name} | failed: {points} |||||||||",
                          flush=True)
                    continue
                if (contender, variant) == ("keras_attn", "float32"):
                    references[backend] = {p["batch"]: p for p in points}
                for point in points:
                    print_row(shape, backend, contender, variant, point, rates, reference,
                              memory, args.new_tokens)
            print(f"<!-- {shape} done, load avg "
                  f"{' '.join(f'{x:.2f}' for x in os.getloadavg())} -->", flush=True)


def row_name(contender: str, variant: str) -> str:
    """The table's name of a configuration: the contender, with its variant unless float32 of
    hf or keras-hub."""
    plain = contender != "keras_attn" and variant == "float32"
    return contender if plain else f"{contender} {variant}"


def print_row(shape, backend, contender, variant, point, rates, reference, memory,
              new_tokens) -> None:
    """One table row (ratios to the rows of the same batch measured before it)."""
    batch = point["batch"]
    name = row_name(contender, variant)
    if point["generated"] != new_tokens or not point["prompt_kept"]:
        name += f" (generated {point['generated']}, prompt kept {point['prompt_kept']})"
    rate = point["tokens_per_second"]
    rates[(backend, contender, variant, batch)] = rate
    hub = rates.get((backend if backend != "torch" else "tensorflow", "keras-hub", "float32",
                     batch))
    hf = rates.get(("torch", "hf", "float32", batch))
    read = point["read_bytes_per_token"]
    streamed = "-"
    if batch == 1:
        streamed = f"{read * rate / 1e9:.1f} ({read * rate / 1e9 / memory:.0%})"
    columns = ["-"] * 4
    if reference is not None and contender == "keras_attn" and batch in reference:
        agree = agreement(point, reference[batch], new_tokens)
        margins = sorted(agree["margins"])
        shown = ", ".join(f"{m:.3f}" for m in margins[:4]) + (
            f" … ({len(margins)})" if len(margins) > 4 else "")
        columns = [f"{agree['free']:.1%}",
                   " ".join("-" if f is None else str(f) for f in agree["first"]),
                   f"{agree['forced']:.1%}",
                   f"{shown or 'none'} ({agree['median_margin']:.3f})"]
    print(f"| {shape} | {batch} | {backend} | {name} | {rate:.1f} | "
          + (f"{rate / hub:.2f}" if hub else "-") + " | " + (f"{rate / hf:.2f}" if hf else "-")
          + f" | {point['peak_rss_bytes'] / GIB:.2f} | {read / 1e6:.0f} | {streamed} | "
          + " | ".join(columns) + " |", flush=True)


if __name__ == "__main__":
    main()
