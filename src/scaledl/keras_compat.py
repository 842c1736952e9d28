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
