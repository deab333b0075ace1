"""The retrieval problem: follow chains of pairs to the end, in context.

The minimal formulation of Mușat (2024), "Mechanism and Emergence of Stacked Attention Heads
in Multi-Layer Transformers", arXiv:2411.12118 (§6 data, §7 the two formulations, §7.1
training).
A sequence holds ``N`` chains ``x_0 -> x_1 -> ... -> x_D``, each written as its ``D`` pairs
``(x_i, x_{i+1})``, and then one query ``x_0`` per chain; at each query the model must
output the chain that starts there. No symbol has a fixed meaning: every symbol is a fresh
random vector in every sequence, so the only way to follow a chain is to match vectors.

Symbols
-------
Per sequence, each of the ``N (D + 1)`` symbols ``x_i`` of chain ``c`` gets its own vector
of ``K`` (``dim``) independent standard normal components (paper §6: ``N = K = 4``).
:attr:`RetrievalBatch.symbols` keeps them, ``[batch, n_chains, depth + 1, dim]``.

Layout
------
The pairs come step by step, perfectly interleaved: the ``N`` pairs ``(x_0, x_1)`` of all
chains, then the ``N`` pairs ``(x_1, x_2)``, and so on; within a step the order of the
chains is shuffled (per sequence and per step). Then come the ``N`` queries ``x_0``, in
shuffled order. Pair ``s`` of step ``i`` (``s = 0 .. N-1``) gets the *pair index*
``p = i N + s`` and fills positions ``2p`` (its left token ``x_i``) and ``2p + 1`` (its
right token ``x_{i+1}``); query slot ``q`` sits at position ``2 N D + q`` with pair index
``N D + q``. So a sequence has ``N (2D + 1)`` positions.

Each token is its symbol's vector followed by the ``K``-dimensional sin/cos code of its
pair index (the rotary frequencies of Su et al.; ``K`` must be even)::

    code(p)[2m] = sin(p w_m),  code(p)[2m + 1] = cos(p w_m),  w_m = base^(-2m / K)

Both tokens of a pair share their code, which is what ties ``x_i`` to ``x_{i+1}``; each
query has a code of its own. The model's input dimension is ``d_in = 2K`` and the model
uses no positional embedding of its own (``positional="none"``).

Worked layout: ``N = 2`` chains ``a`` (chain 0) and ``b`` (chain 1), ``D = 2``; step 0
drew the order ``b, a``, step 1 the order ``a, b`` and the queries the order ``b, a``::

    position    0    1    2    3    4    5    6    7    8    9
    symbol     b_0  b_1  a_0  a_1  a_1  a_2  b_1  b_2  b_0  a_0
    pair index  0    0    1    1    2    2    3    3    4    5
    role       L0   R0   L0   R0   L1   R1   L1   R1   Q    Q      (L_i: x_i, R_i: x_{i+1})
    loss_mask   F    F    F    F    F    F    F    F    T    T
    target                                                [b_1 b_2] [a_1 a_2]   (IC)

    left_pos  = [[2, 4], [0, 6]]    right_pos = left_pos + 1    (chains a, b; steps 0, 1)
    query_pos = [9, 8]              query_chain = [1, 0]        (query slots 0, 1 -> b, a)

Targets
-------
Outputs are read at the ``N`` query positions only (``loss_mask`` is True there and nowhere
else; ``targets`` is zero elsewhere). The query of chain ``c`` wants

- implicit curriculum (IC, the default): ``x_1 .. x_D`` of chain ``c`` concatenated,
  ``d_out = D K`` (block ``j - 1`` of size ``K`` is ``x_j``);
- non-IC: ``x_D`` only, ``d_out = K``.

A batch therefore trains with the masked MSE of :func:`vecinterp.train` unchanged. The
paper finds that IC learns and non-IC does not (every non-IC run ends with a loss above
0.7; predicting zero gives 1), and that in IC the *partial losses*
(:func:`partial_losses`, the MSE of block ``x_j``) fall in order ``x_1, x_2, ...``.
Theorem 1 of the paper: following a chain of ``D`` steps needs at least ``log_3(2D)``
layers (:func:`min_layers`).

Analysis structure
------------------
The positions of every chain vary per sequence, so the batch carries them:
:attr:`~RetrievalBatch.left_pos`, :attr:`~RetrievalBatch.right_pos` (``[batch, n_chains,
depth]``), :attr:`~RetrievalBatch.query_pos` (``[batch, n_chains]``) and
:attr:`~RetrievalBatch.role_positions` (all ``2D + 1`` roles of a chain in sequence order,
``L0 R0 L1 R1 ... Q``). E.g. the attention of head ``h`` from every query to the right
token of its chain's first pair is ``pattern[b, h, query_pos[b, c], right_pos[b, c, 0]]``.

Choices where the paper is silent
---------------------------------
- The code is the rotary pair ``(sin, cos)`` per frequency with base 10000 (``rotary_base``);
  the paper says only "a K-dimensional rotary positional encoding". Queries take the pair
  indices after the last pair's. With ``K = 4`` there are two frequencies, 1 and 0.01; the
  second barely moves over the ``N (D + 1) <= 28`` indices of the paper's settings, so
  codes nearly repeat every ``2 pi`` indices (``cos 6 = 0.96``): telling pair ``p`` from
  pair ``p - 6`` by the code takes large attention weights. A smaller ``rotary_base``
  spreads the codes (examples/retrieval_problem.py keeps 10000).
- The paper's §7 gives the IC target "DN dimensions"; it holds ``x_1 .. x_D`` of one chain,
  i.e. ``D K`` numbers (``N = K = 4`` there, so the two agree).
- Random numbers are drawn on the CPU in float64 from a ``torch.Generator`` in the fixed
  order symbols, pair orders, query order, then cast to ``dtype`` and moved to ``device``,
  so a seed gives the same data everywhere. Without ``seed`` or ``generator`` torch's
  global CPU generator is used.
- The paper trains on a fixed set of ``2^20`` sequences; :func:`batches` and
  ``generate(generator=...)`` draw fresh ones every step.

Model and training
------------------
:func:`model_config` builds the paper's model (§7.1: 8 heads, ``d_model`` 128, LayerNorm,
GPT-2 blocks, no positional embedding) with any number of layers, or a scaled-down one.
:data:`PAPER_RECIPE` is its recipe: Adam with decoupled weight decay (``vi.train`` uses
AdamW) at lr ``1e-3``, weight decay 0.1, batch 512, 10k steps.

The code is in two private modules, re-exported here: ``data`` (the batch, the code, the
generators) and ``model`` (the model preset, the recipe, the partial losses).
:mod:`vecinterp.tasks.retrieval_claims` measures the paper's claims on trained models.

Example::

    import vecinterp as vi
    from vecinterp.tasks import retrieval

    cfg = retrieval.model_config(depth=3, n_layers=4)
    model = vi.HookedVectorTransformer(cfg, seed=0)
    result = vi.train(model, lambda step, g: retrieval.generate(512, 3, generator=g),
                      steps=10_000, lr=1e-3, weight_decay=0.1)
    batch = retrieval.generate(256, 3, seed=1)
    retrieval.partial_losses(result.model(batch.inputs), batch)   # [3]: x_1, x_2, x_3
"""

from . import data as _data
from . import model as _model
from .data import RetrievalBatch, batches, generate, positional_code, role_names
from .model import min_layers, model_config, partial_losses

# The constants live in .data and .model; bound here again with their docstrings, which is
# where the API reference (autodata on this package) reads them.
DEFAULT_CHAINS = _data.DEFAULT_CHAINS
"""``N``, the number of chains per sequence in the paper (§6)."""
DEFAULT_DIM = _data.DEFAULT_DIM
"""``K``, the dimension of each symbol's vector (and of the positional code) in the paper."""
DEFAULT_ROTARY_BASE = _data.DEFAULT_ROTARY_BASE
"""The base of the positional code's frequencies (Su et al.'s)."""
PAPER_RECIPE = _model.PAPER_RECIPE
"""The paper's training recipe (§7.1): Adam with decoupled weight decay 0.1 (AdamW), lr
1e-3, batch 512, 10k steps, MSE, no dropout, a fixed set of ``2^20`` training sequences."""

__all__ = [
    "DEFAULT_CHAINS",
    "DEFAULT_DIM",
    "DEFAULT_ROTARY_BASE",
    "PAPER_RECIPE",
    "RetrievalBatch",
    "batches",
    "generate",
    "min_layers",
    "model_config",
    "partial_losses",
    "positional_code",
    "role_names",
]
