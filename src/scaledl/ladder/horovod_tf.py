"""Horovod with TensorFlow.

    horovodrun -np 2 -H localhost:2 python -m scaledl.ladder.horovod_tf     # or mpirun, mpiexec, srun
    horovodrun -np 2 -H localhost:2 python -m scaledl.ladder.horovod_tf --keras-fit

`diff single_tf.py horovod_tf.py` is what Horovod needs (marked `# New Code #`): the gradient tape
becomes a `DistributedGradientTape` that averages the gradients across ranks, and every rank starts
from rank 0's variables.  `--keras-fit` trains the same way through model.fit, the same tape in the
model's train step (scaledl/ladder/harness/horovod_keras_fit.py).
"""
from __future__ import annotations

import math  # New Code #
import os  # New Code #

import horovod.tensorflow as hvd  # New Code #
import tensorflow as tf

from scaledl import datasets, distributed, keras_compat, models, report, sharding  # New Code #
from scaledl.exits import exits_cleanly
from scaledl.ladder import harness
from scaledl.ladder.harness.horovod_keras_fit import keras_fit  # New Code #: --keras-fit, the tape in fit

RUNG = "horovod_tf"
NOT_HONOURED = (*harness.CHECKPOINT_FLAGS, *harness.GUARD_FLAGS, "backend", "device",  # New Code #: Horovod picks
                *harness.MODEL_FLAGS)  # the CNN only


def set_precision(precision: str) -> None:
    """Keras mixed precision: layers compute in bf16/fp16 and keep fp32 weights."""
    policy = {"fp32": "float32", "bf16": "mixed_bfloat16", "fp16": "mixed_float16"}[precision]
    tf.keras.mixed_precision.set_global_policy(policy)


def pin_gpu(local_rank: int) -> None:  # New Code #: one GPU per rank, chosen by local rank
    # NVIDIA GPUs are TensorFlow's "GPU" devices; Intel's (Intel Extension for TensorFlow, in Aurora's
    # tensorflow module) are "XPU" devices, one per tile.
    for kind in ("GPU", "XPU"):
        gpus = tf.config.list_physical_devices(kind)
        if gpus:
            tf.config.set_visible_devices(gpus[local_rank % len(gpus)], kind)
            tf.config.experimental.set_memory_growth(gpus[local_rank % len(gpus)], True)
            return


@exits_cleanly
def main(argv=None) -> int:
    # New Code #: Horovod's options
    flags = harness.parser(RUNG, without=NOT_HONOURED)
    flags.add_argument("--fp16-allreduce", action="store_true", help="send gradients as fp16")
    flags.add_argument("--keras-fit", action="store_true", help="train with model.fit, averaging in its train step")
    config, args = harness.parse(flags, argv)
    if args.keras_fit and config.grad_accum > 1:  # New Code #
        flags.error("--keras-fit steps once a batch: train without it for --grad-accum")
    # New Code #: under gloo, a peer that stops answering fails the job after --timeout.
    os.environ.setdefault("HOROVOD_GLOO_TIMEOUT_SECONDS", str(math.ceil(config.timeout)))
    os.environ.setdefault("HOROVOD_LOG_LEVEL", "fatal")  # New Code #: a lost peer is our one line, not Horovod's log
    job = distributed.find_job()  # New Code #: a half-set launcher environment is one line, not a silent single rank
    hvd.init()  # New Code #: rank, local_rank and size from horovodrun or MPI
    distributed.check_horovod_size(job, hvd.size())  # New Code #: torchrun's ranks would each train alone
    pin_gpu(hvd.local_rank())  # New Code #
    compression = hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none  # New Code #
    set_precision(config.precision)
    tf.keras.utils.set_random_seed(config.seed)  # the same initial weights in every run
    fp16 = config.precision == "fp16"

    data = datasets.load_dataset(config.dataset, config.data_dir, config.train_limit)
    model = models.for_dataset(data, "tf")
    optimizer = tf.keras.optimizers.SGD(learning_rate=config.lr, momentum=config.momentum)
    if fp16:  # scales the loss up so that small gradients survive in fp16
        optimizer = tf.keras.mixed_precision.LossScaleOptimizer(optimizer)
    global_batch_size = config.batch_size * config.grad_accum * hvd.size()  # New Code #
    run = harness.Run(RUNG, config, steps_per_epoch=len(data.y_train) // global_batch_size,  # New Code #
                      num_samples=len(data.y_train), device="tensorflow", comm=harness.horovod_comm(hvd))  # New Code #
    if hvd.rank() == 0:  # New Code #: one line for the job, not one per rank
        print(f"{RUNG}: {run.steps_per_epoch} steps per epoch on {hvd.size()} ranks")  # New Code #

    sums = keras_compat.GradientSums(model, optimizer, config.grad_accum)  # micro batches' gradients add up here

    @tf.function
    def train_step(x, y, last_micro_batch: bool, first_step: bool):  # New Code #
        with tf.GradientTape() as tape:
            logits = tf.cast(model(x, training=True), tf.float32)
            per_sample = tf.keras.losses.sparse_categorical_crossentropy(y, logits, from_logits=True)
            loss = tf.reduce_mean(per_sample)
            scaled = keras_compat.scaled_loss(optimizer, loss / config.grad_accum)  # scaled up under fp16
        if config.grad_accum == 1:  # New Code #: with --grad-accum the sums are averaged instead, once a step
            tape = hvd.DistributedGradientTape(tape, compression=compression)  # New Code #: averages the gradients
        gradients = tape.gradient(scaled, keras_compat.tf_variables(model.trainable_variables))  # New Code #
        gradients = sums.add(gradients, last_micro_batch)  # the step's sum at its last micro batch, else None
        if gradients is not None:
            if config.grad_accum > 1:  # New Code #: what the tape does, on the step's sums
                gradients = hvd.grouped_allreduce(gradients, compression=compression)
            gradients = keras_compat.gradients_to_apply(optimizer, gradients)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        if first_step and gradients is not None:  # New Code #: start every rank from rank 0's weights (after the
            hvd.broadcast_variables(model.variables, root_rank=0)  # optimizer made its slots in its first step)
            hvd.broadcast_variables(optimizer.variables, root_rank=0)
        return tf.reduce_sum(per_sample), tf.reduce_sum(tf.cast(tf.argmax(logits, 1) == y, tf.float32))

    for epoch in run.epochs() if not args.keras_fit else ():  # New Code #
        batches = sharding.tf_train_dataset(data, config.batch_size, hvd.rank(), hvd.size(), config.seed,  # New Code #
                                            epoch)  # New Code #: each rank its shard, reshuffled per epoch
        for x, y in run.batches(batches):  # micro batches, --grad-accum a step
            optimizer.learning_rate.assign(run.lr())  # linear scaling and warm-up (scaledl.schedule)
            loss_sum, correct = train_step(x, y, run.last_micro_batch, run.step == 0)  # New Code #
            run.record(loss_sum, correct, len(y))  # counts a step at its last micro batch
    if args.keras_fit:  # New Code #
        keras_fit(run, model, optimizer, data, config, compression)

    if hvd.rank() == 0:  # New Code #
        model.save_weights(f"{config.out_dir}/model.weights.h5")
    test_loss, test_accuracy = sharding.evaluate_tf(model, data, hvd.rank(), hvd.size(),  # New Code #
                                                    all_reduce=lambda totals: hvd.allreduce(totals, op=hvd.Sum))
    weights = report.fingerprint(w.tobytes() for w in model.get_weights())  # New Code #: the same on every rank?
    run.finish(test_accuracy, params_in_sync=len(set(hvd.allgather_object(weights))) == 1)  # New Code #
    return 0


if __name__ == "__main__":
    harness.exit_process(main())
