"""One process of the sharding tests (tests/test_sharding.py): every keras_attn model on a JAX
mesh of 8 devices against the same model on one device.

Run with `KERAS_BACKEND=jax XLA_FLAGS=--xla_force_host_platform_device_count=8` (the flag must
be set before JAX is imported, hence a process of its own). For each model (tiny sizes, dropout
off: the builders', and the pretrained architectures' from the Hugging Face configs written here,
random weights, one with LoRA) it runs, unsharded, under `DataParallel` over 8 devices, and under
`ModelParallel` with `keras_attn.models.get_layout_map` on a `(2, 4)` `("batch", "model")`
mesh, all from the same initial weights: the outputs of `predict_on_batch`, the loss of one
`train_on_batch` step (SGD, mean squared error to fixed random targets) and the weights after
it. It prints one JSON line: per model and distribution, the largest differences to the
unsharded run, and per variable its shape, its `PartitionSpec`, the shape of one device's shard
and the axes `get_layout_map` asks for.

    python tests/sharding_check.py [MODEL ...] [--data-parallel [MODEL ...]]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras
import numpy as np

from keras_attn import models
from keras_attn.checkpoints import build_model, spec_from_hf_config

B, T = 8, 8  # batch (divisible by the 8 devices of DataParallel), sequence length
LLAMA = {"vocab_size": 64, "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
         "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 32}
BERT = {"model_type": "bert", "vocab_size": 64, "hidden_size": 16, "num_hidden_layers": 1,
        "num_attention_heads": 4, "intermediate_size": 32, "max_position_embeddings": 32,
        "type_vocab_size": 2, "hidden_dropout_prob": 0.0, "attention_probs_dropout_prob": 0.0}
CONFIGS = {  # Hugging Face config.json contents
    "llama": {**LLAMA, "architectures": ["LlamaForCausalLM"], "model_type": "llama"},
    "mistral": {**LLAMA, "architectures": ["MistralForCausalLM"], "model_type": "mistral",
                "sliding_window": 4},
    "qwen2": {**LLAMA, "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2",
              "tie_word_embeddings": True},
    "gpt2": {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": 64,
             "n_embd": 16, "n_layer": 1, "n_head": 4, "n_positions": 32, "resid_pdrop": 0.0,
             "embd_pdrop": 0.0, "attn_pdrop": 0.0},
    "bert": {**BERT, "architectures": ["BertModel"]},
    "bert_mlm": {**BERT, "architectures": ["BertForMaskedLM"]},
}
SIZES = {"num_layers": 1, "hidden_dim": 16, "num_heads": 4, "intermediate_dim": 32,
         "dropout": 0.0}
BUILDERS = {
    "causal_lm": lambda: models.causal_lm(64, num_key_value_heads=2, **{**SIZES,
                                                                        "num_layers": 2}),
    "causal_lm_gpt2_style": lambda: models.causal_lm(
        64, position_encoding="learned", max_sequence_length=T, norm="layer",
        activation="gelu_tanh", tie_word_embeddings=True, **SIZES),
    "transformer_seq2seq": lambda: models.transformer_seq2seq(48, 64, **SIZES),
    "nat_seq2seq": lambda: models.nat_seq2seq(48, 64, max_target_length=T - 1, **SIZES),
    "bahdanau_seq2seq": lambda: models.bahdanau_seq2seq(48, 64, embedding_dim=8, units=16,
                                                        num_layers=1, dropout=0.0),
    "causal_lm_lora": lambda: lora(models.causal_lm(64, **SIZES)),
}
MODELS = (*BUILDERS, *CONFIGS)


def lora(model: keras.Model) -> keras.Model:
    """LoRA on the query, value, attention output and FFN hidden projections."""
    models.enable_lora(model, 2, ("query", "value", "output", "hidden"))
    return model


def build(name: str) -> keras.Model:
    if name in BUILDERS:
        return BUILDERS[name]()
    return build_model(spec_from_hf_config(CONFIGS[name]))


def inputs(name: str):
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 48, (B, T)).astype("int32")
    ids[0, -3:] = 0  # some padding
    if name in BUILDERS:
        return ids if name.startswith("causal_lm") else [ids, rng.integers(1, 48, (B, T))]
    mask = ids != 0
    features = {"token_ids": ids, "padding_mask": mask}
    if name.startswith("bert"):
        features["segment_ids"] = (np.arange(T) >= T // 2).astype("int32")[None].repeat(B, 0)
    return features


def run(name: str, weights, distribution=None) -> dict:
    """Outputs, loss and weights after one step, and where each variable is."""
    scope = distribution.scope() if distribution is not None else contextlib.nullcontext()
    with scope:
        keras.utils.set_random_seed(0)
        model = build(name)
        if weights is not None:
            model.set_weights(weights)
        initial = model.get_weights()
        # The one-device reference runs eagerly: each op compiled once for all the models.
        model.compile(keras.optimizers.SGD(0.5), loss="mse", jit_compile=distribution is not None)
        x = inputs(name)
        outputs = model.predict_on_batch(x)
        rng = np.random.default_rng(1)
        # Random targets; none where an output is a constant -1e9 (the CMLM's banned ids).
        targets = keras.tree.map_structure(lambda a: np.where(
            np.abs(a) < 1e6, rng.normal(size=np.shape(a)), a).astype("float32"), outputs)
        loss = keras.tree.flatten(model.train_on_batch(x, targets))[0]  # the total
        placement = {
            v.path: {"shape": list(v.shape),
                     "spec": [None if a is None else str(a)
                              for a in getattr(v.value.sharding, "spec", ())],
                     "shard": list(v.value.addressable_shards[0].data.shape)}
            for v in model.weights}
    return {"initial": initial, "outputs": [np.asarray(o) for o in keras.tree.flatten(outputs)],
            "loss": float(np.asarray(loss)), "after": model.get_weights(),
            "placement": placement}


def largest(a: list, b: list) -> float:
    return max(float(np.max(np.abs(np.asarray(x, "float64") - np.asarray(y, "float64"))))
               for x, y in zip(a, b))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("models", nargs="*", default=list(MODELS), help="default: all")
    parser.add_argument("--data-parallel", nargs="*", default=None,
                        help="the models also run under DataParallel (default: all)")
    args = parser.parse_args(argv)
    data_parallel = args.models if args.data_parallel is None else args.data_parallel
    devices = keras.distribution.list_devices()
    mesh = keras.distribution.DeviceMesh((2, 4), ("batch", "model"), devices)
    layout_map = models.get_layout_map(mesh)
    distributions = {
        "data_parallel": keras.distribution.DataParallel(devices=devices),
        "model_parallel": keras.distribution.ModelParallel(layout_map=layout_map,
                                                           batch_dim_name="batch"),
    }
    report = {"devices": len(devices), "mesh": dict(zip(mesh.axis_names, mesh.shape)),
              "models": {}}
    for name in args.models:
        start = time.monotonic()
        one = run(name, None)
        finite = [np.abs(o[np.abs(o) < 1e6]) for o in one["outputs"]]
        result = {"loss": one["loss"], "step": largest(one["after"], one["initial"]),
                  "output_scale": max(float(np.max(o)) for o in finite)}
        for kind, distribution in distributions.items():
            if kind == "data_parallel" and name not in data_parallel:
                continue
            sharded = run(name, one["initial"], distribution)
            placement = sharded["placement"]
            for path, where in placement.items():
                layout = layout_map[path]
                where["asked"] = None if layout is None else list(layout.axes)
            result[kind] = {"outputs": largest(sharded["outputs"], one["outputs"]),
                            "loss": abs(sharded["loss"] - one["loss"]),
                            "weights": largest(sharded["after"], one["after"]),
                            "placement": placement}
        report["models"][name] = result
        print(f"{name}: {time.monotonic() - start:.1f} s", file=sys.stderr, flush=True)
    print(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1:])
