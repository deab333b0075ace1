"""Shared test helpers: small random models whose every parameter is non-trivial."""

import contextlib
import itertools
from collections.abc import Iterator

import jaxtyping
import torch

import vecinterp as vi

NORMALIZATIONS = ["LN", "LNPre", "RMS", "RMSPre", None]
POSITIONALS = ["learned", "sinusoidal", "rotary", "none"]
ACT_FNS = ["relu", "gelu", "gelu_tanh", "silu"]


def tiny_cfg(**overrides) -> vi.VectorTransformerConfig:
    """A 2-layer model small enough for hundreds of forward passes per second."""
    kwargs = dict(d_in=3, d_out=5, d_model=8, d_head=4, n_heads=2, n_layers=2, d_mlp=16, n_ctx=7)
    kwargs.update(overrides)
    return vi.VectorTransformerConfig(**kwargs)


def random_model(
    cfg: vi.VectorTransformerConfig,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    scale: float = 0.5,
) -> vi.HookedVectorTransformer:
    """A model with every parameter (biases, norm weights too) drawn at random, so that no
    identity holds by accident of zero biases or unit norm weights."""
    model = vi.HookedVectorTransformer(cfg, seed=seed, dtype=dtype)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float64).to(dtype)
            if name.endswith(".w"):
                p.copy_(1 + 0.3 * noise)
            else:
                p.add_(scale * noise)
    return model


def random_input(
    cfg: vi.VectorTransformerConfig,
    batch: int = 3,
    n_pos: int | None = None,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    n = cfg.n_ctx if n_pos is None else n_pos
    return torch.randn(batch, n, cfg.d_in, generator=gen, dtype=torch.float64).to(dtype)


def all_option_cfgs():
    """Every normalization x positional x act_fn x causal combination (160 configs)."""
    for norm, pos, act, causal in itertools.product(
        NORMALIZATIONS, POSITIONALS, ACT_FNS, [True, False]
    ):
        yield tiny_cfg(
            normalization=norm, positional=pos, act_fn=act, causal=causal, embed_bias=True
        )


@contextlib.contextmanager
def unchecked() -> Iterator[None]:
    """Switch the suite's jaxtyping + beartype runtime checks off for the block.

    The test suite runs vecinterp under that import hook, which rejects an argument that
    contradicts its annotation before the library's own checks run; users do not run the
    checker, so the library's own messages are tested with it switched off."""
    before = jaxtyping.config.jaxtyping_disable
    jaxtyping.config.update("jaxtyping_disable", True)
    try:
        yield
    finally:
        jaxtyping.config.update("jaxtyping_disable", before)


def random_dictionary(dtype: str, log_threshold_range: tuple[float, float] = (-5.0, 1.0), **kw):
    """A small dictionary (d_in 6, d_sae 10, reading ``blocks.0.hook_resid_pre``) with
    every parameter drawn from N(0, 1) in float64 (seeded), JumpReLU's log thresholds
    uniform in ``log_threshold_range`` and BatchTopK's threshold 0.125: weights away from
    their start, so every part of a file or a computation is exercised."""
    from vecinterp.dictionary import DictionaryConfig
    from vecinterp.dictionary.modules import make_dictionary

    cfg = DictionaryConfig(d_in=6, d_sae=10, dtype=dtype, hook_in="blocks.0.hook_resid_pre", **kw)
    d = make_dictionary(cfg, seed=3)
    gen = torch.Generator().manual_seed(4)
    low, high = log_threshold_range
    with torch.no_grad():
        for p in d.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64))
        if d.log_threshold is not None:
            u = torch.rand(10, generator=gen, dtype=torch.float64)
            d.log_threshold.copy_(u * (high - low) + low)
        if d.threshold is not None:
            d.threshold.fill_(0.125)
    return d
