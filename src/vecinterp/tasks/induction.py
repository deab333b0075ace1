"""Vector induction: a sequence of random unit vectors, then the same sequence again.

The induction-head story of Elhage et al. (2021), "A Mathematical Framework for Transformer
Circuits" (Transformer Circuits Thread, not on arXiv: transformer-circuits.pub/2021/framework;
section "Two-Layer Attention-Only Transformers"), with real vectors instead of tokens. A
sequence is ``m`` fresh random unit vectors ``r_1 .. r_m`` followed by the same ``m``
vectors again; at every position the model predicts the next vector. In the repeated half
the next vector has been seen before: it is the one that followed the previous occurrence
of the current vector, so a model that looks back for the current vector and copies its
successor (an induction head) predicts it exactly. A
2-layer attention-only model learns this with two heads connected by K-composition: a
previous-position head in layer 0 writes ``r_{i-1}`` into the residual stream at the
position of ``r_i``, and an induction head in layer 1 whose query is the current vector
and whose key reads what the layer-0 head wrote attends to the position right after the
previous occurrence and copies the vector there.

Encoding
--------
Positions are counted from 0 and the vectors are stored 0-based: ``vectors[:, k]`` is
``r_{k+1}``. Each ``r`` is a standard normal vector divided by its norm (uniform on the
unit sphere of ``R^dim``), drawn independently for every sequence. A batch has ONE
period ``m`` and ``2 m`` positions (no padding); with ``n = 2 m``::

    inputs   r_1 r_2 ... r_m  r_1 r_2 ... r_{m-1} r_m    [batch, 2m, dim]   (d_in = dim)
    targets  r_2 r_3 ... r_1  r_2 r_3 ... r_m     r_1    [batch, 2m, dim]   (d_out = dim)
    mask      F   F  ...  F    T   T  ...  T       T     [batch, 2m]        (bool)

that is, for every position ``t = 0 .. 2m-1``::

    inputs[:, t]  = vectors[:, t % m]
    targets[:, t] = vectors[:, (t + 1) % m]        (the next vector of the periodic sequence)
    loss_mask[:, t] = t >= m                       (exactly the repeated half)

The last target is ``r_1``: the sequence continued with its period, which is what comes
next after ``r_m`` in the repeated half (it followed ``r_m``'s first occurrence at
position ``m - 1``). ``targets[:, t] = inputs[:, t + 1]`` for ``t < 2m - 1``.

Which positions are scored, exactly: ``t >= m``, the ``m`` positions of the second copy.
At such a ``t`` the current vector ``r = inputs[:, t]`` occurred before at ``t - m``, and
the target is the vector at ``t - m + 1``, the position right after that occurrence:
exactly the induction map of :func:`vecinterp.induction_target`
(``D[t, t - m + 1] = 1``), whose rows ``t >= m`` are the rows the mask scores. Positions
``t < m`` are left out: their targets are fresh random vectors that nothing earlier in the
sequence determines (the loss-minimising prediction there is 0), except ``t = m - 1``,
whose target ``r_1`` is the input at position 0. That one is predictable only by a rule
that knows ``m`` in advance (with a fixed ``m``, "at position ``m - 1`` copy position 0"),
never by induction (``r_m`` has not occurred before), so it is not scored either.

Loss scale: every target has norm 1, so predicting 0 scores an MSE (mean over the ``dim``
components) of exactly ``1 / dim`` on every position. ``mse * dim`` is therefore the share
of the target's energy the model gets wrong: 1 for "predict 0", 0 for a perfect induction
head. Copying the current vector instead scores ``(2 - 2 cos(r_t, r_{t+1})) / dim``, about
``2 / dim``.

Fixed or variable ``m``
-----------------------
``generate(..., m=None)`` (the default, and what training uses) draws ``m`` uniformly
from the integers ``min_m .. max_m`` (both included) once per batch; ``m=k`` fixes it.
Training with a variable ``m`` matters: with one fixed ``m`` every target in the repeated
half sits at the fixed offset ``m - 1`` behind its position, so a single layer-0 head
attending to ``t - m + 1`` by position alone would solve the task without any induction.
With ``m`` varying from batch to batch, only the content of the sequence says where the
previous occurrence is. A fixed ``m`` is the right choice for analysis (one period per
batch is what :func:`~vecinterp.induction_score` needs). ``m >= 2``:
with ``m = 1`` the sequence is one vector twice and "induction" is copying the current
vector.

Random numbers and reuse of the detectors' generator
----------------------------------------------------
The vectors are exactly :func:`vecinterp.repeated_random_vectors` (the
input the induction detector expects), here with ``repeats=3`` and cut to ``2m + 1``
vectors to make the targets. That function takes an integer seed, so :func:`generate`
draws from its ``torch.Generator`` first ``m`` (only when ``m`` is None) and then one
integer ``vector_seed`` uniform in ``[0, 2**62)``, and calls
``repeated_random_vectors(batch_size, m, dim, seed=vector_seed, repeats=3)``. Everything
is drawn on the CPU in float64 and cast to ``dtype`` and moved to ``device`` at the end,
so a seed gives the same data on every device. ``seed=s`` is the same as
``generator=torch.Generator().manual_seed(s)``; with neither, torch's global CPU
generator is used, so ``torch.manual_seed`` makes :func:`generate` reproducible.

Model and training
------------------
:func:`model_config` builds the preset: a 2-layer attention-only transformer with
LayerNorm, ``n_ctx = 2 max_m`` and **rotary** positions. The positional choice matters; we
measured it (2 layers x 4 heads, d_model 64, 1,500 steps of batch 32):

- rotary (seed 0): the textbook circuit. A layer-0 head attends to the previous position,
  every layer-1 head is an induction head (score > 0.97 for m = 4, 10 and 16), and the
  K-composition from the previous-position head is far above the random baseline while Q-
  and V-composition are below it.
- learned ``W_pos`` (seeds 0 and 1): a low loss too, but through another 2-layer algorithm
  that a free position table makes cheap. Layer-0 heads attend to about half the current
  position (``s ≈ t/2`` and ``s ≈ (t-1)/2``), so position ``2k`` holds the pair
  ``(x_{k-1}, x_k)``, and a layer-1 head at ``t`` attends to position ``2 (t - m + 1)``,
  where that pair is ``(current vector, target)``. The detectors find neither a
  previous-position head in layer 0 nor an induction head in layer 1 (at m = 16 all those
  scores are below 0.07 and 0.02).
- sinusoidal (seed 0): did not learn the task in that budget (loss still 0.9 of the
  predict-0 loss).

Rotary attention depends on position only through the offset ``t - s``: "attend to the
previous position" is natural and "attend to half my position" impossible. For a rotary
model the QK circuits that :func:`~vecinterp.composition_scores` reads are those of offset
0 (rotation left out). The induction head must match content at every offset up to
``max_m - 1``, which favours the slowly turning rotary dimensions (with ``d_head = 16`` the
three lowest frequencies turn by less than 0.1 rad over 32 positions), where the offset-0
circuit is close to the real one; the example measures that the K-composition it gives
still singles out the previous-position head. Pass ``positional="learned"`` to
:func:`model_config` to reproduce the alternative.

``RECIPE`` trains the preset on a CPU in about 2 minutes (2,000 steps of batch 32; 111 s
on 2 busy cores, 50 s of CPU time); ``examples/induction_heads.py`` does that and analyses
the result with :mod:`vecinterp.tasks.induction_claims`.

One file because it is one task: its data, its model preset and its training recipe,
which users import together as ``induction``.

Example::

    import vecinterp as vi
    from vecinterp.tasks import induction

    result = induction.train_preset(seed=0)               # vi.train with RECIPE
    batch = induction.generate(64, m=10, seed=1)          # InductionBatch, 20 positions
    vi.induction_score(vi.attention_patterns(result.model, batch.inputs), m=batch.m)
"""

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Bool, Float

from ..analysis.detectors import repeated_random_vectors
from ..model.config import VectorTransformerConfig
from ..model.transformer import HookedVectorTransformer
from ..training import TrainResult, train
from ._common import check_device, check_dtype, check_int, resolve_generator, seeded_generator

__all__ = [
    "DEFAULT_DIM",
    "DEFAULT_MAX_M",
    "DEFAULT_MIN_M",
    "MIN_M",
    "RECIPE",
    "InductionBatch",
    "batches",
    "fixed_eval_set",
    "generate",
    "model_config",
    "train_preset",
]

DEFAULT_DIM = 16
"""Dimension of the random unit vectors (``d_in = d_out``)."""
DEFAULT_MIN_M = 4
"""Shortest period drawn when ``m`` is None."""
DEFAULT_MAX_M = 16
"""Longest period drawn when ``m`` is None (``2 * 16 = 32`` positions, the preset's n_ctx)."""
MIN_M = 2
"""The smallest period allowed (``m = 1`` would make induction the same as copying)."""

RECIPE: dict[str, Any] = dict(
    steps=2000,
    batch_size=32,
    lr=3e-3,
    weight_decay=0.01,
    warmup_steps=100,
    schedule="cosine",
    min_lr=1.5e-4,
    grad_clip=1.0,
)
"""Training recipe for :func:`model_config`'s model: ``batch_size`` for :func:`generate`,
everything else keyword arguments of :func:`vecinterp.train` (AdamW, masked MSE, fresh
batches with ``m`` drawn from ``DEFAULT_MIN_M .. DEFAULT_MAX_M``)."""

_SEED_BOUND = 2**62  # vector seeds are drawn uniformly from [0, _SEED_BOUND)


@dataclasses.dataclass(frozen=True, eq=False)
class InductionBatch:
    """One batch of sequences ``r_1 … r_m r_1 … r_m``, all with the same period ``m``.

    Attributes:
        inputs: ``[batch, pos, d_in]`` with ``pos = 2 m``; ``inputs[:, t] = vectors[:, t % m]``.
        targets: ``[batch, pos, d_out]``, the next vector:
            ``targets[:, t] = vectors[:, (t + 1) % m]``.
        loss_mask: ``[batch, pos]``, True exactly at the repeated half ``t >= m``.
        vectors: ``[batch, m, d_in]``, the random unit vectors ``r_1 .. r_m``.
        m: the period (number of distinct vectors per sequence).

    ``eq=False``: comparing batches field by field would compare tensors, which has no
    single truth value; compare the fields with ``torch.equal`` instead.

    Example:
        >>> from vecinterp.tasks.induction import generate
        >>> b = generate(2, m=3, dim=4, seed=0)
        >>> b.length, b.first_scored, b.loss_mask[0].tolist()
        (6, 3, [False, False, False, True, True, True])
    """

    inputs: Float[torch.Tensor, "batch pos d_in"]
    targets: Float[torch.Tensor, "batch pos d_out"]
    loss_mask: Bool[torch.Tensor, "batch pos"]
    vectors: Float[torch.Tensor, "batch m d_in"]
    m: int

    @property
    def length(self) -> int:
        """The number of positions, ``2 m``."""
        return self.inputs.shape[1]

    @property
    def first_scored(self) -> int:
        """The first scored position, ``m`` (the start of the repeated half)."""
        return self.m


def generate(
    batch_size: int,
    *,
    m: int | None = None,
    dim: int = DEFAULT_DIM,
    min_m: int = DEFAULT_MIN_M,
    max_m: int = DEFAULT_MAX_M,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> InductionBatch:
    """Draw one batch of repeated random-vector sequences (see the module docstring).

    ``inputs[:, t] = r_{t mod m}``, ``targets[:, t] = r_{(t+1) mod m}`` (0-based ``r``),
    ``loss_mask[:, t] = (t >= m)`` for ``t = 0 .. 2m-1``, with each ``r`` uniform on the unit
    sphere of ``R^dim``.

    Args:
        batch_size: number of sequences (>= 1).
        m: the period (>= 2); None draws it uniformly from ``min_m .. max_m``.
        dim: dimension of each vector (>= 1).
        min_m, max_m: the range of the drawn period, ``2 <= min_m <= max_m`` (checked even
            when ``m`` is given).
        generator: a CPU ``torch.Generator`` to draw from (its state advances).
        seed: seed of a fresh generator; give at most one of ``seed`` and ``generator``.
            With neither, torch's global CPU generator is used.
        dtype: floating dtype of the returned tensors (drawn in float64, then cast).
        device: where the returned tensors live (drawn on the CPU, then moved).

    Returns:
        An :class:`InductionBatch` with ``inputs``/``targets`` ``[batch_size, 2m, dim]``.

    Raises:
        ValueError: for an argument outside its allowed values.
        TypeError: ``generator`` is not a ``torch.Generator``.

    Example:
        >>> import torch
        >>> from vecinterp.tasks.induction import generate
        >>> b = generate(8, m=5, dim=4, seed=0)
        >>> b.inputs.shape, bool(torch.equal(b.inputs[:, :5], b.inputs[:, 5:]))
        (torch.Size([8, 10, 4]), True)
        >>> bool(torch.equal(b.targets[:, :-1], b.inputs[:, 1:]))
        True
    """
    _check_common(batch_size, dim, min_m, max_m, dtype)
    if m is not None:
        check_int("m", m, minimum=MIN_M, why=_WHY_MIN_M)
    generator = resolve_generator(generator, seed)
    device = check_device(device)
    if m is None:
        m = int(torch.randint(min_m, max_m + 1, (1,), generator=generator).item())
    vector_seed = int(torch.randint(0, _SEED_BOUND, (1,), generator=generator).item())
    seq = repeated_random_vectors(batch_size, m, dim, seed=vector_seed, repeats=3, dtype=dtype)
    seq = seq.to(device)
    positions = torch.arange(2 * m, device=device)
    # Separate copies, so that editing one field in place never changes another.
    return InductionBatch(
        inputs=seq[:, : 2 * m].clone(),
        targets=seq[:, 1 : 2 * m + 1].clone(),
        loss_mask=(positions >= m).expand(batch_size, -1).clone(),
        vectors=seq[:, :m].clone(),
        m=m,
    )


def batches(
    batch_size: int,
    *,
    seed: int,
    m: int | None = None,
    dim: int = DEFAULT_DIM,
    min_m: int = DEFAULT_MIN_M,
    max_m: int = DEFAULT_MAX_M,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> Iterator[InductionBatch]:
    """An endless stream of fresh batches, reproducible from ``seed``.

    Each batch draws its own ``m`` (unless ``m`` is given). The stream uses one private
    generator seeded with ``seed``, so its first batch equals
    ``generate(batch_size, seed=seed, ...)``. The arguments are checked now, not at the
    first ``next``.

    Example:
        >>> from vecinterp.tasks.induction import batches
        >>> stream = batches(4, seed=0, dim=3, min_m=2, max_m=5)
        >>> [next(stream).m for _ in range(4)]
        [2, 2, 5, 5]
    """
    _check_common(batch_size, dim, min_m, max_m, dtype)
    if m is not None:
        check_int("m", m, minimum=MIN_M, why=_WHY_MIN_M)
    generator = seeded_generator(seed)
    device = check_device(device)
    kwargs = dict(m=m, dim=dim, min_m=min_m, max_m=max_m, dtype=dtype, device=device)
    return _stream(batch_size, generator, kwargs)


def _stream(
    batch_size: int, generator: torch.Generator, kwargs: dict[str, Any]
) -> Iterator[InductionBatch]:
    # A separate generator function, so that batches() checks its arguments when called.
    while True:
        yield generate(batch_size, generator=generator, **kwargs)


def fixed_eval_set(
    n_batches: int,
    batch_size: int,
    seed: int,
    *,
    dim: int = DEFAULT_DIM,
    min_m: int = DEFAULT_MIN_M,
    max_m: int = DEFAULT_MAX_M,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> list[InductionBatch]:
    """A fixed evaluation set whose periods cycle through ``min_m``–``max_m``.

    Batch ``i`` has ``m = min_m + i % (max_m - min_m + 1)``, so every period is covered as
    evenly as ``n_batches`` allows. The batches come from one generator seeded with
    ``seed``; use a seed the training stream does not use. The mean of the per-batch
    losses (what :func:`vecinterp.evaluate` returns for a list) weights every period
    equally.

    Example:
        >>> from vecinterp.tasks.induction import fixed_eval_set
        >>> [b.m for b in fixed_eval_set(5, 2, seed=0, dim=3, min_m=2, max_m=4)]
        [2, 3, 4, 2, 3]
    """
    check_int("n_batches", n_batches, minimum=1)
    _check_common(batch_size, dim, min_m, max_m, dtype)
    generator = seeded_generator(seed)
    device = check_device(device)
    n_periods = max_m - min_m + 1
    return [
        generate(
            batch_size,
            m=min_m + i % n_periods,
            dim=dim,
            generator=generator,
            dtype=dtype,
            device=device,
        )
        for i in range(n_batches)
    ]


def model_config(
    dim: int = DEFAULT_DIM,
    max_m: int = DEFAULT_MAX_M,
    *,
    d_model: int = 64,
    n_heads: int = 4,
    d_head: int = 16,
    normalization: str | None = "LN",
    positional: str = "rotary",
) -> VectorTransformerConfig:
    """The preset model: 2 layers, attention only, ``d_in = d_out = dim``, ``n_ctx = 2 max_m``.

    Rotary positions by default (see "Model and training" in the module docstring for why
    not a learned ``W_pos``); pass ``positional="learned"`` to study the alternative.

    Args:
        dim: the vector dimension (``d_in`` and ``d_out``).
        max_m: the longest period the model must handle; ``n_ctx = 2 * max_m``.
        d_model, n_heads, d_head: widths.
        normalization: ``"LN"`` (default), ``"LNPre"``, ``"RMS"``, ``"RMSPre"`` or None.
        positional: ``"rotary"`` (default), ``"learned"``, ``"sinusoidal"`` or ``"none"``.

    Returns:
        A :class:`~vecinterp.VectorTransformerConfig`; its own checks reject bad widths.

    Example:
        >>> from vecinterp.tasks.induction import model_config
        >>> cfg = model_config()
        >>> cfg.n_layers, cfg.attn_only, cfg.n_ctx, cfg.positional, cfg.d_in
        (2, True, 32, 'rotary', 16)
    """
    check_int("dim", dim, minimum=1)
    check_int("max_m", max_m, minimum=MIN_M, why=_WHY_MIN_M)
    return VectorTransformerConfig(
        d_in=dim,
        d_out=dim,
        d_model=d_model,
        d_head=d_head,
        n_heads=n_heads,
        n_layers=2,
        n_ctx=2 * max_m,
        attn_only=True,
        normalization=normalization,
        positional=positional,
    )


def train_preset(
    seed: int = 0,
    steps: int | None = None,
    *,
    device: str | torch.device = "cpu",
    progress: bool = False,
    **overrides: Any,
) -> TrainResult:
    """Train :func:`model_config`'s model with :data:`RECIPE` on fresh :func:`generate`
    batches: the model the docs and benchmarks analyse (about 2 minutes on a CPU).

    Args:
        seed: seeds the model's initial weights and :func:`vecinterp.train`'s data stream.
        steps: training steps (default ``RECIPE["steps"]``, 2,000); the warm-up keeps its
            share of them (``RECIPE["warmup_steps"] * steps // RECIPE["steps"]``).
        device: where to train.
        progress: show :func:`vecinterp.train`'s progress bar.
        **overrides: other keyword arguments of :func:`vecinterp.train` (e.g. ``lr``,
            ``eval_data``), replacing the recipe's.

    Returns:
        :func:`vecinterp.train`'s :class:`~vecinterp.training.TrainResult`; its ``model``
        is the trained one.

    Example:
        >>> from vecinterp.tasks import induction
        >>> result = induction.train_preset(seed=0, steps=3)
        >>> result.model.cfg.n_layers, len(result.history.train_loss)
        (2, 3)
    """
    recipe = dict(RECIPE)
    if steps is not None:
        warmup = RECIPE["warmup_steps"] * steps // RECIPE["steps"]
        recipe.update(steps=steps, warmup_steps=warmup)
    recipe.update(overrides)
    batch_size = recipe.pop("batch_size")
    model = HookedVectorTransformer(model_config(), seed=seed)
    return train(
        model,
        lambda step, gen: generate(batch_size, generator=gen),
        **recipe,
        seed=seed,
        device=device,
        progress=progress,
    )


_WHY_MIN_M = "with m = 1 induction is the same as copying the current vector"


def _check_common(
    batch_size: object, dim: object, min_m: object, max_m: object, dtype: object
) -> None:
    check_int("batch_size", batch_size, minimum=1)
    check_int("dim", dim, minimum=1)
    check_int("min_m", min_m, minimum=MIN_M, why=_WHY_MIN_M)
    assert isinstance(min_m, int)
    check_int("max_m", max_m, minimum=min_m, why=f"min_m is {min_m}")
    check_dtype(dtype)
