"""The transformer block both transformers are built of: the sequence classifier's and the
language model's (`scaledl.models`).  It imports torch; `scaledl.models` imports it only when
it builds one.

A block is GPT-2's pre-norm block (Radford et al. 2019): x + attention(LayerNorm(x)), then
x + MLP(LayerNorm(x)), the MLP 4x wide with GELU, no dropout.  Its linear layers carry the
names tensor parallelism plans by (`attention.q`, `.k`, `.v`, `.out`, `mlp.up`, `mlp.down`;
`scaledl.models.COLUMNWISE` and `ROWWISE`).

Recomputation (`--recompute`) is the block's own business, so that a rung's loop and a
tensor-parallel plan see the same module names with and without it:

- `none`: autograd keeps what each operation saved for its backward (about 16 s*b*h values a
  block, `scaledl.activations`);
- `full`: the block keeps its input only and runs its forward again during backward
  (`torch.utils.checkpoint`, non-reentrant: it works with DDP, FSDP2 and DTensor);
- `selective`: the outputs of the matrix multiplications and of attention are kept, the cheap
  operations between them (the norms, GELU, the reshapes) run again (a policy for
  `torch.utils.checkpoint.create_selective_checkpoint_contexts`, imported when a block asks for
  it, so that a torch without it still builds the other modes).  The idea is Korthikanti et
  al.'s (2022, arXiv:2205.05198, section 5: recompute what is big and cheap to compute again),
  whose selective recomputation reruns the attention core; a fused attention kernel already
  does that, so here it is the norms and GELU.  torchtitan's op-level selective checkpointing
  uses the same mechanism (it also recomputes every second matrix product).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

_aten = torch.ops.aten
# What `selective` keeps: matrix multiplications and every fused attention kernel torch may pick
# (the CPU's flash kernel, CUDA's flash, memory-efficient and cuDNN ones; XPU's where it has one).
_KEEP = {_aten.mm.default, _aten.addmm.default, _aten.bmm.default, _aten.baddbmm.default}
for _name in ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
              "_scaled_dot_product_fused_attention_overrideable"):
    if hasattr(_aten, _name):
        _KEEP.add(getattr(_aten, _name).default)


def _selective_policy(ctx, op, *args, **kwargs):
    from torch.utils.checkpoint import CheckpointPolicy

    return CheckpointPolicy.MUST_SAVE if op in _KEEP else CheckpointPolicy.PREFER_RECOMPUTE


def _selective_contexts():
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_selective_policy)


# --recompute's modes (scaledl.models.RECOMPUTE, which a test holds equal) -> torch.utils.checkpoint's options.
CHECKPOINT_OPTIONS = {"none": None, "selective": {"context_fn": _selective_contexts}, "full": {}}


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, causal: bool):
        super().__init__()
        self.head_dim, self.causal = width // heads, causal
        self.q, self.k, self.v, self.out = (nn.Linear(width, width) for _ in range(4))

    def forward(self, x):
        batch, length, _ = x.shape
        # -1 heads, not `heads`: under tensor parallelism each rank holds a slice of the heads.
        q, k, v = (f(x).view(batch, length, -1, self.head_dim).transpose(1, 2) for f in (self.q, self.k, self.v))
        mixed = F.scaled_dot_product_attention(q, k, v, is_causal=self.causal)  # a fused kernel: no s*s matrix kept
        return self.out(mixed.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    checkpoint_function = None  # `full` recomputes through torch.utils.checkpoint unless `use_checkpoint` says

    def __init__(self, width: int, heads: int, causal: bool = False, recompute: str = "none"):
        super().__init__()
        if recompute not in CHECKPOINT_OPTIONS:
            raise ValueError(f"recompute must be one of {', '.join(CHECKPOINT_OPTIONS)}, got {recompute!r}")
        self.recompute = recompute
        self.attention_norm, self.attention = nn.LayerNorm(width), Attention(width, heads, causal)
        self.mlp_norm, self.mlp = nn.LayerNorm(width), MLP(width)

    def layers(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.mlp(self.mlp_norm(x))

    def forward(self, x):
        if self.recompute == "none" or not torch.is_grad_enabled():
            return self.layers(x)
        if self.recompute == "full" and self.checkpoint_function is not None:
            return self.checkpoint_function(self.layers, x)
        return checkpoint(self.layers, x, use_reentrant=False, **CHECKPOINT_OPTIONS[self.recompute])


def use_checkpoint(model, function) -> int:
    """Recompute the model's `full` blocks through `function(run, x)` instead of torch.utils.checkpoint
    (the DeepSpeed rung passes `deepspeed.checkpointing.checkpoint`, which its config's
    activation_checkpointing section steers); returns how many blocks it set."""
    blocks = [module for module in model.modules() if isinstance(module, Block) and module.recompute == "full"]
    for block in blocks:
        block.checkpoint_function = function
    return len(blocks)


class Embed(nn.Module):
    """Token and learned position embeddings; takes ids as N x L or in the loaders' N x 1 x L x 1 layout."""

    def __init__(self, vocab_size: int, seq_len: int, width: int):
        super().__init__()
        self.token, self.position = nn.Embedding(vocab_size, width), nn.Embedding(seq_len, width)

    def forward(self, x):
        tokens = x.reshape(len(x), -1).long()  # N x 1 x L x 1 (the loaders' layout, floats holding ids) -> N x L
        return self.token(tokens) + self.position(torch.arange(tokens.shape[1], device=tokens.device))


class Pool(nn.Module):
    """The classifier's: a final LayerNorm, then the mean over the sequence."""

    def __init__(self, width: int):
        super().__init__()
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(x).mean(1)  # N x L x width -> N x width


class NextToken(nn.Module):
    """The language model's head: a final LayerNorm and a linear layer to the vocabulary, its logits
    returned N x V x L, the class dimension second as `F.cross_entropy` takes it, so that a rung's
    `F.cross_entropy(logits, y)` and `logits.argmax(1) == y` serve next-token targets y (N x L)
    unchanged."""

    def __init__(self, width: int, vocab_size: int):
        super().__init__()
        self.norm, self.linear = nn.LayerNorm(width), nn.Linear(width, vocab_size)

    def forward(self, x):
        return self.linear(self.norm(x)).transpose(1, 2)
