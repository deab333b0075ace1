"""Helpers shared by the importer tests (test_import_hf, test_import_llama,
test_import_torch_encoder): seeded random weights, the source's forward through Hugging
Face's ``inputs_embeds``, and the relative error every agreement is stated in."""

import torch
from torch import nn

F64 = torch.float64


def noise(p: torch.Tensor, gen: torch.Generator, scale: float) -> torch.Tensor:
    """``scale`` times standard normal draws shaped like ``p`` (drawn in float64)."""
    return scale * torch.randn(p.shape, generator=gen, dtype=F64).to(p.dtype)


def linear(d_in, d_out, *, bias=True, dtype=F64, seed=1):
    """An ``nn.Linear`` with seeded random weights (and bias), the global RNG untouched."""
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        lin = nn.Linear(d_in, d_out, bias=bias).to(dtype)
    with torch.no_grad():
        for p in lin.parameters():
            p.copy_(noise(p, gen, 0.5))
    return lin


def hf_forward(backbone, read_in, read_out, x):
    """``(read_out(backbone(inputs_embeds=read_in(x)).last_hidden_state), hidden_states)``."""
    with torch.no_grad():
        out = backbone(inputs_embeds=read_in(x), output_hidden_states=True)
        return read_out(out.last_hidden_state), out.hidden_states


def rel_err(ours, theirs):
    """``max |ours - theirs| / max |theirs|``."""
    return ((ours - theirs).abs().max() / theirs.abs().max()).item()
