"""What `transformers` computes for a checkpoint directory, in a subprocess: the test processes
never import torch or transformers (see checkpoint_fixtures.py)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np

SCRIPT = """
import json, sys
import numpy as np, torch, transformers
directory, model_class, texts, out = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4]
tokenizer = transformers.AutoTokenizer.from_pretrained(directory)
rows = [tokenizer(text)["input_ids"] for text in texts]
ids = np.zeros((len(rows), max(map(len, rows))), "int64")
mask = np.zeros_like(ids)
for i, row in enumerate(rows):
    ids[i, :len(row)], mask[i, :len(row)] = row, 1
model = getattr(transformers, model_class).from_pretrained(directory).eval()
with torch.no_grad():
    output = model(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask))
arrays = {"ids": ids, "mask": mask.astype(bool), "tokenizer": np.array(type(tokenizer).__name__)}
for name in ("last_hidden_state", "pooler_output", "logits"):
    if getattr(output, name, None) is not None:
        arrays[name] = getattr(output, name).float().numpy()
np.savez(out, **arrays)
"""


def transformers_outputs(directory: str, model_class: str, texts: list[str], out: str) -> dict:
    """`model_class` (e.g. `"BertModel"`, `"AutoModelForCausalLM"`) loaded from `directory` by
    transformers, run on `texts` tokenized by its `AutoTokenizer` (one text per row, padded
    on the right): `ids`, `mask` and the model's `last_hidden_state`, `pooler_output` or
    `logits` as NumPy arrays; `out` is the `.npz` file the subprocess writes."""
    result = subprocess.run([sys.executable, "-c", SCRIPT, directory, model_class,
                             json.dumps(texts), out], capture_output=True, text=True,
                            timeout=600, check=False)
    assert result.returncode == 0, result.stderr[-3000:]
    with np.load(out) as arrays:
        return {name: arrays[name] for name in arrays.files}
