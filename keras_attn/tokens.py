"""The reserved token ids of every keras_attn vocabulary, defined once.

Data pipelines, models, decoding, metrics and export all read them from here:

| id | token     | meaning                                             |
|----|-----------|-----------------------------------------------------|
| 0  | `""`      | padding: masked by models, ignored by losses        |
| 1  | `"[UNK]"` | out of vocabulary                                   |
| 2  | `"<bos>"` | begin of sequence, the first decoder input          |
| 3  | `"<eos>"` | end of sequence, the last decoder target            |

Ordinary tokens start at `FIRST_WORD_ID`. This module imports nothing.
"""

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
FIRST_WORD_ID = 4

PAD = ""
UNK = "[UNK]"
BOS = "<bos>"
EOS = "<eos>"
RESERVED_TOKENS = (PAD, UNK, BOS, EOS)
