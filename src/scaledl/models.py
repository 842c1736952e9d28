"""The model every rung trains: a small CNN, defined once for PyTorch and once for Keras.

Small on purpose: it reaches ~98% on MNIST in a few CPU epochs, so the workshop runs on a
laptop, and its few weights make communication cost visible next to compute.  Both versions
have the same layers and parameter count, so PyTorch and TensorFlow rungs are comparable.
"""
from __future__ import annotations


def torch_cnn(in_channels: int = 1, num_classes: int = 10, image_size: int = 28, width: int = 16):
    from torch import nn

    flat = 2 * width * (image_size // 4) ** 2
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(width, 2 * width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(flat, 128), nn.ReLU(), nn.Linear(128, num_classes),
    )


def keras_cnn(image_shape=(28, 28, 1), num_classes: int = 10, width: int = 16):
    import tensorflow as tf

    layers = tf.keras.layers
    return tf.keras.Sequential([
        layers.Input(shape=image_shape),
        layers.Conv2D(width, 3, padding="same", activation="relu"), layers.MaxPool2D(2),
        layers.Conv2D(2 * width, 3, padding="same", activation="relu"), layers.MaxPool2D(2),
        # PyTorch flattens NCHW and Keras NHWC: same size, different order, same model family.
        layers.Flatten(), layers.Dense(128, activation="relu"), layers.Dense(num_classes),
    ])


def for_dataset(data, framework: str = "torch"):
    """The CNN sized for a `scaledl.datasets.Dataset`."""
    height, _, channels = data.image_shape
    if framework == "torch":
        return torch_cnn(channels, data.num_classes, height)
    return keras_cnn(data.image_shape, data.num_classes)
