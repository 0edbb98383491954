"""Incremental detokenization (`keras_attn.preprocessing.streaming.TextStream`), token by token
on each tokenizer family: no piece is half a character, no piece changes afterwards, the pieces
join to the text decoded at once, stop strings end the text across pieces."""

import checkpoint_fixtures as fx
import numpy as np
import pytest

from keras_attn.preprocessing import CharacterTokenizer, PretrainedTokenizer
from keras_attn.preprocessing.streaming import TextStream
from keras_attn.tokens import RESERVED_TOKENS

TEXTS = ["The Time Traveller 😀 smiled — 日本語のテキスト, 中文句子。",
         "Émoji 😀😀 café naïve; don't can't I'm you're. Hello , world ! 東京",
         "Numbers 12345, 3.14159 and ١٢٣ — “quotes” 🚀🇫🇷 end"]
KINDS = ["gpt2", "llama3", "qwen2", "sentencepiece", "sentencepiece_legacy", "wordpiece",
         "wordpiece_cased"]


def _tokenizer(kind):
    if kind == "character":
        return CharacterTokenizer(list(RESERVED_TOKENS) + sorted(set("".join(TEXTS))))
    return PretrainedTokenizer(fx.tokenizer_dir(kind))


def _stream_token_by_token(tokenizer, ids, stops=(), stop_ids=()):
    """Feed `ids` one position at a time; every prefix of what was handed out, and the pieces."""
    buffer = np.array([ids], "int32")
    stream = TextStream(tokenizer, [0], [len(ids)], stop_ids, stops)
    pieces, prefixes = [], []
    for last in range(len(ids)):
        finished = [last == len(ids) - 1]
        pieces += [p for p in stream.update(buffer, last, finished) if p]
        prefixes.append("".join(pieces))
    return pieces, prefixes, stream


@pytest.mark.parametrize("kind", KINDS + ["character"])
def test_pieces_are_whole_characters_that_never_change(kind):
    tokenizer = _tokenizer(kind)
    for text in TEXTS:
        ids = tokenizer.tokenize([text], add_special_tokens=False).to_list()[0]
        whole = tokenizer.detokenize([ids]).numpy()[0].decode("utf-8")
        pieces, prefixes, stream = _stream_token_by_token(tokenizer, ids)
        assert "".join(pieces) == whole
        assert all(whole.startswith(prefix) for prefix in prefixes)
        if "\ufffd" not in whole:
            assert not any("\ufffd" in piece for piece in pieces)
        assert len(pieces) > len(ids) // 4  # it streams: pieces as the tokens come
        assert stream.finish([whole]) == [""]


def test_byte_fallback_and_byte_level_hold_partial_characters():
    for kind in ("llama3", "sentencepiece"):
        tokenizer = _tokenizer(kind)
        ids = tokenizer.tokenize(["😀🚀"], add_special_tokens=False).to_list()[0]
        assert len(ids) > 2  # bytes, not whole characters
        pieces, prefixes, _ = _stream_token_by_token(tokenizer, ids)
        assert set(prefixes) <= {"", "😀", "😀🚀"} and "".join(pieces) == "😀🚀"


def test_a_byte_fallback_run_is_settled_when_it_ends():
    tokenizer = _tokenizer("sentencepiece")
    index = {token: i for i, token in enumerate(tokenizer.tokenizer.tokens)}
    # <0x64><0x36> alone is "d6"; with <0xB8> the run is invalid: four U+FFFD.
    ids = [index["▁the"], index["<0x64>"], index["<0x36>"], index["<0xB8>"], index["<0xE6>"],
           index["▁the"], index["<0xF0>"], index["<0x9F>"], index["<0x98>"], index["<0x80>"]]
    whole = tokenizer.detokenize([ids]).numpy()[0].decode("utf-8")
    assert whole == "the\ufffd\ufffd\ufffd\ufffd the😀"
    assert tokenizer.detokenize([ids[:3]]).numpy()[0].decode("utf-8") == "thed6"
    pieces, prefixes, _ = _stream_token_by_token(tokenizer, ids)
    assert "".join(pieces) == whole and all(whole.startswith(p) for p in prefixes)


def test_wordpiece_joins_and_cleanup():
    tokenizer = _tokenizer("wordpiece")
    ids = tokenizer.tokenize(["hello , travellers ! smiled ."], add_special_tokens=False
                             ).to_list()[0]
    whole = tokenizer.detokenize([ids]).numpy()[0].decode("utf-8")
    assert whole == "hello, travellers! smiled."  # `##` pieces joined, spaces cleaned up
    assert len(ids) > 6  # some words in `##` pieces
    pieces, prefixes, _ = _stream_token_by_token(tokenizer, ids)
    assert "".join(pieces) == whole and all(whole.startswith(p) for p in prefixes)


def test_stop_strings_across_pieces_and_stop_ids():
    tokenizer = _tokenizer("llama3")
    text = TEXTS[0]
    ids = tokenizer.tokenize([text], add_special_tokens=False).to_list()[0]
    for stop in ("😀 smi", "日本", "traveller smiled"):  # the last never occurs
        pieces, _, stream = _stream_token_by_token(tokenizer, ids, stops=(stop, "テキ"))
        end = min(text.find(s) + len(s) for s in (stop, "テキ") if s in text)
        assert "".join(pieces) == text[:end] and stream.done == [True]
    stop_id = ids[5]
    pieces, _, _ = _stream_token_by_token(tokenizer, ids, stop_ids=(stop_id,))
    assert "".join(pieces) == tokenizer.detokenize([ids[:5]]).numpy()[0].decode("utf-8")
