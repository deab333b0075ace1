"""Example tasks: seeded data generators that each fit in one self-contained module.

Every task module's docstring explains its data encoding in full, in the style of
minGPT's ``adder.py``.

- :mod:`vecinterp.tasks.affine_recurrence`: predict ``a_n = c a_{n-1} + d`` in context
  (Bhargav & Gu, 2024).
- :mod:`vecinterp.tasks.induction`: vector induction, a random sequence repeated (the
  induction-head story of Elhage et al., 2021, with vectors).
- :mod:`vecinterp.tasks.retrieval`: the retrieval problem of Musat (2024): follow chains
  of symbol pairs in context (implicit-curriculum and plain targets).
- :mod:`vecinterp.tasks.linear_regression`: in-context linear regression (Garg et al.,
  2022), with its baselines and a shipped reference model.
"""

from . import affine_recurrence as affine_recurrence
from . import induction as induction
from . import linear_regression as linear_regression
from . import retrieval as retrieval
