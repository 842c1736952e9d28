"""One device, TensorFlow/Keras: the baseline the Horovod TensorFlow rung is a diff of.

    python -m scaledl.ladder.single_tf --epochs 3

The same model, data, flags and metrics as `single_torch.py`, in TensorFlow: a Keras model trained
by an explicit loop with `tf.GradientTape`, compiled into a graph by `tf.function`.  It writes the
final weights only (no checkpoints to resume from, no NaN guard): those flags are not offered.
"""
from __future__ import annotations

import tensorflow as tf

from scaledl import datasets, keras_compat, models, sharding
from scaledl.exits import exits_cleanly
from scaledl.ladder import harness

RUNG = "single_tf"
NOT_HONOURED = (*harness.CHECKPOINT_FLAGS, *harness.GUARD_FLAGS, *harness.COLLECTIVE_FLAGS, "device",
                *harness.MODEL_FLAGS)  # the CNN only


def set_precision(precision: str) -> None:
    """Keras mixed precision: layers compute in bf16/fp16 and keep fp32 weights."""
    policy = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}[precision]
    tf.keras.mixed_precision.set_global_policy(policy)


@exits_cleanly
def main(argv=None) -> int:
    config = harness.parse_args(RUNG, argv, without=NOT_HONOURED)
    set_precision(config.precision)
    tf.keras.utils.set_random_seed(config.seed)  # the same initial weights in every run
    fp16 = config.precision == "fp16"

    data = datasets.load_dataset(config.dataset, config.data_dir, config.train_limit)
    model = models.for_dataset(data, "tf")
    optimizer = tf.keras.optimizers.SGD(learning_rate=config.lr, momentum=config.momentum)
    if fp16:  # scales the loss up so that small gradients survive in fp16
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    run = harness.Run(RUNG, config, steps_per_epoch=len(data.y_train) // (config.batch_size * config.grad_accum),
                      num_samples=len(data.y_train), device="tensorflow")
    print(f"{RUNG}: {run.steps_per_epoch} steps per epoch")
    sums = keras_compat.GradientSums(model, optimizer, config.grad_accum)  # micro batches' gradients add up here

    @tf.function
    def train_step(x, y, last_micro_batch: bool):
        with tf.GradientTape() as tape:
            logits = tf.cast(model(x, training=True), tf.float32)
            per_sample = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            loss = tf.reduce_mean(per_sample)
            scaled = keras_compat.scaled_loss(optimizer, loss / config.grad_accum)  # scaled up under fp16
        gradients = tape.gradient(scaled, model.trainable_variables)
        gradients = sums.add(gradients, last_micro_batch)  # the step's sum at its last micro batch, else None
        if gradients is not None:
            gradients = keras_compat.gradients_to_apply(optimizer, gradients)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return tf.reduce_sum(per_sample), tf.reduce_sum(tf.cast(tf.argmax(logits, 1) == y, tf.float32))

    for epoch in run.epochs():
        batches = sharding.tf_train_dataset(data, config.batch_size, 0, 1, config.seed, epoch)  # reshuffled per epoch
        for x, y in run.batches(batches):  # micro batches, --grad-accum a step
            optimizer.learning_rate.assign(run.lr())  # linear scaling and warm-up (scaledl.schedule)
            loss_sum, correct = train_step(x, y, run.last_micro_batch)
            run.record(loss_sum, correct, len(y))  # counts a step at its last micro batch

    model.save_weights(f"{config.out_dir}/model.weights.h5")
    test_loss, test_accuracy = sharding.evaluate_tf(model, data, 0, 1)
    run.finish(test_accuracy)
    return 0


if __name__ == "__main__":
    harness.exit_process(main())
