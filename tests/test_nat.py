"""The non-autoregressive translator: CMLM model, masked training data, Mask-Predict, export."""

import math

import keras
import numpy as np
import pytest
from backend_utils import as_np, assert_allclose, assert_array_equal
from reference import log_softmax

from keras_attn.decoding import mask_predict
from keras_attn.layers import AttentionConfig, BlockConfig, TransformerDecoderBlock
from keras_attn.models import (
    CMLMDecoder,
    compile_cmlm,
    initialize_from_seq2seq,
    nat_seq2seq,
    transformer_seq2seq,
)
from keras_attn.tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID, mask_id

SOURCE_VOCAB, TARGET_VOCAB, MAX_LENGTH = 30, 12, 7
MASK = mask_id(TARGET_VOCAB)


def tiny_model(max_target_length=MAX_LENGTH, target_vocab=TARGET_VOCAB, source_vocab=SOURCE_VOCAB):
    return nat_seq2seq(source_vocab, target_vocab, num_layers=1, hidden_dim=16, num_heads=2,
                       intermediate_dim=32, dropout=0.0, max_target_length=max_target_length)


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(7)
    return tiny_model()


def sources(batch=4, length=6, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(4, SOURCE_VOCAB, size=(batch, length)).astype("int32")
    ids[1, 3:] = PAD_ID  # a padded source
    return ids


# ---- the model ---------------------------------------------------------------------------------


def test_shapes_dtypes_and_mask_token_outside_the_vocabulary(model):
    src = sources()
    masked = np.full((4, MAX_LENGTH), MASK, "int32")
    masked[:, 5:] = PAD_ID
    tokens, lengths = model([src, masked])
    assert tuple(tokens.shape) == (4, MAX_LENGTH, TARGET_VOCAB)  # no column for <mask>
    assert tuple(lengths.shape) == (4, MAX_LENGTH + 1)
    assert keras.backend.standardize_dtype(tokens.dtype) == "float32"
    decoder = model.get_layer("decoder")
    assert decoder.mask_id == MASK == TARGET_VOCAB
    assert decoder.token_embedding.input_dim == TARGET_VOCAB + 1
    # Padding, <bos> and <eos> can never win: their logits are -1e9.
    assert np.all(as_np(tokens)[..., [PAD_ID, BOS_ID, EOS_ID]] <= -1e8)


def test_decoder_self_attention_is_bidirectional_and_hides_padding(model):
    src = sources()
    ids = np.array([[MASK, 5, 6, MASK, 7, 0, 0]] * 4, "int32")
    changed_later = ids.copy()
    changed_later[:, 4] = 9  # a later position: a causal decoder would not see it
    changed_padding = ids.copy()
    changed_padding[:, 6] = 9  # what was padding becomes a token
    base = as_np(model([src, ids])[0])
    assert np.abs(as_np(model([src, changed_later])[0])[:, 0] - base[:, 0]).max() > 1e-4
    # Positions after a padded one: padding is hidden, and only real keys matter.
    moved = ids.copy()
    moved[:, 5] = PAD_ID
    assert_allclose(model([src, moved])[0][:, :5], base[:, :5], atol=1e-6)
    assert np.abs(as_np(model([src, changed_padding])[0])[:, 0] - base[:, 0]).max() > 1e-4


def test_causal_flag_of_the_decoder_block():
    x, memory = np.random.rand(2, 5, 8).astype("float32"), np.random.rand(2, 3, 8)
    later = x.copy()
    later[:, 4] += 1.0
    for causal, first_changes in ((True, False), (False, True)):
        block = TransformerDecoderBlock(AttentionConfig(num_heads=2), intermediate_dim=16,
                                        causal=causal)
        diff = np.abs(as_np(block(later, memory)) - as_np(block(x, memory)))[:, 0].max()
        assert (diff > 1e-5) == first_changes
        assert TransformerDecoderBlock.from_config(block.get_config()).causal == causal
    with pytest.raises(ValueError, match="causal"):
        TransformerDecoderBlock(AttentionConfig(num_heads=2), intermediate_dim=16, causal="no")


def test_save_load_same_outputs_and_translations(model, tmp_path):
    path = str(tmp_path / "nat.keras")
    model.save(path)
    loaded = keras.saving.load_model(path)  # safe_mode=True
    src = sources()
    masked = np.array([[MASK, 5, MASK, 7, 0, 0, 0]] * 4, "int32")
    for a, b in zip(model([src, masked]), loaded([src, masked])):
        assert_allclose(a, b, atol=1e-6)
    for a, b in zip(mask_predict(model, src, iterations=3, length_beam=2),
                    mask_predict(loaded, src, iterations=3, length_beam=2)):
        assert_allclose(a, b, atol=1e-6)
    assert isinstance(loaded.get_layer("decoder"), CMLMDecoder)


# ---- Mask-Predict ------------------------------------------------------------------------------


def test_one_iteration_is_the_argmax_of_one_parallel_pass_at_the_predicted_length(model):
    src = sources()
    ids, scores, lengths = (as_np(x) for x in mask_predict(model, src, iterations=1,
                                                           return_lengths=True))
    _, length_logits = model([src, np.zeros((4, MAX_LENGTH), "int32")])
    expected_lengths = np.argmax(as_np(length_logits)[:, 1:], axis=-1) + 1  # 1..MAX_LENGTH
    assert_array_equal(lengths, expected_lengths)
    positions = np.arange(MAX_LENGTH)[None]
    masked = np.where(positions < lengths[:, None], MASK, PAD_ID).astype("int32")
    log_probs = log_softmax(as_np(model([src, masked])[0]))  # (B, T, V)
    for row, length in enumerate(lengths):
        assert_array_equal(ids[row, :length], log_probs[row, :length].argmax(-1))
        np.testing.assert_allclose(scores[row], log_probs[row, :length].max(-1).mean(),
                                   atol=1e-5)
        assert ids[row, length:].tolist() == ([EOS_ID] + [PAD_ID] * MAX_LENGTH)[
            : MAX_LENGTH - length]


def numpy_mask_predict(model, src, iterations):
    """Mask-Predict written out with NumPy around the model's forward pass (length beam 1)."""
    _, length_logits = model([src, np.zeros((len(src), MAX_LENGTH), "int32")])
    lengths = np.argmax(as_np(length_logits)[:, 1:], axis=-1) + 1
    valid = np.arange(MAX_LENGTH)[None] < lengths[:, None]
    remask = valid
    tokens = np.zeros((len(src), MAX_LENGTH), "int64")
    probs = np.zeros((len(src), MAX_LENGTH), "float32")
    for t in range(iterations):
        if t > 0:
            count = lengths * (iterations - t) // iterations
            rank = np.argsort(np.argsort(np.where(valid, probs, np.inf), kind="stable"),
                              kind="stable")
            remask = rank < count[:, None]
        ids = np.where(remask, MASK, np.where(valid, tokens, PAD_ID)).astype("int32")
        log_probs = log_softmax(as_np(model([src, ids])[0]))
        tokens = np.where(remask, log_probs.argmax(-1), tokens)
        probs = np.where(remask, log_probs.max(-1), probs)
    return tokens * valid, (probs * valid).sum(-1) / lengths, lengths


@pytest.mark.parametrize("iterations", [2, 5])
def test_iterations_match_a_numpy_mask_predict(model, iterations):
    src = sources(batch=6, seed=3)
    ids, scores, lengths = (as_np(x) for x in mask_predict(model, src, iterations=iterations,
                                                           return_lengths=True))
    tokens, expected_scores, expected_lengths = numpy_mask_predict(model, src, iterations)
    assert_array_equal(lengths, expected_lengths)
    for row, length in enumerate(lengths):
        assert_array_equal(ids[row, :length], tokens[row, :length])
    np.testing.assert_allclose(scores, expected_scores, atol=1e-5)


@pytest.mark.parametrize("iterations,length_beam", [(1, 1), (4, 1), (10, 3)])
def test_outputs_never_hold_mask_pad_bos_eos_among_the_tokens(iterations, length_beam):
    keras.utils.set_random_seed(3)
    model = tiny_model()
    # Make the reserved ids the decoder's favourites: it must still never emit them.
    dense = model.get_layer("decoder").output_dense
    bias = np.zeros(TARGET_VOCAB, "float32")
    bias[[PAD_ID, BOS_ID, EOS_ID]] = 100.0
    dense.bias.assign(bias)
    src = sources(batch=5, seed=iterations)
    ids, scores, lengths = (as_np(x) for x in mask_predict(
        model, src, iterations=iterations, length_beam=length_beam, return_lengths=True))
    assert ids.shape == (5, MAX_LENGTH) and scores.shape == (5,)
    assert not np.any(ids == MASK)
    for row, length in enumerate(lengths):
        assert 1 <= length <= MAX_LENGTH
        words = ids[row, :length]
        assert np.all((words >= 4) | (words == UNK_ID)), words
        assert ids[row, length:].tolist() == ([EOS_ID] + [PAD_ID] * MAX_LENGTH)[
            : MAX_LENGTH - length]
    assert np.all(np.isfinite(scores)) and np.all(scores <= 0)


def test_length_beam_keeps_the_best_mean_log_probability(model):
    src = sources(batch=4, seed=5)
    _, beam_scores = mask_predict(model, src, iterations=2, length_beam=3)
    _, single_scores = mask_predict(model, src, iterations=2, length_beam=1)
    # The argmax length is one of the three candidates, decoded the same way.
    assert np.all(as_np(beam_scores) >= as_np(single_scores) - 1e-6)


def test_max_length_clips_the_predicted_length(model):
    ids, _, lengths = mask_predict(model, sources(), iterations=2, max_length=2,
                                   return_lengths=True)
    assert as_np(ids).shape == (4, 2) and np.all(as_np(lengths) <= 2)


@pytest.mark.parametrize("kwargs,name", [
    ({"iterations": 0}, "iterations"),
    ({"iterations": 2.5}, "iterations"),
    ({"length_beam": 0}, "length_beam"),
    ({"length_beam": MAX_LENGTH + 1}, "length_beam"),
    ({"max_length": MAX_LENGTH + 1}, "max_length"),
    ({"max_length": 0}, "max_length"),
])
def test_mask_predict_rejects_bad_arguments(model, kwargs, name):
    with pytest.raises(ValueError, match=name):
        mask_predict(model, sources(), **{"iterations": 2, **kwargs})


def test_bad_models_and_builder_arguments_raise():
    seq2seq = transformer_seq2seq(10, 10, num_layers=1, hidden_dim=8, num_heads=2,
                                  intermediate_dim=8)
    with pytest.raises(ValueError, match="model"):
        mask_predict(seq2seq, sources(), iterations=2)
    with pytest.raises(ValueError, match="max_target_length"):
        nat_seq2seq(10, 10, num_layers=1, hidden_dim=8, num_heads=2, intermediate_dim=8)
    with pytest.raises(ValueError, match="num_heads"):
        nat_seq2seq(10, 10, 1, 8, 3, 8, 0.0, 5)
    with pytest.raises(ValueError, match="length_loss_weight"):
        compile_cmlm(tiny_model(), "adam", length_loss_weight=-1.0)


def test_initialize_from_seq2seq_copies_the_teachers_weights():
    keras.utils.set_random_seed(3)
    nat, teacher = tiny_model(), transformer_seq2seq(SOURCE_VOCAB, TARGET_VOCAB, num_layers=1,
                                                     hidden_dim=16, num_heads=2,
                                                     intermediate_dim=32, dropout=0.0)
    src = sources()
    targets = np.random.default_rng(1).integers(4, TARGET_VOCAB, (4, 5)).astype("int32")
    mask_row = as_np(nat.get_layer("decoder").embedding.token_embedding.embeddings)[MASK]
    length_kernel = as_np(nat.get_layer("length_predictor").weights[0])
    report = initialize_from_seq2seq(nat, teacher)
    assert report["copied"] == len(nat.get_layer("encoder").weights) + len(
        nat.get_layer("decoder").weights)
    assert len(report["kept"]) == len(nat.get_layer("length_predictor").weights) > 0
    # The encoders are now one function.
    ours, theirs = nat.get_layer("encoder")(src), teacher.get_layer("encoder")(src)
    assert_allclose(ours, theirs, atol=1e-6)
    # With one block the last target position sees every position under the causal mask too,
    # so the two decoders' logits agree there (on the ids the NAT may emit).
    mask = nat.get_layer("encoder").padding_mask(src)
    nat_logits = nat.get_layer("decoder")(targets, ours, encoder_padding_mask=mask)
    teacher_logits = teacher.get_layer("decoder")(targets, theirs, encoder_padding_mask=mask)
    assert_allclose(as_np(nat_logits)[:, -1, 4:], as_np(teacher_logits)[:, -1, 4:], atol=1e-5)
    assert not np.allclose(as_np(nat_logits)[:, 0, 4:], as_np(teacher_logits)[:, 0, 4:])
    # What has no counterpart keeps its initial value.
    embeddings = as_np(nat.get_layer("decoder").embedding.token_embedding.embeddings)
    assert_array_equal(embeddings[MASK], mask_row)
    assert_array_equal(as_np(nat.get_layer("length_predictor").weights[0]), length_kernel)


def test_initialize_from_seq2seq_two_pre_ln_blocks_into_a_mixed_precision_nat():
    """Final norms (pre-LN), two blocks each, and float32 variables under `mixed_bfloat16`."""
    sizes = {"num_layers": 2, "hidden_dim": 16, "num_heads": 2, "intermediate_dim": 32,
             "dropout": 0.0, "normalize_first": True}
    keras.utils.set_random_seed(4)
    teacher = transformer_seq2seq(SOURCE_VOCAB, TARGET_VOCAB, **sizes)
    keras.config.set_dtype_policy("mixed_bfloat16")
    try:
        nat = nat_seq2seq(SOURCE_VOCAB, TARGET_VOCAB, max_target_length=MAX_LENGTH, **sizes)
    finally:
        keras.config.set_dtype_policy("float32")
    report = initialize_from_seq2seq(nat, teacher)
    assert report["copied"] == len(nat.get_layer("encoder").weights) + len(
        nat.get_layer("decoder").weights)
    for part in ("encoder", "decoder"):
        ours, theirs = nat.get_layer(part), teacher.get_layer(part)
        assert ours.final_norm is not None
        for mine, given in zip(ours.final_norm.weights + ours.blocks[1].weights,
                               theirs.final_norm.weights + theirs.blocks[1].weights):
            assert mine.dtype == "float32"
            assert_array_equal(as_np(mine), as_np(given))
    src = sources()
    assert_allclose(nat.get_layer("encoder")(src), teacher.get_layer("encoder")(src),
                    atol=0.05)  # bfloat16 arithmetic against float32


def test_initialize_from_seq2seq_refuses_other_shapes_and_models():
    nat = tiny_model()
    nat([sources(), np.full((4, 3), MASK, "int32")])
    wider = transformer_seq2seq(SOURCE_VOCAB, TARGET_VOCAB, num_layers=1, hidden_dim=16,
                                num_heads=2, intermediate_dim=64, dropout=0.0)
    wider([sources(), np.full((4, 3), 5, "int32")])
    with pytest.raises(ValueError, match="intermediate_dim=32.*intermediate_dim=64"):
        initialize_from_seq2seq(nat, wider)
    other_vocab = transformer_seq2seq(SOURCE_VOCAB, TARGET_VOCAB + 1, num_layers=1,
                                      hidden_dim=16, num_heads=2, intermediate_dim=32,
                                      dropout=0.0)
    other_vocab([sources(), np.full((4, 3), 5, "int32")])
    with pytest.raises(ValueError, match="vocabulary_size"):
        initialize_from_seq2seq(nat, other_vocab)
    gelu = transformer_seq2seq(SOURCE_VOCAB, TARGET_VOCAB, num_layers=1, hidden_dim=16,
                               num_heads=2, intermediate_dim=32, dropout=0.0, activation="gelu")
    with pytest.raises(ValueError, match="activation='relu'.*activation='gelu'"):
        initialize_from_seq2seq(nat, gelu)
    quantized = transformer_seq2seq(SOURCE_VOCAB, TARGET_VOCAB, num_layers=1, hidden_dim=16,
                                    num_heads=2, intermediate_dim=32, dropout=0.0)
    quantized.quantize("int8")
    with pytest.raises(ValueError, match="layout|quantized"):
        initialize_from_seq2seq(tiny_model(), quantized)
    with pytest.raises(ValueError, match="`seq2seq`"):
        initialize_from_seq2seq(nat, keras.Sequential([keras.layers.Dense(2)]))
    with pytest.raises(ValueError, match="`model`"):
        initialize_from_seq2seq(wider, wider)


def test_a_refused_initialization_leaves_the_nat_as_it_was():
    """A teacher of another target vocabulary was refused at the decoder, after the encoder
    had been copied: the NAT was left half-initialised."""
    nat = tiny_model()
    nat([sources(), np.full((4, 3), MASK, "int32")])
    before = [as_np(v) for v in nat.weights]
    other_vocab = transformer_seq2seq(SOURCE_VOCAB, TARGET_VOCAB + 2, num_layers=1,
                                      hidden_dim=16, num_heads=2, intermediate_dim=32, dropout=0.0)
    other_vocab([sources(), np.full((4, 3), 5, "int32")])
    with pytest.raises(ValueError, match="vocabulary_size|shapes"):
        initialize_from_seq2seq(nat, other_vocab)
    for variable, value in zip(nat.weights, before):
        assert_array_equal(as_np(variable), value)


# ---- training data and loss (tf.data) ----------------------------------------------------------


@pytest.fixture(scope="module")
def dates():
    from keras_attn.data.dates import load_dates_translation

    return load_dates_translation(num_examples=300, seed=2)


@pytest.mark.tf_only
def test_cmlm_dataset_masks_1_to_n_random_target_tokens(dates):
    from keras_attn.data.nat import make_cmlm_dataset

    dataset = make_cmlm_dataset(dates, "train", batch_size=64, shuffle=True, seed=1)
    (src, masked), (target, length), (weights, length_weights) = next(iter(dataset))
    src, masked, target, length = (np.asarray(x) for x in (src, masked, target, length))
    weights = np.asarray(weights)
    token_mask = mask_id(dates.target_vocab_size)
    assert src.shape == (64, dates.source_length) and masked.shape == target.shape
    assert target.shape == (64, dates.target_length)
    assert_array_equal(length, (target != PAD_ID).sum(-1))
    assert not np.any(target == EOS_ID) and not np.any(target == BOS_ID)  # plain targets y
    assert_array_equal(weights, (masked == token_mask).astype("float32"))
    assert_array_equal(np.where(weights > 0, target, masked), target)  # others unchanged
    assert np.all(target[weights > 0] != PAD_ID)  # padding is never masked
    counts = weights.sum(-1)
    assert np.all(counts >= 1) and np.all(counts <= length)
    assert len(set(counts.tolist())) > 3  # the count itself is random
    assert_array_equal(length_weights, np.ones(64))
    # Fresh masks on the next pass (epoch); the same ones for the same seed.
    again = next(iter(dataset))
    assert not np.array_equal(np.asarray(again[0][1]), masked)
    first = next(iter(make_cmlm_dataset(dates, "train", 64, shuffle=True, seed=1)))
    assert_array_equal(np.asarray(first[0][1]), masked)


@pytest.mark.tf_only
def test_grouped_cmlm_batches_hold_one_length_cut_to_it(tmp_path):
    from translation_fixtures import write_pairs_file

    from keras_attn.data.nat import make_cmlm_dataset
    from keras_attn.data.pairs import load_tatoeba

    data = load_tatoeba(str(write_pairs_file(tmp_path / "fra.txt")), min_freq=1, verbose=0)
    fixed = make_cmlm_dataset(data, "train", 8, shuffle=True, seed=3)
    grouped = make_cmlm_dataset(data, "train", 8, shuffle=True, seed=3, group_by_length=True)
    batches = list(grouped)
    assert int(grouped.cardinality()) == len(batches)
    assert sum(int(x[0].shape[0]) for x, _, _ in batches) == len(data.train)
    token_mask = mask_id(data.target_vocab_size)
    seen = set()
    for (source, masked), (target, length), (weights, _) in batches:
        source, masked, target, length, weights = (np.asarray(a) for a in (
            source, masked, target, length, weights))
        longest = np.maximum((source != PAD_ID).sum(1), length)
        assert len(set(longest.tolist())) == 1  # one length per batch
        # cut to the batch's longest source and target, no column of padding only
        assert np.any(source[:, -1] != PAD_ID) and target.shape[1] == length.max()
        assert masked.shape == target.shape == weights.shape
        assert_array_equal(weights, (masked == token_mask).astype("float32"))
        assert np.all(weights.sum(1) >= 1) and np.all(weights.sum(1) <= length)
        seen.update(map(tuple, np.where(target == PAD_ID, -1, target).tolist()))
    # the same examples as the fixed-length batches
    expected = set()
    for _, (target, _), _ in fixed:
        expected.update(tuple(row[row != PAD_ID].tolist()) for row in np.asarray(target))
    assert {tuple(t for t in row if t != -1) for row in seen} == expected
    padding = [1 - np.mean(np.asarray(x[1]) != PAD_ID) for x, _, _ in fixed]
    grouped_padding = [1 - np.mean(np.asarray(x[1]) != PAD_ID) for x, _, _ in batches]
    assert np.mean(grouped_padding) < np.mean(padding)


@pytest.mark.tf_only
def test_token_loss_counts_only_the_masked_positions(dates):
    from keras_attn.data.nat import make_cmlm_dataset

    keras.utils.set_random_seed(1)
    model = compile_cmlm(nat_seq2seq(dates.source_vocab_size, dates.target_vocab_size, 1, 16, 2,
                                     32, 0.0, max_target_length=dates.target_length), "adam")
    x, y, w = next(iter(make_cmlm_dataset(dates, "train", batch_size=16, seed=0)))
    x, (target, length), weights = ([np.asarray(a) for a in x], [np.asarray(a) for a in y],
                                    [np.asarray(a) for a in w])
    predictions = model(x)
    token_logits, length_logits = (as_np(p) for p in predictions)

    def loss(target):
        return float(as_np(model.compute_loss(x=x, y=(target, length), y_pred=predictions,
                                              sample_weight=tuple(weights), training=False)))

    # The paper's loss: the mean over the masked tokens, plus 0.1 x the length cross-entropy.
    token_nll = -np.take_along_axis(log_softmax(token_logits), target[..., None], -1)[..., 0]
    masked = weights[0]
    length_nll = -np.take_along_axis(log_softmax(length_logits), length[:, None], -1)[:, 0]
    expected = (token_nll * masked).sum() / masked.sum() + 0.1 * length_nll.mean()
    np.testing.assert_allclose(loss(target), expected, rtol=1e-5)
    # Other targets at unmasked positions change nothing; at a masked position they do.
    unmasked_changed = np.where((masked == 0) & (target != PAD_ID), 4 + (target - 3) % 10,
                                target)
    assert np.any(unmasked_changed != target)
    np.testing.assert_allclose(loss(unmasked_changed), loss(target), rtol=1e-6)
    row, col = np.argwhere(masked > 0)[0]
    masked_changed = target.copy()
    masked_changed[row, col] = 4 if target[row, col] != 4 else 5
    assert abs(loss(masked_changed) - loss(target)) > 1e-4


@pytest.mark.tf_only
def test_fit_lowers_the_loss(dates):
    from keras_attn.data.nat import make_cmlm_dataset

    keras.utils.set_random_seed(2)
    model = compile_cmlm(nat_seq2seq(dates.source_vocab_size, dates.target_vocab_size, 1, 32, 4,
                                     64, 0.0, max_target_length=dates.target_length),
                         keras.optimizers.Adam(3e-3))
    history = model.fit(make_cmlm_dataset(dates, "train", 32, shuffle=True), epochs=3,
                        shuffle=False, verbose=0)
    losses = history.history["loss"]
    assert all(math.isfinite(v) for v in losses) and losses[-1] < 0.9 * losses[0]
    assert history.history["length_predictor_length_accuracy"][-1] > 0.9  # dates: length 10


@pytest.mark.tf_only
def test_make_cmlm_dataset_rejects_bad_arguments(dates):
    from keras_attn.data.nat import make_cmlm_dataset

    with pytest.raises(ValueError, match="split_or_pairs"):
        make_cmlm_dataset(dates, "tran")
    with pytest.raises(ValueError, match="batch_size"):
        make_cmlm_dataset(dates, "train", batch_size=0)


# ---- export ------------------------------------------------------------------------------------


@pytest.mark.tf_only
def test_exported_translate_equals_mask_predict_in_python(dates, tmp_path):
    import tensorflow as tf

    from keras_attn.export import export_nat_translator, make_nat_translate_fn

    keras.utils.set_random_seed(4)
    model = nat_seq2seq(dates.source_vocab_size, dates.target_vocab_size, 1, 16, 2, 32, 0.0,
                        max_target_length=dates.target_length)
    path = str(tmp_path / "nat_export")
    options = {"iterations": 3, "length_beam": 2, "standardize": dates.standardize_tf,
               "joiner": ""}
    export_nat_translator(model, dates.source_vectorizer, dates.target_vectorizer, path,
                          **options)
    from keras_attn.data.translation import WHITESPACE

    # Then only spaces, of every Unicode kind: nothing to translate.
    texts = ["march 3rd, 2021", "3/3/21", "", "march 3rd, 2021 " * 5, *WHITESPACE,
             " \u00a0\u3000\u2003"]
    served = tf.saved_model.load(path).signatures["translate"](text=tf.constant(texts))
    in_python = make_nat_translate_fn(model, dates.source_vectorizer,
                                      dates.target_vectorizer.get_vocabulary(),
                                      **options)(tf.constant(texts))
    for key in ("translation", "truncated"):
        assert_array_equal(served[key].numpy(), in_python[key].numpy())
    np.testing.assert_allclose(served["score"].numpy(), in_python["score"].numpy(), atol=1e-5)
    # ... and equals mask_predict + TranslationData.decode on the same sources.
    ids, scores = mask_predict(model, dates.encode_source(texts[:2]), iterations=3,
                               length_beam=2)
    assert [t.decode() for t in served["translation"].numpy()[:2]] == dates.decode(ids)
    np.testing.assert_allclose(served["score"].numpy()[:2], as_np(scores), atol=1e-5)
    for i in [2, *range(4, len(texts))]:
        assert served["translation"].numpy()[i] == b"" and served["score"].numpy()[i] == -np.inf
    assert served["truncated"].numpy().tolist() == [False, False, False, True] + [False] * (
        len(texts) - 4)
    ids = tf.zeros((1, dates.source_length), tf.int32)
    serve = tf.saved_model.load(path).signatures["serve"](
        source_ids=ids, masked_target_ids=tf.zeros((1, dates.target_length), tf.int32))
    assert serve["token_logits"].shape == (1, dates.target_length, dates.target_vocab_size)
    assert serve["length_logits"].shape == (1, dates.target_length + 1)
    with pytest.raises(ValueError, match="iterations"):
        export_nat_translator(model, dates.source_vectorizer, dates.target_vectorizer,
                              str(tmp_path / "x"), iterations=0)


# ---- the layer contract of the new layers --------------------------------------------------


def test_cmlm_decoder_contract(tmp_path):
    from layer_test_utils import run_layer_test

    ids = np.array([[MASK, 6, 7, MASK], [5, MASK, 0, 0]], "int32")
    enc = np.random.default_rng(0).standard_normal((2, 5, 8)).astype("float32")
    out = run_layer_test(
        CMLMDecoder,
        {"vocabulary_size": TARGET_VOCAB, "num_layers": 1, "hidden_dim": 8,
         "block": BlockConfig(AttentionConfig(num_heads=2), intermediate_dim=16, dropout=0.1)},
        {"inputs": ids, "encoder_outputs": enc,
         "encoder_padding_mask": np.array([[1, 1, 1, 1, 1], [1, 1, 0, 0, 0]], bool)},
        (2, 4, TARGET_VOCAB),
        tmp_path,
    )
    assert np.all(out[..., [PAD_ID, BOS_ID, EOS_ID]] < -1e8)  # never chosen


def test_length_predictor_contract(tmp_path):
    from layer_test_utils import run_layer_test

    from keras_attn.models import LengthPredictor

    enc = np.random.default_rng(1).standard_normal((3, 5, 8)).astype("float32")
    run_layer_test(
        LengthPredictor, {"max_target_length": 6},
        {"encoder_outputs": enc,
         "padding_mask": np.array([[1] * 5, [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], bool)},
        (3, 7), tmp_path,
    )
    predictor = LengthPredictor(max_target_length=6)
    assert predictor.compute_output_shape((3, 5, 8)) == (3, 7)


def test_bidirectional_decoder_block_contract(tmp_path):
    from layer_test_utils import run_layer_test

    x = np.random.default_rng(2).standard_normal((2, 4, 8)).astype("float32")
    enc = np.random.default_rng(3).standard_normal((2, 6, 8)).astype("float32")
    run_layer_test(
        TransformerDecoderBlock,
        {"attention": AttentionConfig(num_heads=2), "intermediate_dim": 16, "dropout": 0.1,
         "causal": False},
        {"inputs": x, "encoder_outputs": enc},
        (2, 4, 8),
        tmp_path,
    )
