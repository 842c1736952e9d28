"""The models the rungs train, defined once: a small CNN (the default) and a transformer.

The CNN, for PyTorch and for Keras, is small on purpose: it reaches ~98% on MNIST in a few CPU
epochs, so the workshop runs on a laptop, and its few weights make communication cost visible
next to compute.  Both versions have the same layers and parameter count, so PyTorch and
TensorFlow rungs are comparable.

The transformer (`--model transformer`, PyTorch only) is a sequence classifier on the synthetic
token sequences of `scaledl.datasets` (`--dataset tokens`): token and position embeddings,
`depth` pre-norm blocks of multi-head self-attention and a 4x-wide MLP, mean pooling over the
sequence, and a linear classifier, so every rung's loop (cross-entropy on logits, accuracy)
stays as it is.  Its linear layers are what tensor parallelism shards (the Megatron-LM split,
Shoeybi et al. 2019, arXiv:1909.08053, section 3): q, k, v and the MLP's first layer by columns
(output features), the attention's output projection and the MLP's second layer by rows (input
features); their module names within a block (`attention.q`, ..., `mlp.up`, `mlp.down`; the blocks are
`block0`, `block1`, ...) are what `COLUMNWISE` and `ROWWISE` list for the tensor-parallel rungs.

Parameter count, with width w, depth d, sequence length L, vocabulary V and C classes
(`transformer_num_params` computes it; a test checks it against the module):

    V*w + L*w                      embeddings
  + d * (12*w*w + 13*w)            per block: q, k, v, out (4*w*w + 4*w), MLP (8*w*w + 5*w), 2 LayerNorms (4*w)
  + 2*w + w*C + C                  final LayerNorm, classifier

Of these, tensor parallelism splits d * (12*w*w + 7*w) 1/TP per rank (`transformer_sharded_params`:
the six layers' weights and the column-wise layers' biases); the row-wise layers' biases (d * 2*w),
the embeddings, LayerNorms and classifier stay whole on every rank.  The defaults (w=1024, d=8,
16 heads, L=128: about 101M parameters, 0.4 GB in fp32, 1.2 GB with gradients and SGD momentum)
make sharding worth it on a GPU node; `--width 64 --depth 2 --heads 4 --seq-len 32` trains in
seconds on a laptop's CPU.
"""
from __future__ import annotations

MODELS = ("cnn", "transformer")
VOCAB_SIZE = 256  # tokens are bytes (scaledl.datasets.tokens)
TRANSFORMER_DEFAULTS = {"width": 1024, "depth": 8, "heads": 16, "seq_len": 128}
# Module names (within a block) that tensor parallelism splits by output and by input features.
COLUMNWISE = ("attention.q", "attention.k", "attention.v", "mlp.up")
ROWWISE = ("attention.out", "mlp.down")


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


def transformer_num_params(width: int, depth: int, seq_len: int, vocab_size: int = VOCAB_SIZE,
                           num_classes: int = 10) -> int:
    """The transformer's parameter count (the module docstring's formula)."""
    return (vocab_size + seq_len) * width + depth * (12 * width * width + 13 * width) + 2 * width \
        + width * num_classes + num_classes


def transformer_sharded_params(width: int, depth: int) -> int:
    """Parameters of the layers tensor parallelism shards (weights of all six, biases of the
    column-wise four): each rank holds 1/TP of these."""
    return depth * (12 * width * width + 7 * width)


def transformer(width: int = TRANSFORMER_DEFAULTS["width"], depth: int = TRANSFORMER_DEFAULTS["depth"],
                heads: int = TRANSFORMER_DEFAULTS["heads"], seq_len: int = TRANSFORMER_DEFAULTS["seq_len"],
                vocab_size: int = VOCAB_SIZE, num_classes: int = 10):
    """The transformer sequence classifier (see the module docstring): its input is a batch of
    token ids, as N x L or in the data sets' image layout N x 1 x L x 1 (floats holding ids)."""
    from collections import OrderedDict

    import torch
    import torch.nn.functional as F
    from torch import nn

    if width % heads:
        raise ValueError(f"width {width} is not a multiple of heads {heads}")

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.head_dim = width // heads
            self.q, self.k, self.v, self.out = (nn.Linear(width, width) for _ in range(4))

        def forward(self, x):
            batch, length, _ = x.shape
            # -1 heads, not `heads`: under tensor parallelism each rank holds a slice of the heads.
            q, k, v = (f(x).view(batch, length, -1, self.head_dim).transpose(1, 2) for f in (self.q, self.k, self.v))
            mixed = F.scaled_dot_product_attention(q, k, v)
            return self.out(mixed.transpose(1, 2).reshape(batch, length, -1))

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

        def forward(self, x):
            return self.down(F.gelu(self.up(x)))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention_norm, self.attention = nn.LayerNorm(width), Attention()
            self.mlp_norm, self.mlp = nn.LayerNorm(width), MLP()

        def forward(self, x):
            x = x + self.attention(self.attention_norm(x))
            return x + self.mlp(self.mlp_norm(x))

    class Embed(nn.Module):
        def __init__(self):
            super().__init__()
            self.token, self.position = nn.Embedding(vocab_size, width), nn.Embedding(seq_len, width)

        def forward(self, x):
            tokens = x.reshape(len(x), -1).long()  # N x 1 x L x 1 (the loaders' layout) -> N x L
            return self.token(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))

    class Pool(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(width)

        def forward(self, x):
            return self.norm(x).mean(1)  # N x L x width -> N x width

    # A Sequential, like the CNN: FSDP2 shards it layer by layer (a block at a time), and the names
    # block0, block1, ... let a tensor-parallel plan pick the blocks with one pattern ("block*.mlp.up").
    return nn.Sequential(OrderedDict(embed=Embed(), **{f"block{i}": Block() for i in range(depth)}, pool=Pool(),
                                     head=nn.Linear(width, num_classes)))


def for_config(config, data, framework: str = "torch"):
    """The model `--model` names, sized for the data set (and, the transformer, by its flags)."""
    if config.model == "transformer":
        return transformer(config.width, config.depth, config.heads, config.seq_len, num_classes=data.num_classes)
    return for_dataset(data, framework)


def for_dataset(data, framework: str = "torch"):
    """The CNN sized for a `scaledl.datasets.Dataset`."""
    height, _, channels = data.image_shape
    if framework == "torch":
        return torch_cnn(channels, data.num_classes, height)
    return keras_cnn(data.image_shape, data.num_classes)
