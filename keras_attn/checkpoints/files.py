"""The files of a Hugging Face checkpoint directory, read into Python and NumPy (no torch).

- `read_safetensors(path, dtype=None)`: a `*.safetensors` file, a sharded checkpoint
  (`model.safetensors.index.json` and its shards) or a directory holding either (both: the
  single file, as transformers reads such a directory), as a dict of
  NumPy arrays keyed by the checkpoint's own tensor names. bfloat16 tensors come back as
  `ml_dtypes.bfloat16` arrays (the NumPy dtype TensorFlow and JAX use), or as float32 with
  `dtype="float32"`.
- `read_config(directory)`: `config.json`, and `generation_config.json` when there is one.

The safetensors format is an 8-byte little-endian header length, a JSON header (per tensor:
dtype, shape, byte offsets) and the raw little-endian bytes; the `safetensors` package's NumPy
loader reads it (bfloat16 included, through `ml_dtypes`), so torch is never imported.
"""

from __future__ import annotations

import json
import os

import ml_dtypes
import numpy as np

from keras_attn._checks import as_path

SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"
CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"

# dtype names a caller may ask for -> NumPy dtypes; floating tensors are cast, integer ones kept.
DTYPES = {"float32": np.dtype("float32"), "bfloat16": np.dtype(ml_dtypes.bfloat16),
          "float16": np.dtype("float16")}


def _check_dtype(dtype):
    if dtype is not None and dtype not in DTYPES:
        raise ValueError(
            "Received an invalid value for argument `dtype`, expected None (keep the stored "
            f"dtypes) or one of {sorted(DTYPES)}. Received: dtype={dtype!r}")


def is_floating(array: np.ndarray) -> bool:
    return array.dtype.kind == "f" or array.dtype == DTYPES["bfloat16"]


def _cast(array: np.ndarray, dtype: str | None) -> np.ndarray:
    if dtype is None or not is_floating(array) or array.dtype == DTYPES[dtype]:
        return array
    return array.astype(DTYPES[dtype])


def _shard_files(path: str) -> tuple[list[str], dict[str, str] | None]:
    """The safetensors files to read for `path`, and the index's weight map (None unsharded).

    A directory holding both `model.safetensors` and a shard index is read as transformers'
    `from_pretrained` reads it: the single file (it looks for that one first)."""
    path = as_path("path", path)
    if os.path.isdir(path):
        index = os.path.join(path, SAFETENSORS_INDEX)
        single = os.path.join(path, SAFETENSORS_FILE)
        if os.path.isfile(single):
            if os.path.isfile(index):  # not read, but a damaged one is not passed over
                _weight_map(index)
            path = single
        elif os.path.isfile(index):
            path = index
        else:
            found = sorted(os.listdir(path))
            raise ValueError(
                f"Received an invalid value for argument `path`, expected a directory with "
                f"`{SAFETENSORS_FILE}` or `{SAFETENSORS_INDEX}` (only safetensors weights are "
                f"read: a `.bin` or `.pt` file is a pickle). Received: path={path!r} holding "
                f"{found[:12]}")
    if not os.path.isfile(path):
        raise ValueError(f"Received an invalid value for argument `path`, expected an existing "
                         f"file or directory. Received: path={path!r}")
    if path.endswith(".index.json"):
        weight_map = _weight_map(path)
        folder = os.path.dirname(path)
        shards = sorted(set(weight_map.values()))
        missing = [name for name in shards if not os.path.isfile(os.path.join(folder, name))]
        if missing:
            raise ValueError(f"The index {path!r} names shard files that are not in "
                             f"{folder!r}: {missing}")
        return [os.path.join(folder, name) for name in shards], weight_map
    if not path.endswith(".safetensors"):
        raise ValueError(f"Received an invalid value for argument `path`, expected a "
                         f"`.safetensors` file, an `.index.json` file or a directory. "
                         f"Received: path={path!r}")
    return [path], None


def _weight_map(path: str) -> dict[str, str]:
    """The `weight_map` of the shard index at `path`: tensor names to the names of
    `.safetensors` files beside it; anything else is a ValueError naming the file and key."""
    weight_map = _read_json(path).get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ValueError(f"The index {path!r} has no `weight_map` of tensor names to shard "
                         f"files. Received: weight_map={_short(weight_map)}")
    for name, shard in weight_map.items():
        if not isinstance(shard, str) or not shard.endswith(".safetensors") or (
                os.path.basename(shard) != shard):
            raise ValueError(f"The index {path!r} must map every tensor to the name of a "
                             "`.safetensors` file beside it. Received: weight_map"
                             f"[{name!r}]={_short(shard)}")
    return weight_map


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _read_shard(file_path: str, dtype: str | None, weight_map: dict | None,
                tensors: dict) -> None:
    """Every tensor of one safetensors file into `tensors`; a file that is not safetensors
    (empty, truncated, another format) or that the index places elsewhere is refused."""
    from safetensors import SafetensorError, safe_open

    shard = os.path.basename(file_path)
    try:
        with safe_open(file_path, framework="np") as file:
            for name in file.keys():  # noqa: SIM118 (safe_open is not iterable)
                if name in tensors:
                    raise ValueError(f"The tensor {name!r} is stored twice (again in "
                                     f"{file_path!r}).")
                if weight_map is not None and weight_map.get(name) != shard:
                    raise ValueError(
                        f"The shard {file_path!r} holds the tensor {name!r}, which its index "
                        f"{SAFETENSORS_INDEX!r} places "
                        + (f"in {weight_map[name]!r}" if name in weight_map else "nowhere")
                        + ": the index does not describe these files.")
                tensors[name] = _cast(file.get_tensor(name), dtype)
    except SafetensorError as error:
        raise ValueError(f"{file_path!r} is not a readable safetensors file (empty, truncated "
                         f"or another format): {error}") from error


def read_safetensors(path: str, dtype: str | None = None) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors checkpoint as a NumPy array.

    Args:
        path: str, a `.safetensors` file, a `model.safetensors.index.json` (its shards are
            read from its directory), or a directory holding `model.safetensors` or the index.
        dtype: None, `"float32"`, `"bfloat16"` or `"float16"`: the dtype floating tensors are
            cast to (integer and boolean tensors are kept as stored). None keeps the stored
            dtypes: bfloat16 tensors come back as `ml_dtypes.bfloat16` arrays. Defaults to
            `None`.

    Returns:
        dict from the checkpoint's tensor names (e.g. `"model.layers.0.self_attn.q_proj.weight"`)
        to NumPy arrays of the stored shapes (torch's `state_dict()` layout).

    Raises:
        ValueError: no safetensors weights at `path`, an index that is not a JSON object
            mapping tensor names to `.safetensors` file names, a shard named by the index is
            missing, a tensor is not in the shard its index names, or a file is not
            safetensors (empty, truncated, another format); each names the file.

    Example:
    >>> weights = read_safetensors("path/to/checkpoint", dtype="float32")
    >>> weights["model.embed_tokens.weight"].shape  # (vocab_size, hidden_size)
    """
    _check_dtype(dtype)
    files, weight_map = _shard_files(path)
    tensors: dict[str, np.ndarray] = {}
    for file_path in files:
        _read_shard(file_path, dtype, weight_map, tensors)
    if weight_map is not None:
        absent = sorted(set(weight_map) - set(tensors))
        if absent:
            raise ValueError(f"The index names tensors that no shard holds: {absent[:8]}")
    return tensors


def _read_json(path: str) -> dict:
    """The JSON object in the file `path`; anything else is a ValueError naming the file."""
    try:
        with open(path, encoding="utf-8") as file:
            value = json.load(file)
    except UnicodeDecodeError as error:
        raise ValueError(f"{path!r} is not UTF-8 text, so not JSON: {error}") from error
    except json.JSONDecodeError as error:
        raise ValueError(f"{path!r} is not valid JSON: {error}") from error
    if isinstance(value, dict):
        return value
    raise ValueError(f"{path!r} does not hold a JSON object. Received: a JSON "
                     f"{type(value).__name__}")


def read_config(directory: str) -> tuple[dict, dict | None]:
    """A checkpoint directory's `config.json`, and its `generation_config.json` if present.

    Args:
        directory: str, the checkpoint directory.

    Returns:
        `(config, generation_config)`: two dicts, the second None when the file is absent.

    Raises:
        ValueError: `directory` is not a path or has no `config.json`, or a file is not a
            UTF-8 JSON object (naming the file).
    """
    directory = as_path("directory", directory)
    config_path = os.path.join(directory, CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise ValueError(f"Received an invalid value for argument `directory`, expected a "
                         f"checkpoint directory with `{CONFIG_FILE}`. Received: "
                         f"directory={directory!r}")
    generation_path = os.path.join(directory, GENERATION_CONFIG_FILE)
    generation = _read_json(generation_path) if os.path.isfile(generation_path) else None
    return _read_json(config_path), generation
