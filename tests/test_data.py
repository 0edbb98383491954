"""Tests of keras_attn.data: kernel regression data, dates task, tab-separated pair loader."""

import ast
import calendar
import datetime
import pathlib
import re

import numpy as np
import pytest
import tensorflow as tf

from keras_attn.data import dates, nw, pairs
from keras_attn.data.translation import BOS_ID, EOS_ID, PAD_ID, UNK_ID, build_vectorizer

pytestmark = pytest.mark.tf_only  # tf.data, SavedModels, the examples

# ---------------------------------------------------------------- kernel regression data


def test_kernel_regression_data_shapes_and_values():
    data = nw.make_kernel_regression_data(seed=0)
    for array in data:
        assert array.shape == (50,) and array.dtype == np.float32
    assert np.all(np.diff(data.x_train) >= 0)
    assert 0 <= data.x_train.min() and data.x_train.max() < 5
    np.testing.assert_allclose(data.x_test, np.arange(50) * 0.1, atol=1e-6)
    expected = (
        2 * np.sin(data.x_test.astype(np.float64))
        + data.x_test.astype(np.float64) ** 0.8
    )
    np.testing.assert_allclose(data.y_truth, expected, rtol=1e-6)
    np.testing.assert_allclose(
        nw.true_function([0.0, 1.0]), [0.0, 2 * np.sin(1.0) + 1.0], rtol=1e-6
    )
    residual = data.y_train - nw.true_function(data.x_train)
    assert 0.3 < residual.std() < 0.7  # N(0, 0.5^2) noise


def test_kernel_regression_data_is_seeded():
    a, b = (
        nw.make_kernel_regression_data(seed=3),
        nw.make_kernel_regression_data(seed=3),
    )
    c = nw.make_kernel_regression_data(seed=4)
    np.testing.assert_array_equal(a.y_train, b.y_train)
    assert not np.array_equal(a.x_train, c.x_train)
    assert nw.make_kernel_regression_data(n_train=7).x_train.shape == (7,)
    clean = nw.make_kernel_regression_data(noise=0.0)
    np.testing.assert_array_equal(clean.y_train, nw.true_function(clean.x_train))
    with pytest.raises(ValueError, match="n_train"):
        nw.make_kernel_regression_data(n_train=0)


# ---------------------------------------------------------------- dates


@pytest.fixture(scope="module")
def date_splits():
    return dates.load_dates(num_examples=3000, seed=0)


_MONTH = {name.lower(): i for i, name in enumerate(calendar.month_name) if name}
_WEEKDAYS = [
    name.lower() for name in calendar.day_name
]  # monday first, as date.weekday()


def _independent_parse(source):
    """Parses the formats that strptime or a regex can read without the library's code."""
    for fmt in (
        "%m/%d/%Y",
        "%d.%m.%Y",
        "%Y/%m/%d",
        "%d %b %Y",
        "%b %d, %Y",
        "%d %B %Y",
        "%A, %B %d %Y",
        "%A %d %B %Y",
        "%d-%b-%Y",
        "%Y-%m-%d",
        "%a %b %d %Y",
    ):
        try:
            return datetime.datetime.strptime(source, fmt).date()
        except ValueError:
            pass
    match = re.fullmatch(r"(\d+)/(\d+)/(\d\d)", source)  # m/d/yy, pivot 50
    if match:
        month, day, yy = map(int, match.groups())
        return datetime.date(2000 + yy if yy < 50 else 1900 + yy, month, day)
    match = re.fullmatch(
        r"(?:the )?(\d+)(?:st|nd|rd|th)(?: of)? ([a-z]+),? (\d{4})", source
    )
    if match:
        return datetime.date(int(match[3]), _MONTH[match[2]], int(match[1]))
    return None


def test_dates_targets_are_the_written_dates(date_splits):
    pairs_ = date_splits.train + date_splits.validation + date_splits.test
    parsed = 0
    for source, target in pairs_:
        date = datetime.date.fromisoformat(target)
        assert dates.FIRST_DATE <= date <= dates.LAST_DATE
        assert source == source.lower()
        first = source.split()[0].rstrip(",")
        if first in _WEEKDAYS or first in {w[:3] for w in _WEEKDAYS}:
            assert _WEEKDAYS[date.weekday()].startswith(first), (source, target)
        independent = _independent_parse(source)
        if independent is not None:
            assert independent == date, (source, target)
            parsed += 1
    assert parsed > len(pairs_) // 2


def test_dates_many_formats_appear(date_splits):
    sources = [s for s, _ in date_splits.train]
    assert any("/" in s and len(s.split("/")[-1]) == 2 for s in sources)  # 3/3/21
    assert any(re.search(r"\d(st|nd|rd|th)\b", s) for s in sources)  # ordinal suffix
    assert any("twenty-" in s or "third" in s for s in sources)  # ordinal words
    assert any(re.match(r"(mon|tue|wed|thu|fri|sat|sun),", s) for s in sources)
    assert any(
        re.search(r"\b(jan|feb|mar|apr|jun|jul|aug|sep|oct|nov|dec)\b", s)
        for s in sources
    )
    shapes = {re.sub(r"[0-9]+", "N", re.sub(r"[a-z]+", "w", s)) for s in sources}
    assert len(shapes) >= 12
    assert len(dates.FORMATS) >= 12


def test_ordinals_and_two_digit_years():
    assert dates.format_date(datetime.date(2021, 3, 3), "{ord} {ordw}") == "3rd third"
    assert (
        dates.format_date(datetime.date(2021, 3, 22), "{ord} {ordw}")
        == "22nd twenty-second"
    )
    assert dates.format_date(datetime.date(2021, 3, 11), "{ord}") == "11th"
    assert (
        dates.format_date(datetime.date(1950, 3, 31), "{ord} {ordw} {yy}")
        == "31st thirty-first 50"
    )
    assert dates.format_date(datetime.date(2021, 3, 6), 0) == "saturday, march 6 2021"


def test_dates_splits_disjoint_sizes_and_deterministic(date_splits):
    train, val, test = ({s for s, _ in split} for split in date_splits)
    assert (len(train), len(val), len(test)) == (2400, 300, 300)
    assert not (train & val or train & test or val & test)
    assert dates.load_dates(num_examples=3000, seed=0) == date_splits
    assert dates.load_dates(num_examples=3000, seed=1) != date_splits
    with pytest.raises(ValueError, match="splits"):
        dates.load_dates(10, splits=(0.5, 0.5, 0.5))


@pytest.mark.parametrize(
    "text, tokens",
    [
        ("Saturday, March 3rd 2021", "saturday , march 3 rd 2 0 2 1"),
        ("3/3/21", "3 / 3 / 2 1"),
        ("march 3, '21", "march 3 , ' 2 1"),
        ("2021-03-03", "2 0 2 1 - 0 3 - 0 3"),
        ("the twenty-first of may 1999", "the twenty - first of may 1 9 9 9"),
    ],
)
def test_dates_tokens(text, tokens):
    assert dates.to_tokens(text) == tokens
    assert dates.to_tokens_tf(tf.constant([text]))[0].numpy().decode() == tokens


def test_dates_token_round_trip(date_splits):
    for source, target in date_splits.test:
        assert dates.from_tokens(dates.to_tokens(target)) == target
        assert dates.from_tokens(dates.to_tokens(target).split()) == target
        assert dates.from_tokens(dates.to_tokens(source)) == source.replace(" ", "")
    sources = [s for s, _ in date_splits.test[:50]]
    graph = dates.to_tokens_tf(tf.constant(sources)).numpy()
    assert [g.decode() for g in graph] == [dates.to_tokens(s) for s in sources]


def test_dates_translation_pipeline():
    data = dates.load_dates_translation(num_examples=500, seed=0)
    assert (
        data.source_length == dates.max_source_tokens() == 11
        and data.target_length == 11
    )
    assert all(len(s.split()) <= data.source_length for s, _ in data.train + data.test)
    # Target vocabulary: the reserved four, ten digits and "-".
    assert data.target_vocab_size == 15
    (source, target_in), target_out = next(
        iter(data.make_dataset("train", batch_size=16))
    )
    assert (
        source.dtype == tf.int32
        and source.shape == (16, 11)
        and target_in.shape == (16, 11)
    )
    np.testing.assert_array_equal(target_in[:, 0], BOS_ID)
    np.testing.assert_array_equal(target_out[:, 10], EOS_ID)
    np.testing.assert_array_equal(target_in[:, 1:], target_out[:, :-1])
    assert data.decode(target_out) == [t.replace(" ", "") for _, t in data.train[:16]]
    raw = dates.load_dates(num_examples=500, seed=0)
    assert data.decode(target_in.numpy()[0]) == [raw.train[0][1]]
    np.testing.assert_array_equal(data.encode_source([raw.train[0][0]])[0], source[0])


@pytest.mark.parametrize("loader", ["dates", "tatoeba"])
def test_standardize_tf_inside_a_graph_matches_encode_source(loader, tsv):
    if loader == "dates":
        data = dates.load_dates_translation(num_examples=300)
        raw = [s for s, _ in dates.load_dates(num_examples=300).test] + [
            "Sat, 3 MAR 21"
        ]
    else:
        data = pairs.load_tatoeba(tsv, min_freq=1, verbose=0)
        raw = ["Go now,ok?", "Wow\xa0!", "I ran.", "Ça alors\u202f!"]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.string)])
    def encode(texts):  # what an exported SavedModel does with raw strings
        return data.source_vectorizer(data.standardize_tf(texts))

    graph_ids = encode(tf.constant(raw)).numpy()
    np.testing.assert_array_equal(graph_ids, data.encode_source(raw))


# ---------------------------------------------------------------- tab-separated pairs

_TSV = (
    "Go.\tVa !\tCC-BY 2.0 (France) Attribution: tatoeba.org #2877272\n"
    "Hi.\tSalut !\n"
    "Run!\tCours\u202f!\n"
    "Run!\tCourez\u202f!\n"
    "Who?\tQui ?\n"
    "Wow!\tÇa alors\xa0!\n"
    "no tab on this line\n"
    "Empty target.\t   \n"
    "\tEmpty source.\n"
    "\n"
    "Go now,ok?\tVa maintenant, d'accord ?\n"
    "I go.\tJe vais.\n"
    "I ran.\tJ'ai couru.\n"
    "I go now.\tJe vais maintenant.\n"
    "Go go go.\tVa va va.\n"
)


@pytest.fixture()
def tsv(tmp_path):
    path = tmp_path / "fra.txt"
    path.write_text(_TSV, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize(
    "text, expected",
    [
        ("Go.", "go ."),
        ("Cours\u202f!", "cours !"),
        ("Ça alors\xa0!", "ça alors !"),
        ("Go now,ok?", "go now ,ok ?"),  # d2l adds no space after a mark
        ("Hello  , world!!", "hello , world ! !"),
        ("J'ai couru.", "j'ai couru ."),
        (" Va ! ", "va !"),
    ],
)
def test_preprocess(text, expected):
    assert pairs.preprocess(text) == expected
    assert pairs.preprocess_tf(tf.constant(text)).numpy().decode("utf-8") == expected


def test_read_pairs_skips_and_counts_malformed_lines(tsv):
    read, skipped = pairs.read_pairs(tsv, verbose=0)
    assert (
        skipped == 3
    )  # no tab, empty target, empty source; the blank line is not counted
    assert read[0] == ("go .", "va !")
    assert ("run !", "courez !") in read and ("wow !", "ça alors !") in read
    assert ("go now ,ok ?", "va maintenant , d'accord ?") in read
    assert len(read) == 11
    assert pairs.read_pairs(tsv, num_examples=4, verbose=0)[0] == read[:4]


def test_load_tatoeba_vocab_split_and_dataset(tsv):
    data = pairs.load_tatoeba(
        tsv, min_freq=2, max_length=(4, 5), test_fraction=0.3, seed=0, verbose=0
    )
    assert data.num_skipped == 3
    vocab = data.target_vectorizer.get_vocabulary()
    assert vocab[:4] == ["", "[UNK]", "<bos>", "<eos>"]
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)
    assert data.source_vectorizer.get_vocabulary()[:4] == vocab[:4]
    train_sources = {s for s, _ in data.train}
    assert train_sources and not train_sources & {s for s, _ in data.test}
    # The one target of 5 tokens needs 6 positions with <eos>: dropped and counted, not cut.
    assert data.num_too_long == 1
    kept = data.train + data.test
    assert len(kept) == 10 and data.validation == []
    assert ("go now ,ok ?", "va maintenant , d'accord ?") not in kept
    # The vocabulary comes from train only, with words seen at least twice.
    train_counts = {}
    for _, target in data.train:
        for word in target.split():
            train_counts[word] = train_counts.get(word, 0) + 1
    assert set(vocab[4:]) == {w for w, c in train_counts.items() if c >= 2}

    batch = next(iter(data.make_dataset(kept, batch_size=10)))
    (source, target_in), target_out = batch
    assert source.dtype == target_in.dtype == target_out.dtype == tf.int32
    assert (
        source.shape == (10, 4)
        and target_in.shape == (10, 5)
        and target_out.shape == (10, 5)
    )
    ids = data.target_vectorizer(tf.constant(["va va va", "zzzunseen"])).numpy()
    assert ids[1, 0] == UNK_ID
    np.testing.assert_array_equal(target_in[:, 0], BOS_ID)
    for row, (_, target) in zip(target_out.numpy(), kept):
        words = target.split()  # every kept target ends with <eos> then padding
        assert row[len(words)] == EOS_ID and np.all(row[len(words) + 1 :] == PAD_ID)
    # New text is still truncated: "go now ,ok ?" has 4 source tokens, "hi ." 2 and then
    # padding; 5 tokens are cut to 4.
    encoded = data.encode_source(["Go now,ok?", "Hi.", "i i i i i"])
    assert (
        encoded.shape == (3, 4) and encoded[1, 2] == PAD_ID and encoded[0, 3] != PAD_ID
    )
    assert len(set(encoded[2].tolist())) == 1 and encoded[2, 0] > UNK_ID


def test_load_tatoeba_rare_words_are_unknown_and_decode(tsv):
    data = pairs.load_tatoeba(tsv, min_freq=1, test_fraction=0.0, verbose=0)
    # Fewer than 10 lengths: the 90th percentile is the longest, so nothing is dropped.
    assert data.source_length == 4 and data.target_length == 6  # longest + 1 for <eos>
    assert data.num_too_long == 0 and len(data.train) == 11
    _, _, target_out = data.encode_pairs(data.train)
    assert data.decode(target_out) == [t for _, t in data.train]
    rare = pairs.load_tatoeba(tsv, min_freq=3, test_fraction=0.0, verbose=0)
    source_ids = rare.encode_source(["I ran."])[0]
    assert source_ids[1] == UNK_ID  # "ran" is seen once
    assert rare.source_vectorizer.get_vocabulary()[source_ids[0]] == "i"


def test_load_tatoeba_deterministic_with_seed(tsv):
    def first_batches(seed):
        data = pairs.load_tatoeba(
            tsv, min_freq=1, test_fraction=0.3, seed=seed, verbose=0
        )
        dataset = data.make_dataset("train", batch_size=4, shuffle=True, seed=seed)
        return data.test, [b[1].numpy().tolist() for b in dataset]

    assert first_batches(1) == first_batches(1)
    assert any(first_batches(1)[0] != first_batches(s)[0] for s in (2, 3, 4))


def test_load_tatoeba_errors(tsv, tmp_path):
    with pytest.raises(ValueError, match="path"):
        pairs.load_tatoeba()
    with pytest.raises(ValueError, match="test_fraction"):
        pairs.load_tatoeba(tsv, test_fraction=1.0, verbose=0)
    bad = tmp_path / "bad.txt"
    bad.write_text("no tabs\nat all\n", encoding="utf-8")
    with pytest.raises(ValueError, match="path"):
        pairs.load_tatoeba(str(bad), verbose=0)
    data = pairs.load_tatoeba(tsv, verbose=0)
    with pytest.raises(ValueError, match="pairs"):
        data.make_dataset("dev")


def test_build_vectorizer_orders_by_frequency():
    layer = build_vectorizer(["b a b", "c b a", "<eos> d"], max_length=3, min_freq=2)
    assert layer.get_vocabulary() == ["", "[UNK]", "<bos>", "<eos>", "b", "a"]
    np.testing.assert_array_equal(layer(tf.constant(["a d b a"])), [[5, 1, 4]])
    with pytest.raises(ValueError, match="min_freq"):
        build_vectorizer(["a"], max_length=3, min_freq=0)


def test_load_tatoeba_70k_lines(tmp_path):
    rng = np.random.default_rng(0)
    words = np.array([f"w{i}" for i in range(3000)])
    lines = [
        f"{' '.join(rng.choice(words, 6))}.\t{' '.join(rng.choice(words, 8))}\u202f!\tCC-BY\n"
        for _ in range(70000)
    ]
    path = tmp_path / "big.txt"
    path.write_text("".join(lines), encoding="utf-8")  # a real export's size, ~2 s
    data = pairs.load_tatoeba(str(path), max_length=10, verbose=0)
    assert len(data.train) + len(data.test) == 70000
    assert sum(1 for _ in data.make_dataset("train", batch_size=256)) == -(
        -len(data.train) // 256
    )


# ---------------------------------------------------------------- reserved token ids


def test_reserved_ids_come_from_keras_attn_tokens():
    from keras_attn import data as data_package
    from keras_attn import export, metrics, tokens
    from keras_attn.data import translation

    for module in (translation, data_package):
        for name in ("PAD_ID", "UNK_ID", "BOS_ID", "EOS_ID", "BOS", "EOS", "RESERVED_TOKENS"):
            assert getattr(module, name) is getattr(tokens, name), (module.__name__, name)
    assert metrics.PAD_ID is tokens.PAD_ID
    assert translation.RESERVED_TOKENS is tokens.RESERVED_TOKENS
    assert build_vectorizer(["a"], max_length=2).get_vocabulary()[:4] == list(
        tokens.RESERVED_TOKENS
    )
    # No module defines its own copy: no assignment to a reserved name, no "<bos>" literal.
    names = {"PAD_ID", "UNK_ID", "BOS_ID", "EOS_ID", "FIRST_WORD_ID", "PAD", "UNK", "BOS",
             "EOS", "RESERVED_TOKENS", "_UNK_ID", "_FIRST_WORD_ID", "_PAD_ID"}
    sources = [*pathlib.Path(data_package.__file__).parent.glob("*.py"),
               pathlib.Path(metrics.__file__), pathlib.Path(export.__file__)]
    assert len(sources) >= 7
    for source in sources:
        tree = ast.parse(source.read_text(encoding="utf-8"))
        docstrings = {
            id(node.body[0].value)
            for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
            and node.body and isinstance(node.body[0], ast.Expr)
        }
        for node in ast.walk(tree):
            if isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                assigned = {t.id for t in targets if isinstance(t, ast.Name)}
                assert not assigned & names, (source.name, node.lineno, assigned & names)
            is_string = isinstance(node, ast.Constant) and isinstance(node.value, str)
            if is_string and id(node) not in docstrings:
                assert not {"<bos>", "<eos>", "[UNK]"} & set(node.value.split()), (
                    source.name, node.lineno, node.value
                )


# ---------------------------------------------------------------- load_tatoeba inputs


def _write(tmp_path, text, name="pairs.txt", encoding="utf-8"):
    path = tmp_path / name
    path.write_bytes(text.encode(encoding) if isinstance(text, str) else text)
    return str(path)


def test_byte_order_mark_is_dropped(tmp_path):
    path = _write(tmp_path, "\ufeff" + _TSV)
    read, skipped = pairs.read_pairs(path, verbose=0)
    assert read[0] == ("go .", "va !")
    assert (read, skipped) == pairs.read_pairs(_write(tmp_path, _TSV, "plain.txt"), verbose=0)
    data = pairs.load_tatoeba(path, min_freq=1, test_fraction=0.0, verbose=0)
    vocab = data.source_vectorizer.get_vocabulary()
    assert "go" in vocab and not any("\ufeff" in word for word in vocab)
    # Only the mark at the start of the file is dropped: inside a line it is data.
    read, _ = pairs.read_pairs(_write(tmp_path, "a\ufeffb.\tc.\n", "inner.txt"), verbose=0)
    assert read == [("a\ufeffb .", "c .")]


def test_windows_and_old_mac_line_ends(tmp_path):
    expected, _ = pairs.read_pairs(_write(tmp_path, _TSV, "unix.txt"), verbose=0)
    for name, newline in (("dos.txt", "\r\n"), ("mac.txt", "\r")):
        path = _write(tmp_path, _TSV.replace("\n", newline), name)
        assert pairs.read_pairs(path, verbose=0) == (expected, 3)


def _short_pairs(num_pairs=50):
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(40)]
    lines, lengths = [], []
    for _ in range(num_pairs):
        source = rng.choice(words, rng.integers(2, 7)).tolist()
        target = rng.choice(words, rng.integers(2, 8)).tolist()
        lines.append(f"{' '.join(source)}.\t{' '.join(target)}.\n")
        lengths.append((len(source) + 1, len(target) + 1))  # "." is a token
    return lines, lengths


def test_group_by_length_batches_equal_lengths_cut_to_their_longest(tmp_path):
    lines, _ = _short_pairs(120)
    path = tmp_path / "pairs.txt"
    path.write_text("".join(lines), encoding="utf-8")
    data = pairs.load_tatoeba(str(path), max_length=(8, 9), test_fraction=0.1, seed=0,
                              verbose=0)

    def rows(dataset):
        """Every example of the dataset, its padding removed, and the batches' shapes."""
        found, shapes = [], []
        for (source, target_in), target_out in dataset:
            shapes.append((source.shape, target_in.shape, target_out.shape))
            for s, t_in, t_out in zip(source.numpy(), target_in.numpy(), target_out.numpy()):
                found.append((tuple(s[s != 0]), tuple(t_in[t_in != 0]),
                              tuple(t_out[t_out != 0])))
        return found, shapes

    padded, padded_shapes = rows(data.make_dataset("train", batch_size=8))
    grouped_dataset = data.make_dataset("train", batch_size=8, shuffle=True, seed=1,
                                        group_by_length=True)
    grouped, shapes = rows(grouped_dataset)
    assert sorted(grouped) == sorted(padded)  # every pair once, nothing cut but padding
    assert int(grouped_dataset.cardinality()) == len(shapes)  # declared for Keras' progress bar
    assert {shape[0][1] for shape in padded_shapes} == {data.source_length}
    start = 0
    for source_shape, target_in_shape, target_out_shape in shapes:
        batch = grouped[start:start + source_shape[0]]
        start += source_shape[0]
        assert source_shape[0] <= 8 and target_in_shape == target_out_shape
        # one length per batch: the longer side of each pair
        assert len({max(len(s), len(t)) for s, t, _ in batch}) == 1
        # cut to the batch's longest sentence on each side, no further
        assert source_shape[1] == max(len(s) for s, _, _ in batch)
        assert target_in_shape[1] == max(len(t) for _, t, _ in batch)
    assert len({shape[0][1] for shape in shapes}) > 1  # lengths vary from batch to batch
    grouped_positions = sum(s[0] * s[1] + t[0] * t[1] for s, t, _ in shapes)
    padded_positions = sum(s[0] * s[1] + t[0] * t[1] for s, t, _ in padded_shapes)
    assert grouped_positions < 0.8 * padded_positions
    # drop_remainder keeps only full batches
    full = data.make_dataset("train", batch_size=8, group_by_length=True, drop_remainder=True)
    assert all(source.shape[0] == 8 for (source, _), _ in full)
    assert int(full.cardinality()) == sum(1 for _ in full)
    with pytest.raises(ValueError, match="group_by_length"):
        data.make_dataset("train", batch_size=8, group_by_length="yes")


@pytest.mark.parametrize("long_side", ["source", "target", "both"])
@pytest.mark.parametrize("seed, runaway_split", [(0, 0), (3, 2)])  # 0 train, 2 test
def test_one_runaway_line_does_not_set_the_lengths(
    tmp_path, capsys, long_side, seed, runaway_split
):
    lines, lengths = _short_pairs()
    runaway = " ".join(f"long{i}" for i in range(300)) + "."
    source, target = ("x y.", "z t.")
    if long_side in ("source", "both"):
        source = runaway
    if long_side in ("target", "both"):
        target = runaway
    lines.insert(17, f"{source}\t{target}\n")
    path = _write(tmp_path, "".join(lines))
    # The runaway pair lands in training (it would set the lengths) or in test (it would be cut).
    splits = pairs.split_by_source(pairs.read_pairs(path, verbose=0)[0], seed=seed)
    assert any("long0" in s + t for s, t in splits[runaway_split])
    capsys.readouterr()
    data = pairs.load_tatoeba(path, min_freq=1, seed=seed, verbose=1)
    longest_source = max(s for s, _ in lengths)
    longest_target = max(t for _, t in lengths)
    # Lengths near the short pairs (at most their longest), nowhere near 300.
    assert 3 <= data.source_length <= longest_source
    assert 3 <= data.target_length <= longest_target + 1
    kept = data.train + data.validation + data.test
    assert data.num_too_long == 1 and len(kept) == 50
    assert not any("long0" in s or "long0" in t for s, t in kept)
    assert all(len(s.split()) <= data.source_length for s, _ in kept)
    assert all(len(t.split()) < data.target_length for _, t in kept)
    (source_ids, target_in), _ = next(iter(data.make_dataset("train", batch_size=64)))
    assert source_ids.shape[1] == data.source_length
    assert target_in.shape[1] == data.target_length
    assert "dropped 1 pairs longer than" in capsys.readouterr().out


def test_typical_length():
    assert pairs.typical_length([3, 4, 5, 4, 3, 4, 6, 4, 3, 300]) == 6
    assert pairs.typical_length([3, 4, 5, 4, 300]) == 300  # under 10 lengths: the longest
    assert pairs.typical_length([7]) == 7
    assert pairs.typical_length([5] * 95 + [9, 10, 10, 11, 40]) == 10  # 2 * p90 = 10
    assert pairs.typical_length(list(range(1, 101))) == 100  # 2 * 90 covers everything
    with pytest.raises(ValueError, match="lengths"):
        pairs.typical_length([])


def test_explicit_max_length_drops_and_counts_what_does_not_fit(tmp_path, capsys):
    lines, lengths = _short_pairs()
    path = _write(tmp_path, "".join(lines))
    data = pairs.load_tatoeba(path, min_freq=1, max_length=5, test_fraction=0.2, verbose=1)
    too_long = sum(1 for s, t in lengths if s > 5 or t + 1 > 5)
    assert 0 < too_long < 50
    assert data.num_too_long == too_long
    assert (data.source_length, data.target_length) == (5, 5)
    kept = data.train + data.test
    assert len(kept) == 50 - too_long
    assert all(len(s.split()) <= 5 and len(t.split()) <= 4 for s, t in kept)
    assert f"dropped {too_long} pairs longer than 5 source or 4 target tokens" in (
        capsys.readouterr().out
    )
    wide = pairs.load_tatoeba(path, min_freq=1, max_length=(7, 9), verbose=0)
    assert wide.num_too_long == 0 and len(wide.train + wide.test) == 50


@pytest.mark.parametrize("max_length", [0, -3, (4,), (4, 5, 6), (4, 0), 2.5, "10"])
def test_invalid_max_length(tsv, max_length):
    with pytest.raises(ValueError, match="max_length"):
        pairs.load_tatoeba(tsv, max_length=max_length, verbose=0)


def test_max_length_that_fits_no_training_pair(tsv):
    # Every target has at least 2 tokens, so 3 positions with <eos> is the least that fits.
    with pytest.raises(ValueError, match="max_length=2"):
        pairs.load_tatoeba(tsv, max_length=2, verbose=0)


def test_missing_path_and_directory(tmp_path):
    missing = str(tmp_path / "nowhere" / "fra.txt")
    for bad, what in ((missing, "no such file"), (str(tmp_path), "a directory")):
        with pytest.raises(ValueError, match="`path`") as info:
            pairs.load_tatoeba(bad, verbose=0)
        assert f"path={bad!r}" in str(info.value) and what in str(info.value)
        with pytest.raises(ValueError, match="`path`"):
            pairs.read_pairs(bad, verbose=0)
    with pytest.raises(ValueError, match="`path`"):
        pairs.read_pairs(3, verbose=0)
    # A pathlib.Path is a path too.
    read, _ = pairs.read_pairs(pathlib.Path(_write(tmp_path, _TSV)), verbose=0)
    assert len(read) == 11


def test_invalid_utf8_names_path_and_line(tmp_path):
    text = "Go.\tVa !\nHi.\tSalut !\nWow!\tÇa alors !\nRun!\tCours !\n"
    path = _write(tmp_path, text, "latin1.txt", encoding="latin-1")  # "Ç" is b"\xc7"
    for load in (pairs.read_pairs, pairs.load_tatoeba):
        with pytest.raises(ValueError, match="UTF-8") as info:
            load(path, verbose=0)
        message = str(info.value)
        assert "`path`" in message and f"path={path!r}" in message
        assert "line 3" in message and "\\xc7" in message
    # The same text in UTF-8 reads without a replacement character.
    read, _ = pairs.read_pairs(_write(tmp_path, text, "utf8.txt"), verbose=0)
    assert ("wow !", "ça alors !") in read and not any("\ufffd" in s + t for s, t in read)


def test_split_that_leaves_no_training_pair(tmp_path):
    path = _write(tmp_path, "Go.\tVa !\n")
    with pytest.raises(ValueError, match="test_fraction"):
        pairs.load_tatoeba(path, test_fraction=0.6, verbose=0)
    assert len(pairs.load_tatoeba(path, test_fraction=0.4, verbose=0).train) == 1


def test_num_examples_is_checked(tsv):
    with pytest.raises(ValueError, match="num_examples"):
        pairs.read_pairs(tsv, num_examples=0, verbose=0)
    assert len(pairs.read_pairs(tsv, num_examples=2, verbose=0)[0]) == 2
