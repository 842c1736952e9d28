"""The two places where a custom TensorFlow step differs between Keras 2 and Keras 3.

Keras 2 is tf.keras up to TensorFlow 2.15 (Python 3.10-3.11 here, and sites that keep it); Keras 3
is tf.keras from TensorFlow 2.16 on (Python 3.12-3.13 here).

Loss scaling for fp16.  A LossScaleOptimizer multiplies the loss before backward so that small
gradients survive in fp16, and divides the gradients back before the update.  The two Keras
generations spell that apart:

- Keras 2 (`tf.keras` up to TensorFlow 2.15): `get_scaled_loss(loss)`, then the step itself calls
  `get_unscaled_gradients` before `apply_gradients` (keras/mixed_precision/loss_scale_optimizer.py,
  keras 2.15);
- Keras 3 (`tf.keras` from TensorFlow 2.16): `scale_loss(loss)`, and `apply_gradients` unscales,
  and skips the step when a gradient is not finite (keras/src/optimizers/loss_scale_optimizer.py,
  `LossScaleOptimizer.apply`).

Horovod's `DistributedGradientTape` averages whatever gradients it is given: scaled ones average
to the scaled mean, so either way the division comes after the all-reduce.
"""
from __future__ import annotations


def scaled_loss(optimizer, loss):
    """The loss to differentiate: scaled up when `optimizer` is a LossScaleOptimizer."""
    if hasattr(optimizer, "scale_loss"):  # Keras 3
        return optimizer.scale_loss(loss)
    if hasattr(optimizer, "get_scaled_loss"):  # Keras 2
        return optimizer.get_scaled_loss(loss)
    return loss


def gradients_to_apply(optimizer, gradients):
    """The gradients to pass to `apply_gradients`: Keras 2 wants them unscaled first, Keras 3 unscales itself."""
    if hasattr(optimizer, "get_unscaled_gradients") and not hasattr(optimizer, "scale_loss"):
        return optimizer.get_unscaled_gradients(gradients)
    return gradients


def tf_variables(variables) -> list:
    """The tf.Variables under Keras' variables, for Horovod to take.

    Keras 3 wraps each weight in a keras.Variable, whose tf.Variable is its `.value`.  Horovod 0.28.1
    was written for tf.Variables: its DistributedGradientTape keys the gradients it averages by
    `variable.ref()` (horovod/tensorflow/__init__.py, `_DistributedGradientTape.gradient`), and
    `broadcast_variables` passes them into a tf.function, where a keras.Variable becomes a tensor
    with no `assign` (horovod/tensorflow/functions.py).  Gradients come back in the same order, so
    they apply to the Keras variables as they are."""
    return [v if hasattr(v, "ref") else v.value for v in variables]


def horovod_variables(model, optimizer) -> tuple[list, list, list]:
    """The three lists of variables a Horovod TensorFlow step hands to Horovod, in the form it takes them.

    Returns `(trainable_variables, model_variables, optimizer_variables)`: the model's trainable
    variables (for `hvd.DistributedGradientTape(...).gradient`), all of its variables and the
    optimizer's (momentum slots and step counter; for `hvd.broadcast_variables`).  Each is
    `tf_variables` of Keras' list: on Keras 2 the very objects Keras lists, on Keras 3 the
    tf.Variable inside each Keras weight.  A Keras optimizer makes its slots in its first
    `apply_gradients` (or `optimizer.build`): call this after that, or the optimizer's list lacks them."""
    return (tf_variables(model.trainable_variables), tf_variables(model.variables),
            tf_variables(optimizer.variables))


class GradientSums:
    """--grad-accum for a TensorFlow step: each micro batch's gradients add up in variables of the
    weights' shapes, and the step's last micro batch gets their sum to apply (and zeroes them).

    Keras 3's optimizers accumulate by themselves (`gradient_accumulation_steps`), Keras 2's do not,
    and Horovod's tape reduces every gradient it computes: so the sums are kept here, and the Horovod
    rung averages them across ranks once a step.  With one micro batch a step nothing is kept: `add`
    hands the gradients straight back.  Called inside a tf.function with `last` a Python bool, each
    value traces a graph of its own, so neither checks anything at run time."""

    def __init__(self, model, optimizer, micro_batches: int):
        import tensorflow as tf

        self.micro_batches = micro_batches
        self.sums = []
        if micro_batches > 1:
            self.sums = [tf.Variable(tf.zeros(v.shape, tf.float32), trainable=False) for v in model.trainable_variables]
            # The optimizer's slots now: a tf.function may make variables in its first call only, and the
            # first call (a step's first micro batch) does not step.
            optimizer.build(model.trainable_variables)

    def add(self, gradients, last: bool):
        """The gradients to apply now (the step's sum), or None until the step's last micro batch."""
        if self.micro_batches == 1:
            return gradients
        import tensorflow as tf

        for total, gradient in zip(self.sums, gradients):
            total.assign_add(tf.cast(gradient, tf.float32))
        if not last:
            return None
        summed = [total.read_value() for total in self.sums]  # read before the zeroing (tf.function keeps the order)
        for total in self.sums:
            total.assign(tf.zeros_like(total))
        return summed
