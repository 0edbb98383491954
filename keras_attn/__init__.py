"""keras_attn: attention layers for Keras 3.

From Nadaraya-Watson kernel pooling to the full Transformer, with NaN-free masking in every
dtype, memory-efficient exact attention, and translators exported with decoding inside the
SavedModel.
"""

__version__ = "0.3.0.dev0"

from keras_attn import decoding, layers, metrics, models, ops, preprocessing, tasks  # noqa: F401
from keras_attn.layers import *
from keras_attn.models import (  # noqa: F401 - the stacks, here as before
    BahdanauDecoder,
    BahdanauEncoder,
    CMLMDecoder,
    LengthPredictor,
    TransformerDecoder,
    TransformerDecoderOnly,
    TransformerEncoder,
)
from keras_attn.tasks import CausalLM, Seq2SeqLM, TextClassifier  # noqa: F401
