"""The cache layer: :class:`ActivationCache`, the activations of one run, and how
``run_with_cache`` builds it.

The package's layers, each importing only those below it (``tests/test_layering.py``
checks this): hooks -> model -> cache -> analysis -> training -> tasks. The cache sits
above the model: its modules read the model they are given (``TYPE_CHECKING`` imports
name its types), and the model layer never imports this package at import time.
:meth:`HookedVectorTransformer.run_with_cache <vecinterp.HookedVectorTransformer.run_with_cache>`
is the one way up, an import of :mod:`vecinterp.cache.recording` when it is called.

- :mod:`~vecinterp.cache.names`: short activation names and :func:`act_name`;
- :mod:`~vecinterp.cache.weights_record`: the model's weights as a run began (no copy);
- :mod:`~vecinterp.cache.activation_cache`: :class:`ActivationCache` and its
  decompositions of the residual stream;
- :mod:`~vecinterp.cache.recording`: the run that fills a cache.

The private names re-exported below are those other modules (``analysis.attribution``,
``benchmarks/cache_memory.py``) import from ``vecinterp.cache``.
"""

from .activation_cache import ActivationCache as ActivationCache
from .names import _ATTN as _ATTN
from .names import _BLOCK as _BLOCK
from .names import _MLP as _MLP
from .names import _PER_BLOCK as _PER_BLOCK
from .names import _TOP as _TOP
from .names import _norm_point as _norm_point
from .names import _resid_points as _resid_points
from .names import act_name as act_name
from .recording import _EXACT_ACT_FNS as _EXACT_ACT_FNS
from .recording import _exact_derivations as _exact_derivations
from .recording import _hooked_points as _hooked_points
from .recording import _own_storage as _own_storage
from .recording import _Recorder as _Recorder
from .weights_record import _LAST_RECORD as _LAST_RECORD
from .weights_record import _changed_weights as _changed_weights
from .weights_record import _record_weights as _record_weights
from .weights_record import _version as _version
from .weights_record import _walk_weights as _walk_weights
from .weights_record import _Weights as _Weights

__all__ = ["ActivationCache", "act_name"]
