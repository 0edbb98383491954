"""keras_attn.checkpoints.tokenizer_merges.BytePairMerger: the BPE merges of the `tokenizers`
library, in a few parallel rounds whatever the length of a word.

The reference is `tokenizers`' own BPE model (`Tokenizer.model.tokenize`) on the same
vocabulary and merges: the tiny tokenizers of the test fixtures, and random merge lists in
which some merges come before the merges that make their parts (merges that later ones can
undercut: rule 1 of the module may then only take one place per round) and runs of one
letter (pairs of equal tokens, paired from the left).
"""

import json
import os
import random

import checkpoint_fixtures as fx
import pytest
import tensorflow as tf
from tokenizers import Tokenizer

from keras_attn.checkpoints import load_tokenizer
from keras_attn.checkpoints.tokenizer_bpe import bytes_to_unicode
from keras_attn.checkpoints.tokenizer_merges import BytePairMerger

pytestmark = pytest.mark.tf_only

ALPHABET = bytes_to_unicode()
BYTE_TOKENS = [ALPHABET[byte] for byte in range(256)]


def model_ids(reference: Tokenizer, word: str) -> list[int]:
    """`tokenizers`' BPE model on one pre-tokenized word (its bytes in GPT-2's alphabet)."""
    return [token.id for token in reference.model.tokenize(
        "".join(ALPHABET[byte] for byte in word.encode()))]


def random_model(seed: int, letters: str, count: int, shuffled: float):
    """A vocabulary (every byte, then merged tokens), `count` random merges of it, a fraction
    `shuffled` of them swapped out of order; and `tokenizers`' BPE on them."""
    rng = random.Random(seed)
    vocab = {token: index for index, token in enumerate(BYTE_TOKENS)}
    tokens = [ALPHABET[ord(letter)] for letter in letters]
    merges, seen = [], set()
    while len(merges) < count:
        left, right = rng.choice(tokens), rng.choice(tokens)
        if (left, right) in seen or len(left + right) > 8:
            continue
        seen.add((left, right))
        merges.append([left, right])
        if left + right not in vocab:
            vocab[left + right] = len(vocab)
            tokens.append(left + right)
    for _ in range(int(shuffled * count)):
        i, j = rng.randrange(count), rng.randrange(count)
        merges[i], merges[j] = merges[j], merges[i]
    model = {"type": "BPE", "dropout": None, "unk_token": None,
             "continuing_subword_prefix": None, "end_of_word_suffix": None, "fuse_unk": False,
             "byte_fallback": False, "ignore_merges": False, "vocab": vocab, "merges": merges}
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": [],
            "normalizer": None, "pre_tokenizer": None, "post_processor": None, "decoder": None,
            "model": model}
    return vocab, merges, Tokenizer.from_str(json.dumps(spec))


@pytest.mark.parametrize("seed", range(5))
def test_random_merge_lists_merge_like_the_tokenizers_library(seed):
    vocab, merges, reference = random_model(seed, "abcd ", 60, shuffled=(0, 0.1, 0.5)[seed % 3])
    merger = BytePairMerger(vocab, merges, BYTE_TOKENS, cache_size=0)
    if seed % 3:  # the swaps made merges that a lower-ranked merge of their result undercuts
        assert merger.inconsistent > 0
    rng = random.Random(100 + seed)
    words = (["".join(rng.choice("abcd ") for _ in range(rng.randrange(1, 40)))
              for _ in range(150)]
             + ["".join(rng.choice("ab") for _ in range(rng.randrange(40, 120)))
                for _ in range(8)]
             + ["a" * length for length in range(1, 30)] + [""])
    expected = [model_ids(reference, word) for word in words]
    for depth in (1, 4):  # the walks of rule 2: other rounds, the same ids
        merger = BytePairMerger(vocab, merges, BYTE_TOKENS, depth=depth, cache_size=0)
        assert merger.merge(tf.constant(words)).to_list() == expected, depth
    assert [merger.merge(tf.constant([word])).to_list()[0] for word in words[:4]] == (
        expected[:4])  # a batch of one word (shifts past the ends of the batch)


@pytest.fixture(scope="module")
def trained_dir(tmp_path_factory):
    """A byte-level BPE (GPT-2's pre-tokenizer) of 3,000 tokens trained on The Time Machine,
    CJK lines (300 ideographs, Zipf frequencies), digits, runs of spaces: long words of each
    have hundreds of merges."""
    from tokenizers import decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    ideographs = [chr(0x4E00 + 7 * i) for i in range(300)]
    weights = [1 / (i + 1) for i in range(300)]
    lines = fx.training_lines(2000)
    lines += ["".join(rng.choices(ideographs, weights, k=30)) for _ in range(2000)]
    lines += ["".join(rng.choice("0123456789") for _ in range(30)) for _ in range(500)]
    lines += [" " * rng.randrange(1, 60) + "x" for _ in range(500)]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.train_from_iterator(lines, trainers.BpeTrainer(
        vocab_size=3000, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    path = tmp_path_factory.mktemp("trained")
    tokenizer.save(str(path / "tokenizer.json"))
    return str(path), "".join(ideographs)


def test_long_words_encode_exactly_in_few_rounds(trained_dir):
    directory, ideographs = trained_dir
    reference = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    tokenizer = load_tokenizer(directory)
    rng = random.Random(3)
    words = {"cjk": "".join(rng.choice(ideographs) for _ in range(2000)),
             "digits": "".join(rng.choice("0123456789") for _ in range(3000)),
             "spaces": " " * 3000,
             "letters": "".join(rng.choice("etaoinshrdlu") for _ in range(3000))}
    texts = list(words.values()) + [words["cjk"] + words["digits"] + "x" + words["spaces"]]
    ours = tokenizer.encode(texts).to_list()
    assert ours == [e.ids for e in reference.encode_batch(texts)]
    for kind, word in words.items():  # one pre-token each
        rounds = int(tokenizer.merger.rounds(tf.constant([word])))
        merges = len(word.encode()) - len(model_ids(reference, word))
        # one merge a round (keras-hub's loop) would take `merges` rounds
        assert merges >= 400 and rounds <= 12, (kind, merges, rounds)


def test_cache_returns_what_the_merges_return():
    directory = fx.tokenizer_dir("llama3")  # ignore_merges: whole-word tokens first
    reference = Tokenizer.from_file(os.path.join(directory, "tokenizer.json"))
    tokenizer = load_tokenizer(directory)
    texts = ["the time traveller, the time machine", "x" * 300 + " the", "日本 the"]
    expected = [e.ids for e in reference.encode_batch(texts)]
    for _ in range(2):  # cold, then from the cache
        assert tokenizer.encode(texts).to_list() == expected
    assert int(tokenizer.merger.cached()) > 0
    small = load_tokenizer(directory)
    small.merger.cache_size = 2  # full after the first call: later words are merged
    assert [small.encode([text]).to_list()[0] for text in texts * 2] == expected * 2
    assert int(small.merger.cached()) <= 2 + 4  # one insertion past the limit at most
