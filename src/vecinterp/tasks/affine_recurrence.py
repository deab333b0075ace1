"""Affine recurrences: predict the next vector of ``a_n = c a_{n-1} + d`` in context.

The task of Samarth Bhargav and Alexander Gu, "Interpreting Affine Recurrence Learning in
GPT-style Transformers", 2024, arXiv:2410.17438 (§3.1 data, §3.2 model and training). A
transformer reads real vectors, one per position, and at every position predicts the next
vector of a recurrence whose coefficients it never sees.

The recurrence
--------------
One sequence is fixed by three random draws, each uniform on [-2, 2]:

- ``a_0``: a vector of ``dim`` independent components (``dim = 40`` in the paper);
- ``d``: a vector of ``dim`` independent components;
- ``c``: ONE scalar, shared by all ``dim`` components (paper §3.1: the components are
  ``dim`` scalar affine recurrences running side by side "assuming they share the same
  linear term").

and then ``a_k = c a_{k-1} + d`` for ``k = 1 .. n``. ``c < 0`` gives an alternating
(oscillating) sequence, ``0 < c < 1`` a decay towards the fixed point ``d / (1 - c)``,
``c > 1`` exponential growth. :attr:`AffineBatch.alternating` flags the first kind; the
paper's layer-2 checkerboard attention patterns appear for exactly those sequences.

Normalisation
-------------
With ``|c|`` up to 2 a sequence can grow by a factor of ~1000 in ten steps, so each
sequence is rescaled before the model sees it (paper §3.1):

1. ``m = max_{k < n} ||a_k||_2``, the largest L2 norm among the model's INPUTS
   ``a_0 .. a_{n-1}``;
2. ``u ~ U(1, 2)``, one draw per sequence;
3. every vector ``a_0 .. a_n`` (the target ``a_n`` included) AND ``d`` are divided by
   ``scale = m / u``.

Dividing both sides of ``a_k = c a_{k-1} + d`` by ``scale`` shows that the normalised
vectors obey ``a'_k = c a'_{k-1} + d'`` with the same ``c`` and ``d' = d / scale``, and
the largest input norm becomes exactly ``u``, i.e. lies in [1, 2). The last target
``a'_n`` is not bounded by 2: ``|c| <= 2`` and ``||d'|| <= ||a'_1|| + |c| ||a'_0|| <= 3u``
bound its norm by ``2 u + 3 u <= 10``. ``normalise="all"`` (:data:`NORMALISATIONS`) takes
``m`` over every vector ``a_0 .. a_n`` instead, the target included, so that no vector is
longer than 2: §3.1's step 2 names the inputs, so this is the lower-prior reading, offered
to train and judge a model on data normalised its own way.

Encoding
--------
A batch has ONE length ``n`` (paper §3.2: "for each batch, the sequence length was randomly
chosen"), drawn uniformly from the integers ``min_len .. max_len`` (3 .. 14 in the paper,
both ends included), so no padding is ever needed::

    inputs   a_0  a_1  a_2  a_3 ... a_{n-1}     [batch, n, dim]  (float, d_in = dim)
    targets  a_1  a_2  a_3  a_4 ... a_n         [batch, n, dim]  (float, d_out = dim)
    mask      F    F    T    T  ...  T          [batch, n]       (bool)

Output position ``t`` predicts ``a_{t+1}``. The loss is the MSE over the positions where
``loss_mask`` is True, i.e. on the predictions of ``a_3`` onwards: ``c`` and ``d`` are
determined by ``a_0, a_1, a_2`` (two equations ``a_1 = c a_0 + d``, ``a_2 = c a_1 + d``),
so ``a_3`` is the first vector that can be predicted; ``a_1`` and ``a_2`` cannot. Hence
lengths below 3 are refused: they would have nothing to score. A typical loss::

    err = (model(batch.inputs) - batch.targets).pow(2).mean(-1)   # [batch, pos]
    loss = err[batch.loss_mask].mean()

Worked example (``dim = 1``, ``n = 3``): ``a_0 = 1, c = 2, d = 1`` gives ``1, 3, 7, 15``.
The inputs are ``1, 3, 7`` so ``m = 7``; with ``u = 1.4``, ``scale = 5`` and::

    inputs  = [0.2, 0.6, 1.4]     targets = [0.6, 1.4, 3.0]     mask = [F, F, T]
    c = 2, d' = 0.2               (0.6 = 2 * 0.2 + 0.2, ..., 3.0 = 2 * 1.4 + 0.2)

The batch also carries ``c``, the normalised ``d'`` and ``scale``, so the raw recurrence is
recoverable (``a_k = scale * a'_k``) and analyses can sort sequences by ``c``.

Choices where the paper is silent
---------------------------------
- "norm" is read as the L2 norm of a whole vector, and "uniformly random numbers from
  [-2, 2]" as independent continuous uniforms per component.
- ``u`` is drawn per sequence (``m`` is per sequence too); ``torch.rand`` draws from the
  half-open [0, 1), so ``u`` is in [1, 2).
- Everything is computed in float64 and cast to ``dtype`` at the end, so the recurrence
  holds to the rounding of ``dtype`` (~1e-7 relative in float32, ~1e-16 in float64).
- ``m`` is clamped below by float64's smallest normal number. ``m = 0`` needs
  ``a_0 = d = 0`` exactly, an event of probability zero; the clamp only keeps the code
  free of a division by zero.
- Random numbers are drawn on the CPU with a ``torch.Generator`` and then moved to
  ``device``, so a seed gives the same data on every device. The draws come in a fixed
  order, ``a_0, d, c, u`` and then (if ``length`` is None) ``n``. The parameters never
  depend on the length, so for one seed, calls that differ only in ``length`` share the
  same recurrences (useful for studying generalisation across lengths); only the
  normalisation differs, since ``m`` looks at the first ``n`` inputs.
- ``length`` may lie outside ``[min_len, max_len]`` (e.g. to test on longer sequences than
  in training); the model's ``n_ctx = 32`` is its only upper limit, which this module does
  not know about.
- Without ``seed`` or ``generator``, :func:`generate` draws from torch's global CPU
  generator, so ``torch.manual_seed`` makes it reproducible.

Model and training
------------------
:data:`MODEL_CONFIG_KWARGS` is the paper's model (§3.2):
``vi.VectorTransformerConfig(**MODEL_CONFIG_KWARGS)`` builds its config. It is a plain
dict so that this module does not depend on the model code. :data:`PAPER_RECIPE` is the
paper's training recipe. Trained that way, the paper reports an MSE of 1e-4.

Reference models
----------------
Trained models ship inside the package (package data, about 13 MB each), so that an
installed vecinterp can analyse one without training: :data:`REFERENCE_MODELS` names them,
:func:`load_reference` loads one and :func:`reference_path` gives its folder. Each folder,
``vecinterp/tasks/reference/affine_recurrence_<name>/``, is what :func:`vecinterp.save`
wrote (``config.json`` with the training metadata, ``model.safetensors``) plus the
training history and a README with the command that trained it.

Example:

    >>> from vecinterp.tasks import affine_recurrence as ar
    >>> train = ar.batches(ar.PAPER_RECIPE["batch_size"], seed=0)
    >>> evals = ar.fixed_eval_set(24, 64, seed=1)   # every length 3..14 twice
    >>> sorted({b.length for b in evals}) == list(range(3, 15))
    True
    >>> batch = next(train)                         # an AffineBatch
    >>> batch.inputs.shape[0], batch.inputs.shape[2], 3 <= batch.length <= 14  # [16, n, 40]
    (16, 40, True)

One file although it is long: most of it is this docstring, the task's specification,
which belongs beside the code that implements it.
"""

import dataclasses
from collections.abc import Iterator
from typing import Any

import torch
from jaxtyping import Bool, Float

from . import _affine_reference
from ._common import check_device, check_dtype, check_int, resolve_generator, seeded_generator

DEFAULT_DIM = 40
"""Vector dimension in the paper (its ``d_vocab = dim(a_n) = 40``)."""
DEFAULT_MIN_LEN = 3
"""Shortest sequence in the paper, and the shortest with a scored position."""
DEFAULT_MAX_LEN = 14
"""Longest sequence in the paper."""
COEFF_BOUND = 2.0
"""``a_0``, ``d`` and ``c`` are drawn uniformly from ``[-COEFF_BOUND, COEFF_BOUND]``."""
FIRST_SCORED_POS = 2
"""Output position of the prediction of ``a_3``, the first one that is scored."""

MODEL_CONFIG_KWARGS = dict(
    d_in=40,
    d_out=40,
    d_model=128,
    d_head=64,
    n_heads=8,
    n_layers=3,
    d_mlp=3072,
    n_ctx=32,
    act_fn="relu",
    normalization="LN",
    positional="learned",
)
"""The paper's model (§3.2); ``vi.VectorTransformerConfig(**MODEL_CONFIG_KWARGS)``."""

PAPER_RECIPE = dict(
    steps=100_000,
    batch_size=16,
    lr=1e-4,
    weight_decay=0.01,
    optimizer="AdamW",
)
"""The paper's training recipe (§3.2), AdamW with MSE on the masked positions and fresh
batches."""

FAST_RECIPE = dict(
    steps=12_000,
    batch_size=64,
    lr=1e-3,
    weight_decay=0.01,
    optimizer="AdamW",
    warmup_steps=500,
    schedule="cosine",
    min_lr=1e-5,
    grad_clip=1.0,
)
"""A faster recipe for the same model, the one of the shipped checkpoint
(``benchmarks/train_affine.py`` measures it against :data:`PAPER_RECIPE`): 4x larger
batches (which cost less per sequence on a CPU), a 10x higher peak learning rate reached by
a linear warm-up, then a cosine decay to 1 % of the peak, and gradient clipping at total
norm 1; 0.48x the paper's sequences in 0.12x its updates."""


@dataclasses.dataclass(frozen=True, eq=False)
class AffineBatch:
    """One batch of normalised affine recurrences, all of the same length ``n``.

    Attributes:
        inputs: ``a'_0 .. a'_{n-1}``, ``[batch, pos, d_in]``.
        targets: ``a'_1 .. a'_n``, ``[batch, pos, d_out]``; ``targets[:, t]`` is the
            prediction wanted at position ``t``, and ``targets[:, t] = inputs[:, t + 1]``.
        loss_mask: ``[batch, pos]``, False at positions 0 and 1 and True from 2 on.
        c: ``[batch]``, the linear coefficient (normalisation leaves it unchanged).
        d: ``[batch, d_in]``, the normalised offset ``d' = d / scale``, so that
            ``targets[:, t] = c[:, None] * inputs[:, t] + d``.
        scale: ``[batch]``, the divisor ``m / u``; ``scale * inputs`` is the raw sequence.

    ``eq=False``: comparing batches field by field would compare tensors, which has no
    single truth value; compare the fields with ``torch.equal`` instead.

    Example:
        >>> import torch
        >>> from vecinterp.tasks.affine_recurrence import generate
        >>> batch = generate(4, dim=3, length=5, seed=0)
        >>> batch.inputs.shape, batch.c.shape, batch.d.shape
        (torch.Size([4, 5, 3]), torch.Size([4]), torch.Size([4, 3]))
        >>> batch.loss_mask[0]
        tensor([False, False,  True,  True,  True])
        >>> torch.equal(batch.targets[:, :-1], batch.inputs[:, 1:])
        True
        >>> expected = batch.c[:, None, None] * batch.inputs + batch.d[:, None, :]
        >>> bool(torch.allclose(batch.targets, expected, atol=1e-5))
        True
    """

    inputs: Float[torch.Tensor, "batch pos d_in"]
    targets: Float[torch.Tensor, "batch pos d_out"]
    loss_mask: Bool[torch.Tensor, "batch pos"]
    c: Float[torch.Tensor, " batch"]
    d: Float[torch.Tensor, "batch d_in"]
    scale: Float[torch.Tensor, " batch"]

    @property
    def alternating(self) -> Bool[torch.Tensor, " batch"]:
        """True for sequences with ``c < 0``, whose components alternate in sign."""
        return self.c < 0

    @property
    def length(self) -> int:
        """The sequence length ``n`` (number of positions)."""
        return self.inputs.shape[1]


NORMALISATIONS = ("inputs", "all")
"""The readings of §3.1's normalisation that :func:`generate` offers (``normalise=``):
the scale is set by the inputs' largest norm (the paper's step 2) or by every vector's."""


def generate(
    batch_size: int,
    *,
    dim: int = DEFAULT_DIM,
    length: int | None = None,
    min_len: int = DEFAULT_MIN_LEN,
    max_len: int = DEFAULT_MAX_LEN,
    generator: torch.Generator | None = None,
    seed: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    normalise: str = "inputs",
) -> AffineBatch:
    """Draw one batch of ``batch_size`` normalised affine recurrences of one length.

    Args:
        batch_size: number of sequences (>= 1).
        dim: dimension of each vector (>= 1).
        length: the number of positions ``n`` (>= 3); None draws it uniformly from the
            integers ``min_len .. max_len``, both included.
        min_len, max_len: the range of the drawn length; ``3 <= min_len <= max_len``.
        generator: a CPU ``torch.Generator`` to draw from (its state advances).
        seed: seed of a fresh generator; give at most one of ``seed`` and ``generator``.
            With neither, torch's global CPU generator is used.
        dtype: floating dtype of the returned tensors (computed in float64, then cast).
        device: where the returned tensors live (drawn on the CPU, then moved).
        normalise: which vectors set the scale ``m`` (:data:`NORMALISATIONS`):
            ``"inputs"`` (the default, the paper's step 2: the largest norm among the
            inputs ``a_0 .. a_{n-1}``) or ``"all"`` (among every vector of the sequence,
            the target ``a_n`` included, so that no vector is longer than 2: a
            lower-prior reading of §3.1). The draws are the same for both.

    Returns:
        An :class:`AffineBatch` with ``inputs``/``targets`` ``[batch_size, n, dim]``.

    Raises:
        ValueError: for an argument outside its allowed values.

    Example:
        >>> from vecinterp.tasks.affine_recurrence import generate
        >>> b = generate(8, dim=4, length=5, seed=0)
        >>> b.inputs.shape, b.loss_mask[0].tolist()
        (torch.Size([8, 5, 4]), [False, False, True, True, True])
    """
    _check_common(batch_size, dim, min_len, max_len, dtype, normalise)
    if length is not None:
        check_int("length", length, minimum=DEFAULT_MIN_LEN, why=_WHY_MIN_LEN)
    generator = resolve_generator(generator, seed)
    device = check_device(device)

    a_0 = _uniform((batch_size, dim), -COEFF_BOUND, COEFF_BOUND, generator)
    d = _uniform((batch_size, dim), -COEFF_BOUND, COEFF_BOUND, generator)
    c = _uniform((batch_size,), -COEFF_BOUND, COEFF_BOUND, generator)
    u = _uniform((batch_size,), 1.0, 2.0, generator)
    if length is None:
        length = int(torch.randint(min_len, max_len + 1, (1,), generator=generator).item())

    terms = [a_0]
    for _ in range(length):
        terms.append(c[:, None] * terms[-1] + d)
    raw_inputs = torch.stack(terms[:-1], dim=1)
    raw_targets = torch.stack(terms[1:], dim=1)

    every = raw_inputs if normalise == "inputs" else torch.stack(terms, dim=1)
    max_norm = every.norm(dim=-1).amax(dim=1).clamp_min(torch.finfo(torch.float64).tiny)
    scale = max_norm / u
    inputs = raw_inputs / scale[:, None, None]
    targets = raw_targets / scale[:, None, None]
    d = d / scale[:, None]

    loss_mask = (torch.arange(length) >= FIRST_SCORED_POS).repeat(batch_size, 1)

    return AffineBatch(
        inputs=inputs.to(device=device, dtype=dtype),
        targets=targets.to(device=device, dtype=dtype),
        loss_mask=loss_mask.to(device),
        c=c.to(device=device, dtype=dtype),
        d=d.to(device=device, dtype=dtype),
        scale=scale.to(device=device, dtype=dtype),
    )


def batches(
    batch_size: int,
    *,
    seed: int,
    dim: int = DEFAULT_DIM,
    length: int | None = None,
    min_len: int = DEFAULT_MIN_LEN,
    max_len: int = DEFAULT_MAX_LEN,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    normalise: str = "inputs",
) -> Iterator[AffineBatch]:
    """An endless stream of fresh batches for a training loop, reproducible from ``seed``.

    Each batch draws its own length (unless ``length`` is given), as in the paper. The
    stream uses one private generator seeded with ``seed``, so the first batch equals
    ``generate(batch_size, seed=seed, ...)`` and two streams with the same arguments are
    identical. The arguments are checked now, not at the first ``next``.

    Example:
        >>> import torch
        >>> from vecinterp.tasks.affine_recurrence import batches, generate
        >>> stream = batches(16, dim=3, seed=0)
        >>> first = next(stream)
        >>> torch.equal(first.inputs, generate(16, dim=3, seed=0).inputs)
        True
        >>> lengths = [next(stream).length for _ in range(200)]  # one length per batch
        >>> min(lengths), max(lengths)
        (3, 14)

        In a training loop: ``for step, batch in zip(range(steps), batches(16, seed=0))``.
    """
    _check_common(batch_size, dim, min_len, max_len, dtype, normalise)
    if length is not None:
        check_int("length", length, minimum=DEFAULT_MIN_LEN, why=_WHY_MIN_LEN)
    generator = seeded_generator(seed)
    device = check_device(device)

    return _stream(
        generator,
        batch_size=batch_size,
        dim=dim,
        length=length,
        min_len=min_len,
        max_len=max_len,
        dtype=dtype,
        device=device,
        normalise=normalise,
    )


def _stream(generator: torch.Generator, **kwargs: Any) -> Iterator[AffineBatch]:
    # A separate generator function, so that batches() checks its arguments when called.
    while True:
        yield generate(generator=generator, **kwargs)


def fixed_eval_set(
    n_batches: int,
    batch_size: int,
    seed: int,
    *,
    dim: int = DEFAULT_DIM,
    min_len: int = DEFAULT_MIN_LEN,
    max_len: int = DEFAULT_MAX_LEN,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
    normalise: str = "inputs",
) -> list[AffineBatch]:
    """A fixed evaluation set: ``n_batches`` batches whose lengths cycle through the range.

    Batch ``i`` has length ``min_len + i % (max_len - min_len + 1)``: the lengths are not
    drawn but assigned in turn, so every length is covered as evenly as ``n_batches``
    allows (exactly evenly when ``n_batches`` is a multiple of the number of lengths,
    e.g. 12, 24, ... for 3 .. 14). The batches come from one generator seeded with
    ``seed``; use a seed that the training stream does not use.

    Mean the per-batch losses to weight every length equally; pooling all scored positions
    instead weights long sequences more (a length-``n`` batch scores ``n - 2`` positions).

    Example:
        >>> from vecinterp.tasks.affine_recurrence import fixed_eval_set
        >>> evals = fixed_eval_set(12, 32, seed=1234, dim=4)
        >>> [b.length for b in evals]
        [3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14]
    """
    check_int("n_batches", n_batches, minimum=1)
    _check_common(batch_size, dim, min_len, max_len, dtype, normalise)
    generator = seeded_generator(seed)
    device = check_device(device)
    n_lengths = max_len - min_len + 1
    return [
        generate(
            batch_size,
            dim=dim,
            length=min_len + i % n_lengths,
            generator=generator,
            dtype=dtype,
            device=device,
            normalise=normalise,
        )
        for i in range(n_batches)
    ]


# ---------------------------------------------------------------------- reference models
# Defined in ._affine_reference (finding the package data, loading); documented here.

REFERENCE_MODELS: dict[str, str] = _affine_reference.REFERENCE_MODELS
"""The reference models shipped with vecinterp: name -> one-line description.

Adding one: train it (``python examples/train_affine.py --recipe <recipe> --seed <seed>``
writes ``checkpoints/affine_<recipe>_seed<seed>``), copy that folder's
``config.json``, ``model.safetensors`` and ``history.json`` (with a README saying how it was
trained) to ``src/vecinterp/tasks/reference/affine_recurrence_<name>/`` and add
``<name>`` to ``vecinterp/tasks/_affine_reference.py``; the wheel picks up every file of
the folder."""

reference_path = _affine_reference.reference_path
load_reference = _affine_reference.load_reference


_WHY_MIN_LEN = "the loss starts at the prediction of a_3, output position 2"


def _check_common(
    batch_size: int, dim: int, min_len: int, max_len: int, dtype: torch.dtype, normalise: str
) -> None:
    if normalise not in NORMALISATIONS:
        raise ValueError(f"normalise must be one of {NORMALISATIONS}, got {normalise!r}")
    check_int("batch_size", batch_size, minimum=1)
    check_int("dim", dim, minimum=1)
    check_int("min_len", min_len, minimum=DEFAULT_MIN_LEN, why=_WHY_MIN_LEN)
    check_int("max_len", max_len, minimum=min_len, why=f"min_len is {min_len}")
    check_dtype(dtype)


def _uniform(
    shape: tuple[int, ...], low: float, high: float, generator: torch.Generator | None
) -> torch.Tensor:
    unit = torch.rand(shape, generator=generator, dtype=torch.float64)
    return low + (high - low) * unit
