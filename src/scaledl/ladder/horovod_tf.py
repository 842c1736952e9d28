"""Rung 3: Horovod with TensorFlow.

    horovodrun -np 2 -H localhost:2 python -m scaledl.ladder.horovod_tf     # or mpirun -np 2 ...
    horovodrun -np 2 -H localhost:2 python -m scaledl.ladder.horovod_tf --keras-fit

A diff against `single_tf.py`; every change is marked `# New Code #`.  The explicit loop wraps
the tape in `hvd.DistributedGradientTape`, which all-reduces (averages) the gradients before
they are applied.  `--keras-fit` trains with Keras' `model.fit` instead, through Horovod's
Keras API: `hvd.DistributedOptimizer` and a callback that broadcasts rank 0's weights.  That
API averages gradients only with Keras 2 (`tf.keras` up to TensorFlow 2.15): with Keras 3 it
runs and silently trains each rank on its own, which is why this project pins TensorFlow 2.15.
"""
from __future__ import annotations

import math  # New Code #
import os  # New Code #

import sys
import time  # New Code #

import horovod.tensorflow as hvd  # New Code #
import horovod.tensorflow.keras as hvd_keras  # New Code #
import tensorflow as tf

from scaledl import config as config_lib, datasets, launch_env, models, report, schedule, sharding
from scaledl.errors import exits_cleanly
from scaledl.log import get_logger
from scaledl.metrics import History

RUNG = "horovod_tf"


def set_precision(precision: str) -> None:
    """Keras mixed precision: layers compute in bf16/fp16 and keep fp32 weights."""
    policy = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}[precision]
    tf.keras.mixed_precision.set_global_policy(policy)


class Trainer:
    def __init__(self, config: config_lib.Config, info: launch_env.LaunchEnv, data: datasets.Dataset, args):  # New Code #
        self.config, self.info, self.data, self.args = config, info, data, args  # New Code #
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
                               gather=lambda vector: hvd.allgather(tf.constant(vector[None])).numpy(),  # New Code #
                               run_info={"rung": RUNG, "device": "tensorflow"}, tensorboard=config.tensorboard)

    def _steps_per_epoch(self) -> int:
        return len(self.data.y_train) // (self.config.batch_size * self.info.world_size)

    @tf.function
    def train_step(self, x, y, first_batch: bool):  # New Code #
        with tf.GradientTape() as tape:
            logits = tf.cast(self.model(x, training=True), tf.float32)
            per_sample = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            loss = tf.reduce_mean(per_sample)
            scaled = self.optimizer.get_scaled_loss(loss) if self.config.precision == "fp16" else loss
        tape = hvd.DistributedGradientTape(tape, compression=self.compression())  # New Code #: averages gradients
        gradients = tape.gradient(scaled, self.model.trainable_variables)
        if self.config.precision == "fp16":
            gradients = self.optimizer.get_unscaled_gradients(gradients)
        self.optimizer.apply_gradients(zip(gradients, self.model.trainable_variables))
        if first_batch:  # New Code #: start every rank from rank 0's weights (after the optimizer made its slots)
            hvd.broadcast_variables(self.model.variables, root_rank=0)
            hvd.broadcast_variables(self.optimizer.variables(), root_rank=0)
        correct = tf.reduce_sum(tf.cast(tf.argmax(logits, 1) == y, tf.float32))
        return tf.reduce_sum(per_sample), correct

    def compression(self):  # New Code #
        return hvd.Compression.fp16 if self.args.fp16_allreduce else hvd.Compression.none

    def train(self) -> None:
        steps_per_epoch = self._steps_per_epoch()
        for epoch in range(self.config.num_epochs):
            batches = sharding.tf_train_dataset(self.data, self.config.batch_size, self.info.rank,
                                                self.info.world_size, self.config.seed, epoch)
            for x, y in batches:
                self.optimizer.learning_rate.assign(self.lr_at(self.step))
                loss_sum, correct = self.train_step(x, y, self.step == 0)  # New Code #
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

    def train_keras_fit(self) -> None:  # New Code #: the same training through Horovod's Keras API
        optimizer = hvd_keras.DistributedOptimizer(self.optimizer, compression=self.compression())
        self.model.compile(optimizer=optimizer, loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                           metrics=["accuracy"])
        steps_per_epoch = self._steps_per_epoch()
        callbacks = [hvd_keras.callbacks.BroadcastGlobalVariablesCallback(0),
                     hvd_keras.callbacks.MetricAverageCallback(),
                     # DistributedOptimizer made a new optimizer: set the rate on the one compiled in.
                     tf.keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: self.model.optimizer.learning_rate.assign(
                         self.lr_at(self.step + batch)))]
        for epoch in range(self.config.num_epochs):
            batches = sharding.tf_train_dataset(self.data, self.config.batch_size, self.info.rank,
                                                self.info.world_size, self.config.seed, epoch)
            started = time.perf_counter()
            result = self.model.fit(batches, epochs=1, callbacks=callbacks, verbose=0)
            self.step += steps_per_epoch
            samples = steps_per_epoch * self.config.batch_size * self.info.world_size
            self.history.write({"type": "log", "step": self.step, "epoch": epoch + 1, "loss": float(result.history["loss"][-1]),
                                "samples_per_s": samples / (time.perf_counter() - started)})
            self.log.info("epoch %d loss %.4f acc %.3f (averaged over ranks)", epoch, result.history["loss"][-1],
                          result.history["accuracy"][-1])
        self.save()

    def evaluate(self) -> tuple[float, float]:
        return sharding.evaluate_tf(self.model, self.data, self.info.rank, self.info.world_size,
                                    all_reduce=lambda totals: hvd.allreduce(totals, op=hvd.Sum))  # New Code #


def pin_gpu(local_rank: int) -> None:  # New Code #: one GPU per rank, chosen by local rank
    gpus = tf.config.list_physical_devices("GPU")
    if gpus:
        tf.config.set_visible_devices(gpus[local_rank % len(gpus)], "GPU")
        tf.config.experimental.set_memory_growth(gpus[local_rank % len(gpus)], True)


def run(config: config_lib.Config, args) -> dict:  # New Code #
    # New Code #: under gloo (horovodrun's default here), a peer that stops answering fails the job after --timeout.
    os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(math.ceil(config.timeout)))
    hvd.init()  # New Code #
    info = launch_env.detect()
    pin_gpu(info.local_rank)  # New Code #
    data = datasets.load_dataset(config.dataset, config.data_dir, config.train_limit)
    trainer = Trainer(config, info, data, args)  # New Code #
    trainer.train_keras_fit() if args.keras_fit else trainer.train()  # New Code #
    test_loss, test_accuracy = trainer.evaluate()
    in_sync = len(set(hvd.allgather_object(report.fingerprint(w.tobytes() for w in trainer.model.get_weights())))) == 1  # New Code #
    return report.finish(RUNG, info.world_size, trainer.history, test_accuracy, config.out_dir,
                         report.peak_memory_bytes("cpu"), info.is_main, params_in_sync=in_sync)  # New Code #


@exits_cleanly
def main(argv=None) -> int:
    parser = config_lib.build_parser(prog=f"python -m scaledl.ladder.{RUNG}")
    # New Code #: Horovod's options.
    parser.add_argument("--fp16-allreduce", action="store_true", help="send gradients as fp16")
    parser.add_argument("--keras-fit", action="store_true", help="train with model.fit and Horovod's Keras API")
    run(*config_lib.config_from_args(parser, argv))  # New Code #
    return 0


if __name__ == "__main__":
    sys.exit(main())
