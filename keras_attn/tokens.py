"""The reserved token ids of every keras_attn vocabulary, defined once.

Data pipelines, models, decoding, metrics and export all read them from here:

| id | token     | meaning                                             |
|----|-----------|-----------------------------------------------------|
| 0  | `""`      | padding: masked by models, ignored by losses        |
| 1  | `"[UNK]"` | out of vocabulary                                   |
| 2  | `"<bos>"` | begin of sequence, the first decoder input          |
| 3  | `"<eos>"` | end of sequence, the last decoder target            |

Ordinary tokens start at `FIRST_WORD_ID`.

The non-autoregressive translator (`keras_attn.models.nat_seq2seq`) also reads a `<mask>` token
that is in no vocabulary: its id is `mask_id(vocab_size)`, one past the last target id, so the
vocabularies stay as they are, the NAT decoder embeds `vocab_size + 1` ids and its logits have
`vocab_size` columns (it cannot emit `<mask>`). This module imports nothing.
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


def mask_id(vocab_size: int) -> int:
    """The id of `<mask>` for a target vocabulary of `vocab_size` ids: `vocab_size`.

    Args:
        vocab_size: int, number of target ids, reserved ones included.

    Returns:
        int, `vocab_size` (the first id past the vocabulary).
    """
    return int(vocab_size)
