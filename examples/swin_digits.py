"""A small Swin Transformer on the 8 × 8 digits of scikit-learn (no download).

Each 8 × 8 image becomes an 8 × 8 grid of tokens (patch size 1). Two Swin blocks with 4 × 4
windows (the second shifted by 2) attend within windows, `PatchMerging` halves the grid to
4 × 4, two more blocks follow, then average pooling and a linear classifier. Trained with
`model.fit` on images shifted at random by up to one pixel. Writes everything into OUT:
metrics.json, history.png (loss and accuracy per epoch), the attention heatmaps of the first two
blocks for one test image (attention_block1_windows.png, attention_block2_shifted_windows.png:
every window and head), and saved_model/, a SavedModel (`serve` signature) that is reloaded with
`tf.saved_model.load` and checked.

    python examples/swin_digits.py --out runs/swin_digits
    python examples/swin_digits.py --smoke --epochs 1 --out /tmp/sw
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import TYPE_CHECKING

from example_utils import (
    check_run_dirs,
    import_tensorflow_quietly,
    positive,
)

if TYPE_CHECKING:
    import keras


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="examples:\n  python examples/swin_digits.py --out runs/swin_digits\n"
               "  python examples/swin_digits.py --smoke --epochs 1 --out /tmp/sw",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=90, help="(default: %(default)s)")
    parser.add_argument("--batch-size", type=int, default=32, help="(default: %(default)s)")
    parser.add_argument("--learning-rate", type=positive, default=3e-3,
                        help="peak AdamW learning rate, after a warm-up and cosine-decayed "
                             "(default: %(default)s)")
    parser.add_argument("--embed-dim", type=int, default=32,
                        help="token width of the first two blocks, doubled by the patch "
                             "merging (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0, help="(default: %(default)s)")
    parser.add_argument("--out", default="runs/swin_digits",
                        help="directory for everything the run makes: metrics.json, PNGs and "
                             "the SavedModel (default: %(default)s)")
    parser.add_argument("--export-dir", default=None,
                        help="SavedModel directory (default: OUT/saved_model)")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the results and SavedModel of an earlier run in OUT "
                             "(default: refuse)")
    parser.add_argument("--smoke", action="store_true",
                        help="a tiny run on 200 training and 100 test images, for tests")
    args = parser.parse_args(argv)
    args.export_dir = args.export_dir or os.path.join(args.out, "saved_model")
    problem = check_run_dirs(args.out, args.export_dir, args.overwrite)
    if problem:
        parser.error(problem)
    return args


def load_data(seed: int, smoke: bool):
    """Images `(n, 8, 8, 1)` scaled to [0, 1] and labels; a stratified 80 / 20 split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = (digits.images / 16.0).astype("float32")[..., None]
    x_train, x_test, y_train, y_test = train_test_split(
        images, digits.target.astype("int32"), test_size=0.2, random_state=seed,
        stratify=digits.target,
    )
    if smoke:
        x_train, y_train, x_test, y_test = x_train[:200], y_train[:200], x_test[:100], y_test[:100]
    return x_train, y_train, x_test, y_test


def build_model(hidden_dim: int = 32) -> keras.Model:
    """8 × 8 × 1 image -> 10 logits. Augmentation is the only regularizer (no dropout)."""
    import keras

    from keras_attn.layers import PatchEmbedding, PatchMerging, SwinBlock

    images = keras.Input((8, 8, 1), name="images")
    # One pixel per token: no LayerNorm on a linear map of a scalar (it would squash intensity).
    x = PatchEmbedding(patch_size=1, hidden_dim=hidden_dim, use_norm=False,
                       name="patch_embedding")(images)
    x = SwinBlock(2, window_size=4, shift_size=0, name="block1")(x)
    x = SwinBlock(2, window_size=4, shift_size=2, name="block2")(x)
    x = PatchMerging(name="patch_merging")(x)  # (B, 4, 4, 2 · hidden_dim)
    x = SwinBlock(4, window_size=4, shift_size=0, name="block3")(x)
    x = SwinBlock(4, window_size=4, shift_size=2, name="block4")(x)
    x = keras.layers.LayerNormalization(name="norm")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    logits = keras.layers.Dense(10, name="logits")(x)
    return keras.Model(images, logits, name="swin_digits")


def build_trainer(model: keras.Model) -> keras.Model:
    """The classifier behind random shifts of up to one pixel: 1437 images are few for a
    transformer. Kept out of the classifier itself, so the export holds no augmentation (Keras
    random layers default to `training=True` when the serving signature calls them)."""
    import keras

    return keras.Sequential(
        [keras.Input((8, 8, 1)),
         keras.layers.RandomTranslation(0.125, 0.125, fill_mode="constant", name="augment"),
         model],
        name="swin_digits_trainer",
    )


def draw_attention(model: keras.Model, images, labels, out_dir: str) -> list[str]:
    """Heatmaps of the 4 windows × 2 heads of the first two blocks for one test image."""
    import keras
    import numpy as np

    from keras_attn.viz import show_heatmaps

    image = images[:1]
    predicted = int(np.argmax(keras.ops.convert_to_numpy(model(image, training=False))[0]))
    tokens = model.get_layer("patch_embedding")(image)
    block1, block2 = model.get_layer("block1"), model.get_layer("block2")
    tokens, plain = block1(tokens, return_attention_scores=True)
    _, shifted = block2(tokens, return_attention_scores=True)  # (1, nW, H, 16, 16)
    paths = []
    for name, weights, what in (
        ("block1_windows", plain, "block 1: attention within each 4 × 4 window"),
        ("block2_shifted_windows", shifted,
         ("block 2: attention within each 4 × 4 window of the grid shifted by 2 (masked "
          "where the cyclic shift put unrelated tokens together)")),
    ):
        weights = keras.ops.convert_to_numpy(weights)[0]  # (nW, H, 16, 16)
        titles = [f"head {h + 1}" for h in range(weights.shape[1])]
        rows = [f"window {w + 1}" for w in range(weights.shape[0])]
        paths.append(show_heatmaps(
            weights, "key token (its place in the 4 × 4 window, row by row)", "query token",
            titles=titles, row_titles=rows,
            suptitle=f"Swin {what}\ntest image 0: digit {int(labels[0])}, predicted {predicted}",
            path=os.path.join(out_dir, f"attention_{name}.png")))
    return paths


def export_and_check(model: keras.Model, export_dir: str, x_test) -> float:
    """Exports the SavedModel (in place of an earlier one only once written), reloads it with
    TensorFlow alone and compares predictions."""
    import numpy as np
    import tensorflow as tf

    from keras_attn.recipes.runtime import write_export

    write_export(export_dir, lambda path: model.export(path, verbose=False))
    reloaded = tf.saved_model.load(export_dir)
    served = reloaded.serve(tf.constant(x_test)).numpy()
    return float(np.max(np.abs(served - model.predict(x_test, verbose=0))))


def main(argv=None) -> dict:
    args = parse_args(argv)  # before TensorFlow is imported: --help and refusals are quick
    import_tensorflow_quietly()
    import keras
    import numpy as np

    from keras_attn.recipes.runtime import fit_verbosity
    from keras_attn.viz import plot_history

    os.makedirs(args.out, exist_ok=True)
    keras.utils.set_random_seed(args.seed)
    x_train, y_train, x_test, y_test = load_data(args.seed, args.smoke)

    model = build_model(args.embed_dim)
    trainer = build_trainer(model)
    steps_per_epoch = int(np.ceil(0.9 * len(x_train) / args.batch_size))
    warmup = min(5, args.epochs // 10) * steps_per_epoch  # a linear warm-up steadies early steps
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0 if warmup else args.learning_rate, max(1, args.epochs * steps_per_epoch - warmup),
        warmup_target=args.learning_rate if warmup else None, warmup_steps=warmup,
    )
    trainer.compile(
        optimizer=keras.optimizers.AdamW(schedule, weight_decay=0.05),
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    start = time.perf_counter()
    history = trainer.fit(x_train, y_train, epochs=args.epochs, batch_size=args.batch_size,
                        validation_split=0.1, verbose=fit_verbosity())
    train_seconds = time.perf_counter() - start
    test_loss, test_accuracy = trainer.evaluate(x_test, y_test, verbose=0)  # no augmentation

    heatmaps = draw_attention(model, x_test, y_test, args.out)
    plot_history(history, path=os.path.join(args.out, "history.png"),
                 metrics=["loss", "accuracy"],
                 title="Swin on 8 × 8 digits: cross-entropy and accuracy (validation: 10% of "
                       "the training images)")
    export_diff = export_and_check(model, args.export_dir, x_test)
    metrics = {
        "test_accuracy": float(test_accuracy),
        "test_loss": float(test_loss),
        "train_seconds": round(train_seconds, 1),
        "final_train_accuracy": float(history.history["accuracy"][-1]),
        "final_val_accuracy": float(history.history["val_accuracy"][-1]),
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "num_params": int(model.count_params()),
        "num_train": len(x_train),
        "num_test": len(x_test),
        "seed": args.seed,
        "smoke": args.smoke,
        "export_dir": args.export_dir,
        "export_max_abs_diff": export_diff,
        "heatmaps": heatmaps,
    }
    with open(os.path.join(args.out, "metrics.json"), "w") as f:
        json.dump(metrics, f, indent=2)
    print(json.dumps(metrics, indent=2))
    return metrics


if __name__ == "__main__":
    main()
