"""One process of the multi-worker tests (tests/test_distribute.py): a tiny dates Transformer.

With `TF_CONFIG` set it is one worker of a `MultiWorkerMirroredStrategy` cluster; without, it is
the single-process reference. Training is the translation examples' (Adam with `clipnorm=1.0`
and a cosine schedule, the masked sequence loss, seeded shuffling, the global batch sharded by
data, `WorkerBackupAndRestore` in OUT/backup, `--interrupt-after` stopping the process after an
epoch), with dropout off so that every run computes the same function. Each process writes its
weights to `OUT/weights_<name>_epoch<k>.npz` and its loss and step count to
`OUT/logs_<name>_epoch<k>.json` after every epoch, and its history to `OUT/history_<name>.json`
at the end (test artifacts; `<name>` is `worker0`, `worker1` or `single`).

    python tests/distribute_worker.py --out OUT --epochs 3 [--interrupt-after 1]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ["KERAS_BACKEND"] = "tensorflow"


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32, help="the global batch")
    parser.add_argument("--num-examples", type=int, default=160, help="128 of them train")
    parser.add_argument("--interrupt-after", type=int, default=None)
    args = parser.parse_args(argv)

    import tensorflow as tf

    from keras_attn import distribute

    strategy = (distribute.multi_worker_strategy() if os.environ.get("TF_CONFIG")
                else tf.distribute.get_strategy())
    import keras
    import numpy as np

    from keras_attn.data.dates import load_dates_translation
    from keras_attn.metrics import MaskedAccuracy, MaskedSequenceLoss
    from keras_attn.models import transformer_seq2seq

    task_type, task_id = distribute.task(strategy)
    name = "single" if task_type is None else f"{task_type}{task_id}"
    keras.utils.set_random_seed(0)
    data = load_dates_translation(num_examples=args.num_examples, seed=0)
    steps = args.epochs * -(-len(data.train) // args.batch_size)
    with strategy.scope():
        model = transformer_seq2seq(data.source_vocab_size, data.target_vocab_size,
                                    num_layers=1, hidden_dim=16, num_heads=2,
                                    intermediate_dim=32, dropout=0.0)
        learning_rate = keras.optimizers.schedules.CosineDecay(2e-3, steps, alpha=0.02)
        model.compile(optimizer=keras.optimizers.Adam(learning_rate, clipnorm=1.0),
                      loss=MaskedSequenceLoss(), metrics=[MaskedAccuracy()])
    train = distribute.shard_by_data(
        data.make_dataset("train", args.batch_size, shuffle=True, seed=0))

    def save_weights(path):
        np.savez(path, **{f"{i:03d} {w.path}": keras.ops.convert_to_numpy(w)
                          for i, w in enumerate(model.weights)})

    class Record(keras.callbacks.Callback):  # then, as the examples' --interrupt-after
        def on_epoch_end(self, epoch, logs=None):
            save_weights(os.path.join(args.out, f"weights_{name}_epoch{epoch + 1}.npz"))
            with open(os.path.join(args.out, f"logs_{name}_epoch{epoch + 1}.json"), "w") as f:
                json.dump({"loss": float(logs["loss"]),
                           "iterations": int(model.optimizer.iterations.numpy())}, f)
            if args.interrupt_after is not None and epoch + 1 >= args.interrupt_after:
                print(f"interrupted after epoch {epoch + 1}", flush=True)
                raise SystemExit(3)

    os.makedirs(args.out, exist_ok=True)
    callbacks = [distribute.WorkerBackupAndRestore(os.path.join(args.out, "backup"), strategy),
                 Record()]
    history = model.fit(train, epochs=args.epochs, shuffle=False, callbacks=callbacks, verbose=2)
    with open(os.path.join(args.out, f"history_{name}.json"), "w") as f:
        json.dump({"loss": [float(x) for x in history.history.get("loss", [])],
                   "iterations": int(model.optimizer.iterations.numpy()),
                   "num_replicas": strategy.num_replicas_in_sync}, f)
    print(f"{name} done", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
