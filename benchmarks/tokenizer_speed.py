"""Tokenizer speed: `keras_attn.checkpoints.load_tokenizer` against `tokenizers` and keras-hub.

Byte-level BPE tokenizers are trained here, offline, with the `tokenizers` library on
`../shared/data` (The Time Machine, English and French sentences of fra-eng.txt, synthetic CJK
text: 3,000 ideographs drawn with Zipf frequencies, digit strings): one with GPT-2's
pre-tokenizer, one with Llama 3's split regex. keras-hub's `BytePairTokenizer` gets the GPT-2
one's vocabulary and merges. The SentencePiece and WordPiece decode rows use the test suite's
tiny tokenizers (`tests/checkpoint_fixtures.py`).

keras_attn is called as users call it, `tokenizer.encode(texts)` / `tokenizer.decode(ids)`
(eagerly: each runs one graph, traced by its first call, which the "first call" row times);
keras-hub's `tokenize` / `detokenize` run in a `tf.function`; `tokenizers` is called as
`encode_batch` / `decode_batch`. Calls alternate in rounds, the medians are printed, and the
ratios to `tokenizers` are what to read. Rows:

- encode, warm: the same strings every round (every library's word cache warm): a batch of
  256 sentences; one 10,000-character text of ordinary words;
- encode, cold: text none of them has seen (a new string every round; words longer than 256
  bytes are cached by none of them): the same 10,000-character text with every cache off
  (keras-hub: not measured); one unbroken 10,000-character word of CJK ideographs, of digits
  (GPT-2's pre-tokenizer), of spaces (Llama 3's), of letters; keras-hub's merge loop is
  quadratic, so its column is for 1,000-character words, timed once (`--hub-length`);
- decode: the ids of the 256 sentences back to text.

Every row's ids are checked against `tokenizers` before timing.

    python benchmarks/tokenizer_speed.py
    python benchmarks/tokenizer_speed.py --rounds 9 --length 20000
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import tempfile
import time

from _common import header, median, time_alternating

DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, os.pardir, "shared",
                    "data")
LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}"
                r"\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
IDEOGRAPHS = [chr(0x4E00 + 7 * i) for i in range(3000)]
ZIPF = [1 / (i + 1) for i in range(3000)]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--length", type=int, default=10000, help="characters of a long text")
    parser.add_argument("--hub-length", type=int, default=1000,
                        help="characters of keras-hub's long words (its loop is quadratic)")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--vocab", type=int, default=16000)
    return parser.parse_args(argv)


def training_text(rng: random.Random) -> list[str]:
    with open(os.path.join(DATA, "timemachine.txt"), encoding="utf-8") as file:
        lines = [line.strip() for line in file if line.strip()]
    with open(os.path.join(DATA, "fra-eng.txt"), encoding="utf-8") as file:
        for number, line in enumerate(file):
            if number % 2 == 0:
                lines.extend(line.rstrip("\n").split("\t"))
    lines += ["".join(rng.choices(IDEOGRAPHS, ZIPF, k=rng.randrange(5, 40))) + "。"
              for _ in range(30000)]
    lines += [" ".join(str(rng.randrange(10 ** rng.randrange(1, 8))) for _ in range(5))
              for _ in range(10000)]
    return lines


def trained_tokenizers(vocab_size: int) -> dict[str, str]:
    """`{"gpt2": dir, "llama3": dir}` of byte-level BPE `tokenizer.json` files, trained once
    and kept in the temporary directory under a hash of this file."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    with open(__file__, "rb") as file:
        key = hashlib.sha256(file.read() + str(vocab_size).encode()).hexdigest()[:12]
    root = os.path.join(tempfile.gettempdir(), f"keras_attn_tokenizer_speed_{key}")
    paths = {name: os.path.join(root, name) for name in ("gpt2", "llama3")}
    if all(os.path.isfile(os.path.join(p, "tokenizer.json")) for p in paths.values()):
        return paths
    lines = training_text(random.Random(0))
    for name, path in paths.items():
        tokenizer = Tokenizer(models.BPE(ignore_merges=name == "llama3"))
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=name == "gpt2")
        tokenizer.pre_tokenizer = byte_level if name == "gpt2" else pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_SPLIT), behavior="isolated", invert=False),
            byte_level])
        tokenizer.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                                      show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tokenizer.train_from_iterator(lines, trainer)
        os.makedirs(path, exist_ok=True)
        tokenizer.save(os.path.join(path, "tokenizer.json"))
    return paths


def long_words(rng: random.Random, length: int) -> dict[str, str]:
    return {
        "CJK": "".join(rng.choices(IDEOGRAPHS, ZIPF, k=length)),
        "digits": "".join(rng.choice("0123456789") for _ in range(length)),
        "spaces": " " * length,
        "letters": "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(length)),
    }


def ordinary_text(rng: random.Random, length: int) -> str:
    with open(os.path.join(DATA, "timemachine.txt"), encoding="utf-8") as file:
        words = file.read().split()
    start = rng.randrange(len(words) - length)
    return " ".join(words[start:start + length])[:length]


def _tests_module(name: str):
    """`tests/<name>.py`, imported by its path (the tests' fixtures are no package)."""
    import importlib.util

    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests",
                        f"{name}.py")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv=None) -> None:
    args = parse_args(argv)
    import keras_hub
    import tensorflow as tf
    from tokenizers import Tokenizer

    from keras_attn.checkpoints import load_tokenizer

    header("Tokenizers: keras_attn load_tokenizer vs tokenizers vs keras-hub BytePairTokenizer")
    paths = trained_tokenizers(args.vocab)
    rng = random.Random(1)
    with open(os.path.join(DATA, "fra-eng.txt"), encoding="utf-8") as file:
        pairs = [line.rstrip("\n").split("\t") for line in file]
    sentences = [rng.choice(rng.choice(pairs)) for _ in range(args.batch)]
    variants = args.rounds + 1  # a new long text for every call (one warm-up call)
    rows = []  # (row, keras_attn s, tokenizers s, keras-hub s or None)

    tf.function(lambda x: x + 1)(tf.constant(1))  # TensorFlow's own first-function cost
    ours, refs, encoders = {}, {}, {}
    for name, path in paths.items():
        refs[name] = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        start = time.perf_counter()
        ours[name] = load_tokenizer(path)
        print(f"{name}: vocabulary {refs[name].get_vocab_size()}, keras_attn load "
              f"{time.perf_counter() - start:.1f} s")
    spec = refs["gpt2"].to_str()
    import json

    model = json.loads(spec)["model"]
    hub = keras_hub.tokenizers.BytePairTokenizer(
        vocabulary=model["vocab"], merges=[" ".join(m) for m in model["merges"]])
    hub_encode = tf.function(hub.tokenize)
    hub_decode = tf.function(hub.detokenize)
    first_call = {}
    for name in paths:
        encoders[name] = ours[name].encode
        start = time.perf_counter()
        encoders[name](["warm up"])
        first_call[name] = time.perf_counter() - start
    start = time.perf_counter()
    hub_encode(tf.constant(["warm up"]))
    first_call["hub"] = time.perf_counter() - start
    rows.append(("first encode call (trace + run), GPT-2", first_call["gpt2"], None,
                 first_call["hub"]))

    def check(name, texts):
        got = encoders[name](texts).to_list()
        assert got == [e.ids for e in refs[name].encode_batch(texts)], f"{name} differs"

    def side_by_side(label, name, texts_per_call, hub_ok=True, cold=False):
        """Time keras_attn, tokenizers (and keras-hub) on `texts_per_call[i]` at call i."""
        calls = {"keras_attn": iter(texts_per_call), "tokenizers": iter(texts_per_call)}
        check(name, texts_per_call[0])
        fns = {
            "keras_attn": lambda: encoders[name](next(calls["keras_attn"])),
            "tokenizers": lambda: refs[name].encode_batch(next(calls["tokenizers"])),
        }
        if cold:
            reference = refs[name]

            def fresh_reference():
                reference.model._clear_cache()
                return reference.encode_batch(next(calls["tokenizers"]))

            fns["tokenizers"] = fresh_reference
        if hub_ok:
            calls["keras-hub"] = iter(texts_per_call)
            fns["keras-hub"] = lambda: hub_encode(tf.constant(next(calls["keras-hub"])))
        times = time_alternating(fns, len(texts_per_call) - 1)
        rows.append((label, median(times["keras_attn"]), median(times["tokenizers"]),
                     median(times["keras-hub"]) if hub_ok else None))

    text = ordinary_text(rng, args.length)
    side_by_side(f"encode warm: batch of {args.batch} sentences", "gpt2",
                 [sentences] * variants)
    side_by_side(f"encode warm: {args.length:,} characters of ordinary words", "gpt2",
                 [[text]] * variants)
    # cold: every cache off (keras_attn: a second tokenizer traced without its cache)
    cold = load_tokenizer(paths["gpt2"])
    cold.merger.cache_size = 0  # read when the first call traces
    texts = [[ordinary_text(rng, args.length)] for _ in range(variants)]
    cold.encode(texts[0])
    reference = refs["gpt2"]
    calls = {"keras_attn": iter(texts), "tokenizers": iter(texts)}

    def cold_reference():
        reference.model._clear_cache()
        return reference.encode_batch(next(calls["tokenizers"]))

    times = time_alternating({
        "keras_attn": lambda: cold.encode(next(calls["keras_attn"])),
        "tokenizers": cold_reference}, args.rounds, warmup=0)
    sentence_cold = median(times["keras_attn"])
    rows.append((f"encode cold: {args.length:,} characters of ordinary words", sentence_cold,
                 median(times["tokenizers"]), None))
    long_rows = {}
    for kind in ("CJK", "digits", "spaces", "letters"):
        name = "llama3" if kind == "spaces" else "gpt2"
        texts = [[long_words(random.Random(seed), args.length)[kind]]
                 for seed in range(variants)]
        side_by_side(f"encode cold: one {args.length:,}-character word of {kind}"
                     + (" (Llama 3 split)" if name == "llama3" else ""), name, texts,
                     hub_ok=False, cold=True)
        long_rows[kind] = rows[-1][1]
        if name == "gpt2":  # keras-hub once, on a shorter word
            short = long_words(random.Random(99), args.hub_length)[kind]
            start = time.perf_counter()
            hub_encode(tf.constant([short]))
            hub_time = time.perf_counter() - start
            note = f"{hub_time * 1000:.0f} ms at {args.hub_length:,} characters"
            rows[-1] = (*rows[-1][:3], note)
    # decode: the 256 sentences' ids, every kind
    checkpoint_fixtures = _tests_module("checkpoint_fixtures")

    decoders = {"byte-level BPE (GPT-2)": (ours["gpt2"], refs["gpt2"], True)}
    for kind, label in (("sentencepiece", "SentencePiece (Llama 2)"),
                        ("wordpiece", "WordPiece (BERT)")):
        directory = checkpoint_fixtures.tokenizer_dir(kind)
        decoders[label] = (load_tokenizer(directory),
                           Tokenizer.from_file(os.path.join(directory, "tokenizer.json")), False)
    for label, (tokenizer, reference, with_hub) in decoders.items():
        ids = [e.ids for e in reference.encode_batch(sentences)]
        ragged = tf.ragged.constant(ids, tf.int32)  # what `encode` returns
        decode = tokenizer.decode
        got = [t.decode() for t in decode(ragged).numpy()]
        assert got == reference.decode_batch(ids), label
        fns = {"keras_attn": lambda d=decode, r=ragged: d(r),
               "tokenizers": lambda ref=reference, i=ids: ref.decode_batch(i)}
        if with_hub:
            fns["keras-hub"] = lambda r=ragged: hub_decode(r)
        times = time_alternating(fns, args.rounds)
        rows.append((f"decode: batch of {args.batch}, {label}", median(times["keras_attn"]),
                     median(times["tokenizers"]),
                     median(times["keras-hub"]) if with_hub else None))

    print(f"\n{args.rounds} alternating rounds, medians; keras-hub in tf.function\n")
    print("| workload | keras_attn ms | tokenizers ms | keras-hub ms | keras_attn / tokenizers |")
    print("|---|---|---|---|---|")
    for label, ours_s, ref_s, hub_s in rows:
        ref_text = "—" if ref_s is None else f"{ref_s * 1000:.2f}"
        hub_text = hub_s if isinstance(hub_s, str) else (
            "—" if hub_s is None else f"{hub_s * 1000:.1f}")
        ratio = "—" if ref_s is None else f"{ours_s / ref_s:.2f}"
        print(f"| {label} | {ours_s * 1000:.1f} | {ref_text} | {hub_text} | {ratio} |")
    print(f"\nkeras_attn, a {args.length:,}-character word / {args.length:,} characters of "
          "ordinary words (cold): " + ", ".join(
              f"{kind} {value / sentence_cold:.2f}" for kind, value in long_rows.items()))


if __name__ == "__main__":
    main()
