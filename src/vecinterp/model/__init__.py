"""The model layer: configuration, components, the transformer, weight processing, I/O.

The package's layers import downwards only (``tests/test_layering.py`` checks it):
hooks -> model -> cache -> analysis -> training -> tasks. The model layer uses the hooks,
:mod:`vecinterp.factored_matrix` and :mod:`vecinterp.loss`, and nothing above it; the cache
is built on it. The one way up is
:meth:`HookedVectorTransformer.run_with_cache <vecinterp.HookedVectorTransformer.run_with_cache>`,
which imports :mod:`vecinterp.cache.recording` when it is called (it returns an
:class:`~vecinterp.ActivationCache`).
"""

from .config import VectorTransformerConfig
from .transformer import CompiledHooksWarning, HookedVectorTransformer

__all__ = ["CompiledHooksWarning", "HookedVectorTransformer", "VectorTransformerConfig"]
