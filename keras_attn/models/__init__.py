"""The model stacks and the functional-API model builders.

One assembly (`keras_attn.models.assembly`): token embedding with positions -> blocks -> output
head, shared by the encoder-decoder (`TransformerEncoder`, `TransformerDecoder`), decoder-only
(`TransformerDecoderOnly`) and conditional masked-LM (`CMLMDecoder`) stacks; the Bahdanau GRU
stacks (`BahdanauEncoder`, `BahdanauDecoder`). The decoders keep the decoding contract of
`keras_attn.decoding.contract.Decoder`.

Every seq2seq builder returns `keras.Model([source_ids, target_in_ids], logits)` with layers
named "encoder" and "decoder"; `causal_lm` returns `keras.Model(token_ids, logits)` with a
"decoder" that `generate` decodes; the non-autoregressive `nat_seq2seq` returns
`keras.Model([source_ids, masked_target_ids], [token_logits, length_logits])`, which
`keras_attn.decoding.mask_predict` decodes. `enable_lora(model, rank)` freezes a model and
adapts its attention projections (LoRA). `get_layout_map(device_mesh)` places every model's
weights on a `keras.distribution` device mesh (Megatron-style model parallelism).
"""

from keras_attn.models.bahdanau import (
    BahdanauDecoder,
    BahdanauEncoder,
    bahdanau_seq2seq,
)
from keras_attn.models.causal_lm import causal_lm
from keras_attn.models.cmlm import CMLMDecoder, LengthPredictor
from keras_attn.models.decoder_only import TransformerDecoderOnly
from keras_attn.models.layout import get_layout_map
from keras_attn.models.lora import enable_lora
from keras_attn.models.nat import compile_cmlm, initialize_from_seq2seq, nat_seq2seq
from keras_attn.models.transformer import (
    TransformerDecoder,
    TransformerEncoder,
    transformer_seq2seq,
)

# The task models live in `keras_attn.tasks` (above decoding and checkpoints); these names
# forward there, imported at use.
_TASKS = ("CausalLM", "Seq2SeqLM", "TextClassifier")


def __getattr__(name: str):
    """`keras_attn.models.CausalLM` and the other task models of `keras_attn.tasks`."""
    if name not in _TASKS:
        raise AttributeError(f"module 'keras_attn.models' has no attribute {name!r}")
    from keras_attn import tasks

    return getattr(tasks, name)


__all__ = [
    "BahdanauDecoder",
    "BahdanauEncoder",
    "CMLMDecoder",
    "LengthPredictor",
    "TransformerDecoder",
    "TransformerDecoderOnly",
    "TransformerEncoder",
    "bahdanau_seq2seq",
    "causal_lm",
    "compile_cmlm",
    "enable_lora",
    "get_layout_map",
    "initialize_from_seq2seq",
    "nat_seq2seq",
    "transformer_seq2seq",
]
