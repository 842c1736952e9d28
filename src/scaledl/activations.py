"""Activation memory: what a forward pass leaves for its backward, counted live and by formula.

    held = activations.held_by_forward(model, x)[0]       # bytes, measured
    activations.block_bytes(seq_len, batch, width, heads)   # bytes, predicted for one block

Measured: every tensor an operation creates during the forward (a `TorchDispatchMode` sees each
one) that is still alive once the forward has returned is held for the backward, by autograd's
saved tensors or by a recomputation's cache; its storage counts once, however many views of it
were saved.  Parameters (and the transposed views of them a linear layer saves), the inputs and
the output do not count.  A GPU's allocator shows nearly the same growth (it rounds each
block up; the gpu tier compares them); this count works on any device, a CPU included.

Predicted, per block of `scaledl.layers.Block` (s tokens, b samples, width h, a heads; e bytes a
value, 4 in fp32), with `--recompute`:

- none: e * s*b * (16*h + 4 + a).  The block's input (kept by the first LayerNorm), the two
  LayerNorms' inputs and outputs (4*sbh) and their means and inverse deviations (4*sb), q, k, v
  (3*sbh), attention's output (sbh, which is also the output projection's input: a view, one
  storage) and its log-sum-exp (a*s*b), the MLP's 4h-wide input to GELU and input to the second
  layer (8*sbh).  Korthikanti et al. 2022 (arXiv:2205.05198, section 4.1) count 34*sbh + 5*a*s^2*b
  bytes for GPT's block in 16-bit with 1-byte dropout masks.  Without dropout its masks (2*sbh +
  a*s^2*b) and the attention dropout's output (2*a*s^2*b: the softmax is kept already) go,
  leaving 32*sbh + 2*a*s^2*b; and a fused attention kernel (which `scaled_dot_product_attention`
  picks wherever it can) keeps its output and the softmax's log-sum-exp instead of the s x s
  softmax: 32*sbh in 16-bit, this formula's 16 values per s*b*h.
- selective: e * s*b * (11*h + a): the block's input (kept for the recomputation), the six linear
  layers' outputs (q, k, v, out: 4*sbh; up: 4*sbh; down: sbh) and attention's output; the norms
  and GELU run again in backward.
- full: e * s*b*h: the block's input; the whole block runs again in backward, one block at a time,
  so the backward's peak adds one block's `none` bytes.

Split over tp tensor-parallel ranks (fp32; `scaledl.ladder.tensor_parallel`), per rank: q, k, v,
attention's output and log-sum-exp and the MLP's two 4h-wide tensors are cut by heads and features,
(12*h + a)/tp values a token; the norm regions are whole on every rank: the block's input, the sum
after attention, the two LayerNorms' outputs and their statistics, 4*h + 4.  Sequence parallelism
cuts the block's input, the sum and the statistics by tokens, (2*h + 4)/tp; the norms' outputs,
all-gathered to the whole sequence for the column-wise layers, are kept whole by those layers for
their weights' gradients: 2*h + (14*h + 4 + a)/tp.  Megatron-LM keeps each rank's share of those
too and all-gathers it again in backward (megatron/core/tensor_parallel/layers.py,
`LinearWithGradAccumulationAndAsyncCommunication`), reaching 1/tp of every tensor (Korthikanti et
al.'s 34*s*b*h/t, section 4.2.2); DTensor's `SequenceParallel` and `PrepareModuleInput` at torch
2.13 keep the gathered copies.  With `full`, a block keeps its input: h, or h/tp split by tokens.

The language model adds its head (`model_bytes`): the last LayerNorm's input and statistics and
the head's input, e * s*b * (2*h + 2), and the position ids (8 bytes each).

Under autocast (`--precision bf16` or `fp16`), in bytes, not values: the matrix products and
attention keep 16-bit tensors, but the residual stream (a block's input, and the sum after
attention) and the LayerNorms stay fp32, and q, k and v each cast the same normalized input to
16 bits for themselves (autocast casts per operation): 40*sbh + 16*sb + 4*a*sb a block
(4 + 6 + 6 + 2 + 4 + 2 + 8 + 8 bytes per s*b*h: the input, three casts, q, k, v, attention's
output, the sum, one cast, the MLP's two), 24*sbh + 4*a*sb with `selective`, 4*sbh with `full`;
the head 6*sbh + 8*sb.  Autocast also keeps a 16-bit copy of every linear layer's weight and
bias until its region ends (`torch.autocast`'s cast cache), 2 bytes each.  So bf16 keeps 5/8 of
fp32's activations here, not half: Korthikanti et al.'s all-16-bit count assumes the residual
stream and the norms in 16 bits too, and one cast for q, k and v (one fused projection).
"""
from __future__ import annotations

import time

from scaledl.models import RECOMPUTE, VOCAB_SIZE


PRECISIONS = ("fp32", "bf16", "fp16")


def _check(recompute: str, precision: str) -> None:
    if recompute not in RECOMPUTE:
        raise ValueError(f"recompute must be one of {', '.join(RECOMPUTE)}, got {recompute!r}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")


def block_bytes(seq_len: int, batch: int, width: int, heads: int, recompute: str = "none",
                bytes_per_value: int = 4, precision: str = "fp32", tp: int = 1,
                sequence_parallel: bool = False) -> float:
    """Bytes one block holds from its forward to its backward (the module docstring's formulas):
    fp32 values of `bytes_per_value` bytes, or under autocast (`precision` bf16 or fp16); on one of
    `tp` tensor-parallel ranks, with or without sequence parallelism (fp32, `none` or `full`)."""
    _check(recompute, precision)
    tokens = seq_len * batch
    if tp > 1 or sequence_parallel:
        if precision != "fp32" or recompute == "selective":
            raise ValueError("the tensor-parallel counts are derived for fp32 with recompute none or full")
        if recompute == "full":
            return bytes_per_value * tokens * width / (tp if sequence_parallel else 1)
        if sequence_parallel:
            return bytes_per_value * tokens * (2 * width + (14 * width + 4 + heads) / tp)
        return bytes_per_value * tokens * (4 * width + 4 + (12 * width + heads) / tp)
    if precision != "fp32":  # bytes: fp32 residual stream and norms, 16-bit products
        return tokens * {"none": 40 * width + 16 + 4 * heads, "selective": 24 * width + 4 * heads,
                         "full": 4 * width}[recompute]
    values = {"none": 16 * width + 4 + heads, "selective": 11 * width + heads, "full": width}
    return bytes_per_value * tokens * values[recompute]


def model_bytes(seq_len: int, batch: int, width: int, depth: int, heads: int, recompute: str = "none",
                bytes_per_value: int = 4, precision: str = "fp32", vocab_size: int = VOCAB_SIZE, tp: int = 1,
                sequence_parallel: bool = False) -> float:
    """Bytes the language model (`scaledl.models.gpt`) holds after its forward: its blocks, its
    head's LayerNorm input and statistics and linear layer's input, and the position ids; under
    autocast, also the 16-bit copies of the linear layers' weights and biases.  Split over `tp`
    ranks, the head stays whole on each (sequence parallelism all-gathers its input)."""
    _check(recompute, precision)
    tokens = seq_len * batch
    positions = 8 * seq_len  # the position ids (int64); the token ids are the input
    blocks = depth * block_bytes(seq_len, batch, width, heads, recompute, bytes_per_value, precision, tp,
                                 sequence_parallel)
    if precision == "fp32":
        return blocks + bytes_per_value * tokens * (2 * width + 2) + positions
    casts = 2 * (depth * (12 * width * width + 9 * width) + width * vocab_size + vocab_size)
    return blocks + tokens * (6 * width + 8) + casts + positions


def held_by_forward(module, *inputs):
    """(bytes the forward left for the backward, the output): see the module docstring."""
    import torch
    from torch.multiprocessing.reductions import StorageWeakRef
    from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
    from torch.utils._pytree import tree_leaves

    def local(tensor):
        """The tensor that holds the memory: a wrapper's inner one (a DTensor's shard on this rank, which tensor
        parallelism's layers hold and make; a collective's result that has not been waited for), or the tensor."""
        while is_traceable_wrapper_subclass(tensor):
            tensor = getattr(tensor, tensor.__tensor_flatten__()[0][0])
        return tensor

    def storage_of(tensor):
        return local(tensor).untyped_storage().data_ptr()

    excluded = {storage_of(p) for p in module.parameters()} | {storage_of(t) for t in inputs}

    class Created(TorchDispatchMode):
        """Every storage an operation creates, weakly (so that watching keeps nothing alive)."""

        def __init__(self):
            super().__init__()
            self.created = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in tree_leaves(out):
                if isinstance(tensor, torch.Tensor):
                    storage = local(tensor).untyped_storage()
                    known = self.created.get(storage.data_ptr())
                    if known is None or known[0].expired():  # new, or a freed one's address reused
                        self.created[storage.data_ptr()] = (StorageWeakRef(storage), storage.nbytes())
            return out

    watch = Created()
    with watch:
        output = module(*inputs)
    excluded |= {storage_of(t) for t in tree_leaves(output) if isinstance(t, torch.Tensor)}

    def alive() -> int:
        return sum(nbytes for pointer, (ref, nbytes) in watch.created.items()
                   if pointer not in excluded and not ref.expired())

    held = alive()
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        # A collective's buffers stay referenced by the backend's worker thread for a moment after the collective
        # has returned (gloo's ProcessGroupGloo::runLoop drops its work only once it holds its queue's lock again,
        # torch/csrc/distributed/c10d/ProcessGroupGloo.cpp): they are not kept for the backward.  Count again
        # until the count has held still for 5 looks in a row.
        deadline, still = time.monotonic() + 5, 0
        while still < 5 and time.monotonic() < deadline:
            time.sleep(0.01)
            again = alive()
            still, held = (still + 1 if again == held else 0), again
    return held, output
