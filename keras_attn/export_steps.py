"""Greedy decoding of an ONNX or LiteRT export (`CausalLM.export(path, format="onnx")`,
`Seq2SeqLM.export(path, format="onnx")`, `keras_attn.export_decoding`) with NumPy and the
format's runtime only: onnxruntime, or ai-edge-litert's interpreter.

This file imports neither Keras nor TensorFlow nor the rest of keras_attn (importing it as
`keras_attn.export_steps` does load the package; a service copies this one file beside its
code). It runs the loop of `keras_attn.decoding.loops.token_loop` with a greedy choice: the
same tokens as `CausalLM.generate` / `Seq2SeqLM.generate` with `sampler="greedy"`.

    from export_steps import greedy
    tokens = greedy("runs/lm_onnx", [[2, 17, 5, 0]], max_new_tokens=20)  # (B, max_length)
"""

from __future__ import annotations

import json
import os

import numpy as np

METADATA = "export.json"


class Runner:
    """One exported graph in its runtime, called with a dict of named NumPy arrays and
    returning a dict of named arrays."""

    def __init__(self, path: str, format: str):
        self.format = format
        if format == "onnx":
            import onnxruntime

            self.session = onnxruntime.InferenceSession(
                path, providers=["CPUExecutionProvider"])
            self.names = [o.name for o in self.session.get_outputs()]
        elif format == "litert":
            from ai_edge_litert.interpreter import Interpreter

            self.session = Interpreter(model_path=path).get_signature_runner()
        else:
            raise ValueError("Received an invalid value for `format` in export.json, expected "
                             f"'onnx' or 'litert'. Received: format={format!r}")

    def __call__(self, feed: dict) -> dict:
        if self.format == "onnx":
            return dict(zip(self.names, self.session.run(None, feed)))
        return self.session(**feed)


def load(path: str) -> tuple[dict, dict]:
    """`(metadata, runners)` of the export directory `path`: its `export.json` and a `Runner`
    per file."""
    metadata_path = os.path.join(path, METADATA)
    if not os.path.isfile(metadata_path):
        raise ValueError(f"Argument `path` must be an export directory holding {METADATA} "
                         f"(CausalLM.export(path, format=\"onnx\")). Received: path={path!r}")
    with open(metadata_path) as f:
        meta = json.load(f)
    runners = {name: Runner(os.path.join(path, file), meta["format"])
               for name, file in meta["files"].items() if name != "forward"}
    return meta, runners


def _initial_state(meta: dict, runners: dict, batch: int, source_ids):
    """The state tensors before the first step: zeros (causal LM) or the encoder's."""
    if meta["task"] == "causal_lm":
        return [np.zeros([batch] + item["shape"][1:], item["dtype"]) for item in meta["state"]]
    outputs = runners["encoder"]({"source_ids": source_ids})
    return [outputs[f"{item['name']}_out"] for item in meta["state"]]


def greedy(path: str, token_ids, max_new_tokens: int | None = None, runners=None):
    """Greedy decoding of the export at `path`.

    Args:
        path: str, the export directory (its `export.json`).
        token_ids: int `(B, P)`: a causal LM's prompts, right-padded with the padding id (each
            row at least one token); a sequence-to-sequence model's source ids.
        max_new_tokens: optional int >= 1 (causal LM), new tokens per row at most. Defaults to
            `None` (up to `max_length`).
        runners: optional `(metadata, runners)` of `load(path)`, loaded once for many calls.
            Defaults to `None` (loaded here).

    Returns:
        int32 `(B, max_length)`: a causal LM's prompts and continuations (up to a stop id,
        included), then the fill id; a sequence-to-sequence model's outputs (`<bos>`
        excluded), then the fill id.
    """
    meta, runners = runners if runners is not None else load(path)
    token_ids = np.asarray(token_ids)
    if token_ids.ndim != 2 or token_ids.dtype.kind not in "iu" or token_ids.shape[1] == 0:
        raise ValueError("Argument `token_ids` must be integer ids of shape (batch_size, "
                         f"length). Received: token_ids with shape {token_ids.shape} and dtype "
                         f"{token_ids.dtype}")
    token_ids = token_ids.astype("int32")
    batch, length = token_ids.shape[0], meta["max_length"]
    fill, stops = meta["fill_id"], np.asarray(meta["stop_token_ids"], "int32")
    state = _initial_state(meta, runners, batch, token_ids)
    if meta["task"] == "causal_lm":
        if not 0 < token_ids.shape[1] < length:
            raise ValueError(f"Argument `token_ids` must have fewer than max_length={length} "
                             f"positions. Received: token_ids.shape={token_ids.shape}")
        pad = meta["pad_id"]
        lengths = (np.full(batch, token_ids.shape[1]) if pad is None
                   else (token_ids != pad).sum(axis=1)).astype("int32")
        prefix = np.arange(token_ids.shape[1])[None, :] < lengths[:, None]  # (B, P)
        bad = np.flatnonzero((lengths < 1) | ((token_ids != pad) != prefix).any(axis=1)
                             if pad is not None else lengths < 1)
        if bad.size:
            raise ValueError("Argument `token_ids` must hold right-padded prompts: each row "
                             f"at least one token (e.g. <bos>), then only the padding id {pad}. "
                             f"Received: row {int(bad[0])} = {token_ids[bad[0]].tolist()}")
        tokens = np.full((batch, length), fill, "int32")
        tokens[:, :token_ids.shape[1]] = token_ids
    else:  # the decoder starts from <bos>, its outputs are `max_length` tokens
        length += 1
        lengths = np.ones(batch, "int32")
        tokens = np.full((batch, length), fill, "int32")
        tokens[:, 0] = meta["bos_id"]
    new = length if max_new_tokens is None else int(max_new_tokens)
    if new < 1:
        raise ValueError("Argument `max_new_tokens` must be at least 1. Received: "
                         f"max_new_tokens={max_new_tokens!r}")
    limits = lengths + np.minimum(new, length - lengths)  # (B,)
    finished = np.zeros(batch, bool)
    names = [item["name"] for item in meta["state"]]
    step = runners["decode_step"]
    for index in range(length - 1):
        feed = {"token_ids": tokens[:, index:index + 1],
                "index": np.asarray(index, "int32")}
        feed.update(zip(names, state))
        outputs = step(feed)
        state = [outputs[f"{n}_out"] for n in names]
        logits = np.array(outputs["logits"], "float32")  # (B, V)
        logits[:, meta["suppressed_ids"]] = -np.inf
        chosen = np.argmax(logits, axis=-1).astype("int32")  # (B,)
        forced = index + 1 < lengths  # (B,): still inside the prompt
        finished |= ~forced & (index + 1 >= limits)
        token = np.where(forced, tokens[:, index + 1], np.where(finished, fill, chosen))
        live = ~(forced | finished)
        finished |= live & np.isin(token, stops)
        tokens[:, index + 1] = token
        if finished.all():
            break
    return tokens if meta["task"] == "causal_lm" else tokens[:, 1:]
