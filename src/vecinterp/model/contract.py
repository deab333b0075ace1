"""Named-axis contractions, compiled once per pattern.

``contract("batch pos d_model, d_model d_mlp -> batch pos d_mlp", x, W, b)`` is
``einops.einsum(x, W, pattern) + b``, spelled with the same full axis names, but the
pattern is parsed once (not on every call) and the common "activation times weight plus
bias" shape runs as a single fused ``addmm`` on a flattened view instead of an einsum
followed by a separate bias pass. Everything else falls back to ``torch.einsum``.
"""

import functools
import string
from collections.abc import Callable

import torch


@functools.cache
def _plan(pattern: str) -> Callable[..., torch.Tensor]:
    try:
        lhs, out = (s.strip() for s in pattern.split("->"))
        left, right = (s.split() for s in lhs.split(","))
    except ValueError:
        raise ValueError(
            f"contract pattern must be 'a b, b c -> a c'-like, got {pattern!r}"
        ) from None
    out_axes = out.split()
    names = list(dict.fromkeys(left + right + out_axes))
    if len(names) > len(string.ascii_letters):
        raise ValueError(f"too many axes in {pattern!r}")
    letter = dict(zip(names, string.ascii_letters, strict=False))
    spec = "".join(letter[a] for a in left) + "," + "".join(letter[a] for a in right)
    spec += "->" + "".join(letter[a] for a in out_axes)
    contracted = [a for a in left if a in right and a not in out_axes]
    lead = left[: len(left) - len(contracted)]
    new = [a for a in right if a not in contracted]
    # fused path: left = lead + contracted (trailing), out = lead + new, right = C ∪ new
    if (
        contracted
        and left[len(lead) :] == contracted
        and out_axes == lead + new
        and all(a not in right for a in lead)
    ):
        perm = [right.index(a) for a in contracted + new]
        n_c = len(contracted)
        identity = perm == list(range(len(perm)))

        def fused(
            x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None
        ) -> torch.Tensor:
            wp = w if identity else w.permute(perm)
            k = 1
            for size in wp.shape[:n_c]:
                k *= size
            w2 = wp.reshape(k, -1)
            x2 = x.reshape(-1, k)
            y = x2 @ w2 if bias is None else torch.addmm(bias.reshape(-1), x2, w2)
            return y.view(*x.shape[: x.ndim - n_c], *wp.shape[n_c:])

        return fused

    def general(x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.einsum(spec, x, w)
        return y if bias is None else y + bias

    return general


def contract(
    pattern: str, x: torch.Tensor, w: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``einops.einsum(x, w, pattern) (+ bias)`` with the pattern compiled once.

    Example:
        >>> import torch
        >>> x, w = torch.ones(2, 3, 4), torch.ones(4, 5)
        >>> contract("batch pos d_model, d_model d_out -> batch pos d_out", x, w).shape
        torch.Size([2, 3, 5])
    """
    return _plan(pattern)(x, w, bias)
