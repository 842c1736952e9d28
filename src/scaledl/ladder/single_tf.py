"""Rung 2: one device, TensorFlow/Keras.  The baseline the Horovod TensorFlow rung is a diff of.

    python -m scaledl.ladder.single_tf --epochs 3

The same model, data, flags and metrics as `single_torch.py`, in TensorFlow: a Keras model
trained by an explicit loop with `tf.GradientTape`, compiled into a graph by `tf.function`.
"""
from __future__ import annotations

import sys

import tensorflow as tf

from scaledl import config as config_lib, datasets, launch_env, models, report, schedule, sharding
from scaledl.errors import exits_cleanly
from scaledl.log import get_logger
from scaledl.metrics import History

RUNG = "single_tf"


def set_precision(precision: str) -> None:
    """Keras mixed precision: layers compute in bf16/fp16 and keep fp32 weights."""
    policy = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}[precision]
    tf.keras.mixed_precision.set_global_policy(policy)


class Trainer:
    def __init__(self, config: config_lib.Config, info: launch_env.LaunchEnv, data: datasets.Dataset):
        self.config, self.info, self.data = config, info, data
        self.log = get_logger(info.rank)
        set_precision(config.precision)
        tf.keras.utils.set_random_seed(config.seed)
        self.model = models.for_dataset(data, "tf")
        self.optimizer = tf.keras.optimizers.SGD(learning_rate=config.lr, momentum=config.momentum)
        if config.precision == "fp16":
            self.optimizer = tf.keras.mixed_precision.LossScaleOptimizer(self.optimizer)
        self.lr_at = schedule.for_config(config, info.world_size, self._steps_per_epoch())
        self.step = 0
        sharding.check_enough_data(len(data.y_train), config.batch_size, info.world_size)  # before anything is written
        self.history = History(config.out_dir, info.rank, info.world_size, config=config.to_dict(),
                               run_info={"rung": RUNG, "device": "tensorflow"}, tensorboard=config.tensorboard)

    def _steps_per_epoch(self) -> int:
        return len(self.data.y_train) // (self.config.batch_size * self.info.world_size)

    @tf.function
    def train_step(self, x, y):
        with tf.GradientTape() as tape:
            logits = tf.cast(self.model(x, training=True), tf.float32)
            per_sample = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            loss = tf.reduce_mean(per_sample)
            scaled = self.optimizer.get_scaled_loss(loss) if self.config.precision == "fp16" else loss
        gradients = tape.gradient(scaled, self.model.trainable_variables)
        if self.config.precision == "fp16":
            gradients = self.optimizer.get_unscaled_gradients(gradients)
        self.optimizer.apply_gradients(zip(gradients, self.model.trainable_variables))
        correct = tf.reduce_sum(tf.cast(tf.argmax(logits, 1) == y, tf.float32))
        return tf.reduce_sum(per_sample), correct

    def train(self) -> None:
        steps_per_epoch = self._steps_per_epoch()
        for epoch in range(self.config.num_epochs):
            batches = sharding.tf_train_dataset(self.data, self.config.batch_size, self.info.rank,
                                                self.info.world_size, self.config.seed, epoch)
            for x, y in batches:
                self.optimizer.learning_rate.assign(self.lr_at(self.step))
                loss_sum, correct = self.train_step(x, y)
                self.step += 1
                self.history.step(loss_sum, correct, len(y))
                if self.step % self.config.log_interval == 0:
                    record = self.history.log(self.step, self.step / steps_per_epoch, lr=self.lr_at(self.step))
                    if record:
                        self.log.info("epoch %d step %d loss %.4f acc %.3f %.0f samples/s", epoch, self.step,
                                      record["loss"], record["accuracy"], record["samples_per_s"])
                if self.config.max_steps and self.step >= self.config.max_steps:
                    return self.save()
        self.save()

    def save(self) -> None:
        if self.info.is_main:
            self.model.save_weights(f"{self.config.out_dir}/model.weights.h5")

    def evaluate(self) -> tuple[float, float]:
        return sharding.evaluate_tf(self.model, self.data, self.info.rank, self.info.world_size)


def run(config: config_lib.Config) -> dict:
    info = launch_env.detect()
    data = datasets.load_dataset(config.dataset, config.data_dir, config.train_limit)
    trainer = Trainer(config, info, data)
    trainer.train()
    test_loss, test_accuracy = trainer.evaluate()
    return report.finish(RUNG, info.world_size, trainer.history, test_accuracy, config.out_dir,
                         report.peak_memory_bytes("cpu"), info.is_main)


@exits_cleanly
def main(argv=None) -> int:
    config = config_lib.parse_args(argv, prog=f"python -m scaledl.ladder.{RUNG}")
    run(config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
