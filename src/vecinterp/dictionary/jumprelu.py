"""JumpReLU and its step function with straight-through pseudo-derivatives (Rajamanoharan
et al., "Jumping Ahead: Improving Reconstruction Fidelity with JumpReLU Sparse
Autoencoders", 2024, arXiv 2407.14435), as SAELens implements them.

With threshold ``theta > 0``, bandwidth ``eps`` and the rectangle kernel
``K(u) = 1{-1/2 < u < 1/2}``:

- ``jumprelu(z, theta) = z * H(z - theta)``; its gradient in ``z`` is the true one,
  ``H(z - theta)``; in ``theta`` the pseudo-derivative ``-(theta / eps) K((z - theta) / eps)``.
- ``step(z, theta) = H(z - theta)`` (the L0 penalty counts it); no gradient in ``z``; in
  ``theta`` the pseudo-derivative ``-(1 / eps) K((z - theta) / eps)``.

The pseudo-derivative of the step is its central difference with step ``eps / 2``:
``(H(z - theta - eps/2) - H(z - theta + eps/2)) / eps``; the tests check both against it.
Gradients in ``theta`` are summed over the leading axes (``theta`` is ``[d_sae]``).
"""

from typing import Any

import torch


def rectangle(u: torch.Tensor) -> torch.Tensor:
    """The rectangle kernel ``K(u) = 1{-1/2 < u < 1/2}``, in ``u``'s dtype.

    Example:
        >>> import torch
        >>> from vecinterp.dictionary.jumprelu import rectangle
        >>> rectangle(torch.tensor([-0.6, -0.4, 0.0, 0.4, 0.6]))
        tensor([0., 1., 1., 1., 0.])
    """
    return ((u > -0.5) & (u < 0.5)).to(u.dtype)


def _sum_to(grad: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    return grad.reshape(-1, *shape).sum(0) if grad.dim() > len(shape) else grad


class _JumpReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, theta: torch.Tensor, eps: float) -> torch.Tensor:
        ctx.save_for_backward(z, theta)
        ctx.eps = eps
        return z * (z > theta).to(z.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, None]:
        z, theta = ctx.saved_tensors
        eps = ctx.eps
        grad_z = (z > theta).to(z.dtype) * grad
        grad_theta = -(theta / eps) * rectangle((z - theta) / eps) * grad
        return grad_z, _sum_to(grad_theta, theta.shape), None


class _Step(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, z: torch.Tensor, theta: torch.Tensor, eps: float) -> torch.Tensor:
        ctx.save_for_backward(z, theta)
        ctx.eps = eps
        return (z > theta).to(z.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[None, torch.Tensor, None]:
        z, theta = ctx.saved_tensors
        eps = ctx.eps
        grad_theta = -(1.0 / eps) * rectangle((z - theta) / eps) * grad
        return None, _sum_to(grad_theta, theta.shape), None


def jumprelu(z: torch.Tensor, theta: torch.Tensor, bandwidth: float) -> torch.Tensor:
    """``z * H(z - theta)`` for pre-activations ``z [..., d_sae]`` and thresholds ``theta
    [d_sae]``, with the straight-through pseudo-derivative in ``theta``.

    Example:
        >>> import torch
        >>> from vecinterp.dictionary.jumprelu import jumprelu
        >>> z = torch.tensor([[0.5, 0.05, -1.0]])
        >>> jumprelu(z, torch.tensor([0.1, 0.1, 0.1]), bandwidth=0.1)
        tensor([[0.5000, 0.0000, -0.0000]])
    """
    return _JumpReLU.apply(z, theta, bandwidth)


def step(z: torch.Tensor, theta: torch.Tensor, bandwidth: float) -> torch.Tensor:
    """``H(z - theta)`` (1 where a feature fires), with the straight-through
    pseudo-derivative in ``theta`` and none in ``z``: what JumpReLU's L0 penalty counts.

    Example:
        >>> import torch
        >>> from vecinterp.dictionary.jumprelu import step
        >>> step(torch.tensor([[0.5, 0.05, -1.0]]), torch.tensor([0.1, 0.1, 0.1]), 0.1)
        tensor([[1., 0., 0.]])
    """
    return _Step.apply(z, theta, bandwidth)
