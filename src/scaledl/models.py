"""The models the rungs train, defined once: a small CNN (the default), a transformer sequence
classifier, and a GPT-style causal language model.

The CNN, for PyTorch and for Keras, is small on purpose: it reaches ~98% on MNIST in a few CPU
epochs, so the workshop runs on a laptop, and its few weights make communication cost visible
next to compute.  Both versions have the same layers and parameter count, so PyTorch and
TensorFlow rungs are comparable.

The transformer (`--model transformer`, PyTorch only) is a sequence classifier on the synthetic
token sequences of `scaledl.datasets` (`--dataset tokens`): token and position embeddings,
`depth` pre-norm blocks (`scaledl.layers.Block`: multi-head self-attention and a 4x-wide MLP),
mean pooling over the sequence, and a linear classifier, so every rung's loop (cross-entropy on
logits, accuracy) stays as it is.  Its linear layers are what tensor parallelism shards (the
Megatron-LM split, Shoeybi et al. 2019, arXiv:1909.08053, section 3): q, k, v and the MLP's first
layer by columns (output features), the attention's output projection and the MLP's second layer
by rows (input features); their module names within a block (`attention.q`, ..., `mlp.up`,
`mlp.down`; the blocks are `block0`, `block1`, ...) are what `COLUMNWISE` and `ROWWISE` list for
the tensor-parallel rungs.

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

The language model (`--model gpt`, on `--dataset text`, `scaledl.corpus`) is GPT-2's layout
(Radford et al. 2019): the same blocks, causal, then a final LayerNorm and a linear layer to the
256 byte values (`scaledl.layers.NextToken`), its head not tied to the token embedding (so that
a pipeline stage or a tensor-parallel plan never holds one weight in two places).  Its loss is
next-token cross-entropy, its throughput tokens/s.  Its count is the classifier's with the
vocabulary as the classes (`gpt_num_params`): V*w + L*w + d*(12*w*w + 13*w) + 2*w + w*V + V.
`--preset` names a size (`GPT_PRESETS`: from `tiny`, 0.88M, to GPT-3 2.7B's shape, 2.52B here);
`--width`, `--depth`, `--heads` and `--seq-len` change one dimension of it.
"""
from __future__ import annotations

MODELS = ("cnn", "transformer", "gpt")
VOCAB_SIZE = 256  # tokens are bytes (scaledl.datasets.tokens, scaledl.corpus)
TRANSFORMER_DEFAULTS = {"width": 1024, "depth": 8, "heads": 16, "seq_len": 128}
# The language model's sizes, by the name of the model whose shape each one has (GPT-2: Radford et
# al. 2019, table 2, with the heads of the released models; GPT-3: Brown et al. 2020,
# arXiv:2005.14165, table 2.1: 2.7B's 32 heads of 80 as there, but 16 heads of 128 for the XL,
# whose 24 heads of 128 the table gives do not make its width of 2048).  Their counts here are smaller than
# the names say: the vocabulary is 256 bytes, not GPT-2's 50,257 tokens (gpt_num_params).
GPT_PRESETS = {
    "tiny": {"width": 128, "depth": 4, "heads": 4, "seq_len": 128},          # 0.88M: milliseconds a step on a CPU core
    "small": {"width": 384, "depth": 6, "heads": 6, "seq_len": 256},         # 10.9M: nanoGPT's character-level GPT
    "gpt2-small": {"width": 768, "depth": 12, "heads": 12, "seq_len": 1024},    # 86M
    "gpt2-medium": {"width": 1024, "depth": 24, "heads": 16, "seq_len": 1024},  # 304M
    "gpt3-xl": {"width": 2048, "depth": 24, "heads": 16, "seq_len": 2048},      # 1.21B
    "gpt3-2.7b": {"width": 2560, "depth": 32, "heads": 32, "seq_len": 2048},    # 2.52B
}
GPT_DEFAULT = "tiny"
# --recompute: what a block keeps for its backward (scaledl.layers says what each one does).
RECOMPUTE = ("none", "selective", "full")
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
                vocab_size: int = VOCAB_SIZE, num_classes: int = 10, recompute: str = "none"):
    """The transformer sequence classifier (see the module docstring): its input is a batch of
    token ids, as N x L or in the data sets' image layout N x 1 x L x 1 (floats holding ids)."""
    from collections import OrderedDict

    from torch import nn

    from scaledl import layers

    if width % heads:
        raise ValueError(f"width {width} is not a multiple of heads {heads}")
    # A Sequential, like the CNN: FSDP2 shards it layer by layer (a block at a time), and the names
    # block0, block1, ... let a tensor-parallel plan pick the blocks with one pattern ("block*.mlp.up").
    blocks = {f"block{i}": layers.Block(width, heads, recompute=recompute) for i in range(depth)}
    return nn.Sequential(OrderedDict(embed=layers.Embed(vocab_size, seq_len, width), **blocks,
                                     pool=layers.Pool(width), head=nn.Linear(width, num_classes)))


def gpt_num_params(width: int, depth: int, seq_len: int, vocab_size: int = VOCAB_SIZE) -> int:
    """The language model's parameter count: the classifier's, with the vocabulary as its classes."""
    return transformer_num_params(width, depth, seq_len, vocab_size, num_classes=vocab_size)


def gpt_flops_per_token(width: int, depth: int, seq_len: int, vocab_size: int = VOCAB_SIZE) -> int:
    """Model flops of one training step per token (forward and backward, no recomputation): 6 per
    parameter that multiplies (all but the embeddings, which are looked up) and 12 * depth * width
    * seq_len for attention's two s x s products (PaLM's count, Chowdhery et al. 2022,
    arXiv:2204.02311, appendix B; the causal mask's skipped half counted, as there)."""
    multiplying = gpt_num_params(width, depth, seq_len, vocab_size) - (vocab_size + seq_len) * width
    return 6 * multiplying + 12 * depth * width * seq_len


def gpt(width: int = GPT_PRESETS[GPT_DEFAULT]["width"], depth: int = GPT_PRESETS[GPT_DEFAULT]["depth"],
        heads: int = GPT_PRESETS[GPT_DEFAULT]["heads"], seq_len: int = GPT_PRESETS[GPT_DEFAULT]["seq_len"],
        vocab_size: int = VOCAB_SIZE, recompute: str = "none"):
    """The causal language model (see the module docstring): ids N x L (or N x 1 x L x 1) in,
    logits N x V x L out (`scaledl.layers.NextToken`)."""
    from collections import OrderedDict

    from torch import nn

    from scaledl import layers

    if width % heads:
        raise ValueError(f"width {width} is not a multiple of heads {heads}")
    blocks = {f"block{i}": layers.Block(width, heads, causal=True, recompute=recompute) for i in range(depth)}
    return nn.Sequential(OrderedDict(embed=layers.Embed(vocab_size, seq_len, width), **blocks,
                                     head=layers.NextToken(width, vocab_size)))


def for_config(config, data, framework: str = "torch"):
    """The model `--model` names, sized for the data set (and, the transformer, by its flags)."""
    if config.model == "transformer":
        return transformer(config.width, config.depth, config.heads, config.seq_len, num_classes=data.num_classes,
                           recompute=config.recompute)
    if config.model == "gpt":
        return gpt(config.width, config.depth, config.heads, config.seq_len, recompute=config.recompute)
    return for_dataset(data, framework)


def for_dataset(data, framework: str = "torch"):
    """The CNN sized for a `scaledl.datasets.Dataset`."""
    height, _, channels = data.image_shape
    if framework == "torch":
        return torch_cnn(channels, data.num_classes, height)
    return keras_cnn(data.image_shape, data.num_classes)
