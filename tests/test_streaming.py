"""`CausalLM.generate(..., stream=True)` on every backend: the pieces, joined, are the text
`stream=False` returns (greedy and seeded sampling, one prompt or a batch, with the prompt or
without, stop strings across pieces) for each tokenizer family, prompts with emoji and CJK."""

import checkpoint_fixtures as fx
import pytest

import keras_attn as ka
from keras_attn.preprocessing import (
    CausalLMPreprocessor,
    CharacterTokenizer,
    PretrainedTokenizer,
)
from keras_attn.preprocessing.streaming import TextStream, stream_pieces
from keras_attn.recipes.tiny_checkpoints import tiny_llama_checkpoint
from keras_attn.tasks import CausalLM
from keras_attn.tokens import RESERVED_TOKENS

PROMPTS = ["The Time Traveller 😀", "日本語の 中文 café —"]
TEXTS = ["The Time Traveller (for so it will be convenient to speak of him) smiled.",
         "日本語のテキスト 😀 Émoji café 中文句子 — “quotes” 🚀"]


@pytest.fixture(scope="module")
def byte_level_directory(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("stream") / "llama")
    return tiny_llama_checkpoint(directory, TEXTS * 4, seed=2, vocabulary_size=300,
                                 hidden_dim=16, num_layers=1, num_heads=2,
                                 num_key_value_heads=1, intermediate_dim=32,
                                 max_sequence_length=64)


def _lm(family, byte_level_directory):
    if family == "byte_level":
        return CausalLM.from_pretrained(byte_level_directory, sequence_length=48)
    if family == "sentencepiece":  # byte fallback
        return CausalLM.from_pretrained(fx.hf_checkpoint("llama"), dtype="float32",
                                        sequence_length=48)
    if family == "wordpiece":
        tokenizer = PretrainedTokenizer(fx.tokenizer_dir("wordpiece"))
    else:
        tokenizer = CharacterTokenizer(list(RESERVED_TOKENS) + sorted(set("".join(
            TEXTS + PROMPTS))))
    model = ka.models.causal_lm(tokenizer.vocabulary_size, num_layers=1, hidden_dim=16,
                                num_heads=2, intermediate_dim=32, seed=4)
    return CausalLM(model, CausalLMPreprocessor(tokenizer, sequence_length=48))


FAMILIES = ["byte_level", "sentencepiece", "wordpiece", "character"]


# Made for each test: a SentencePiece tokenizer kept across tests loses its TensorFlow
# resource (NotFoundError "_0_SentencepieceOp does not exist") once the next test's
# `clear_session` has run.
@pytest.fixture(params=FAMILIES)
def lm(request, byte_level_directory):
    return _lm(request.param, byte_level_directory)


def test_joined_stream_is_the_text(lm):
    for sampler in ("greedy", ka.decoding.samplers.TopK(5, seed=3)):
        whole = lm.generate(PROMPTS[0], max_length=40, sampler=sampler)
        pieces = list(lm.generate(PROMPTS[0], max_length=40, sampler=sampler, stream=True))
        assert all(isinstance(p, str) and p for p in pieces)
        assert "".join(pieces) == whole
        # How many pieces depends on timing: a consumer behind the decoding takes the latest
        # tokens only (`test_pieces_arrive_while_decoding_runs` checks the streaming itself).
        assert pieces
        assert not any("\ufffd" in p for p in pieces[:1])  # the prompt, whole
    batch = lm.generate(PROMPTS, max_length=40, strip_prompt=True, max_new_tokens=12)
    rows = list(lm.generate(PROMPTS, max_length=40, strip_prompt=True, max_new_tokens=12,
                            stream=True))
    assert all(isinstance(r, list) and len(r) == 2 for r in rows)
    assert ["".join(r[i] for r in rows) for i in range(2)] == batch


def test_stop_strings_across_pieces(lm):
    options = {"max_length": 40, "strip_prompt": True, "stop_token_ids": None}
    full = lm.generate(PROMPTS[1], **options)  # no end id: text to the last position
    assert len(full) >= 6
    stop = full[3:6]
    cut = lm.generate(PROMPTS[1], stop_strings=[stop], **options)
    assert cut == full[:full.find(stop) + len(stop)]
    pieces = list(lm.generate(PROMPTS[1], stop_strings=[stop], stream=True, **options))
    assert "".join(pieces) == cut


def test_stream_refuses_what_it_cannot_stream(lm):
    with pytest.raises(ValueError, match="stream"):
        lm.generate(PROMPTS[0], max_length=24, stream=True, sampler=ka.decoding.Beam(2))
    with pytest.raises(ValueError, match="stream"):
        lm.generate([[5, 6, 7]], max_length=24, stream=True)
    with pytest.raises(ValueError, match="stream"):
        lm.generate(PROMPTS[0], max_length=24, stream="yes")


def test_leaving_the_stream_early_stops_the_loop(lm):
    stream = lm.generate(PROMPTS[0], max_length=40, strip_prompt=True, stream=True)
    first = next(stream)
    stream.close()  # the decoding thread stops at its next token and is joined
    assert isinstance(first, str) and first
    assert not [t for t in __import__("threading").enumerate() if t.name == "keras_attn_stream"]
    assert lm.generate(PROMPTS[0], max_length=40, strip_prompt=True).startswith(first)


def test_pieces_arrive_while_decoding_runs():
    """`stream_pieces` hands out each settled piece before the decoding goes on: a decoding
    that waits for the consumer after each token still streams every token's piece."""
    import threading

    import numpy as np

    tokenizer = CharacterTokenizer(list(RESERVED_TOKENS) + list("abc"))
    ids = np.asarray([[len(RESERVED_TOKENS) + i for i in (0, 1, 2, 0, 1, 2)]], "int32")
    consumed = threading.Semaphore(0)

    def decode(on_step):
        tokens = np.zeros_like(ids)
        for i in range(ids.shape[1]):
            tokens[:, i] = ids[:, i]
            on_step((np.int32(i), tokens.copy(), np.array([False])))
            # A token's text is settled once the next token has come.
            assert i == 0 or consumed.acquire(timeout=30), "no piece handed out"
        return tokens

    text_stream = TextStream(tokenizer, [0], [ids.shape[1]])
    pieces = []
    for rows in stream_pieces(decode, text_stream, lambda t: [
            tokenizer.detokenize(np.asarray(t)).numpy()[0].decode("utf-8")]):
        pieces.append(rows[0])
        consumed.release()
    assert "".join(pieces) == "abcabc"
    # A piece a token; the last token ends the row (its limit), so its text comes with it.
    assert pieces == ["a", "b", "c", "a", "bc"]
