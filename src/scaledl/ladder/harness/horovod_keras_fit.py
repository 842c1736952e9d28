"""`--keras-fit` of the horovod_tf rung: the same training through Keras' model.fit.

model.fit has no tape for the rung to wrap, so the model gets a train step of its own that computes
the loss under the same `hvd.DistributedGradientTape`; rank 0's variables are broadcast once before
fit, and each epoch's loss and accuracy are averaged over ranks.  Apart from the rung so that
`diff single_tf.py horovod_tf.py` stays what Horovod needs in a training loop.
"""
from __future__ import annotations

import time

import horovod.tensorflow as hvd
import tensorflow as tf

from scaledl import keras_compat, sharding


class AveragingModel(tf.keras.Model):
    """The model for model.fit, with a train step whose gradients a DistributedGradientTape averages.

    Horovod's Keras API (hvd.keras.DistributedOptimizer and its callbacks) wraps Keras 2's optimizers
    only: under Keras 3, tf.keras from TensorFlow 2.16 on, its callbacks fail and, without them,
    fit() trains each rank alone, silently (horovod/horovod#4290).  A train step of our own, the way
    Keras documents customizing fit() (its guide "Customizing what happens in fit()"), averages on
    Keras 2 and 3 alike."""

    def __init__(self, model, compression):
        super().__init__(inputs=model.inputs, outputs=model.outputs)  # the same layers and weights
        self.compression = compression
        self.loss_mean = tf.keras.metrics.Mean(name="loss")
        self.accuracy = tf.keras.metrics.SparseCategoricalAccuracy(name="accuracy")

    @property
    def metrics(self):  # the ones fit() resets at every epoch
        return [self.loss_mean, self.accuracy]

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            logits = tf.cast(self(x, training=True), tf.float32)
            loss = tf.reduce_mean(tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True))
            scaled = keras_compat.scaled_loss(self.optimizer, loss)  # scaled up under fp16
        tape = hvd.DistributedGradientTape(tape, compression=self.compression)  # averages the gradients
        gradients = tape.gradient(scaled, keras_compat.tf_variables(self.trainable_variables))
        gradients = keras_compat.gradients_to_apply(self.optimizer, gradients)
        self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
        self.loss_mean.update_state(loss)
        self.accuracy.update_state(y, logits)
        return {"loss": self.loss_mean.result(), "accuracy": self.accuracy.result()}


def keras_fit(run, model, optimizer, data, config, compression) -> None:
    """The same training through model.fit, one epoch at a time."""
    model = AveragingModel(model, compression)
    model.compile(optimizer=optimizer)  # the loss and metrics are train_step's
    optimizer.build(model.trainable_variables)  # its slots exist now, so they can be broadcast too
    for variables in (model.variables, optimizer.variables):  # every rank starts from rank 0's weights
        hvd.broadcast_variables(keras_compat.tf_variables(variables), root_rank=0)
    set_lr = tf.keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda batch, logs: optimizer.learning_rate.assign(run.lr(run.step + batch)))
    run.start()
    for epoch in range(config.num_epochs):
        batches = sharding.tf_train_dataset(data, config.batch_size, hvd.rank(), hvd.size(), config.seed, epoch)
        started = time.perf_counter()
        result = model.fit(batches, epochs=1, callbacks=[set_lr], verbose=0)
        run.step += run.steps_per_epoch
        samples = run.steps_per_epoch * config.batch_size * hvd.size()
        # Each rank's epoch mean over its own shard; averaged, they are the job's.
        loss, accuracy = (float(hvd.allreduce(tf.constant(result.history[name][-1]), op=hvd.Average))
                          for name in ("loss", "accuracy"))
        run.history.write({"type": "log", "step": run.step, "epoch": epoch + 1, "loss": loss,
                           "samples_per_s": samples / (time.perf_counter() - started)})
        run.log.info("epoch %d loss %.4f acc %.3f (averaged over ranks)", epoch, loss, accuracy)
