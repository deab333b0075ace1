"""Importing TransformerLens, an optional extra, only when a conversion or a run needs it.

Shared by :mod:`vecinterp.interop.transformer_lens` (conversion) and
:mod:`vecinterp.interop.tl_vectors` (running a TransformerLens model on vectors).
"""

import importlib.metadata
from typing import Any

INSTALL_HINT = 'pip install "vecinterp[transformer-lens]"'


def _transformer_lens() -> Any:
    """The ``transformer_lens`` module, or an ``ImportError`` saying how to install it."""
    try:
        import transformer_lens
    except ImportError as err:
        raise ImportError(
            "converting to or from TransformerLens needs the optional TransformerLens "
            f"3.x package: {INSTALL_HINT}"
        ) from err
    if not hasattr(transformer_lens, "HookedTransformer"):
        version = getattr(transformer_lens, "__version__", None) or _installed_version()
        raise ImportError(
            f"TransformerLens {version} has no HookedTransformer (removed in 4.0); "
            f"vecinterp converts to and from TransformerLens 3.x: {INSTALL_HINT}"
        )
    return transformer_lens


def _installed_version() -> str:
    try:
        return importlib.metadata.version("transformer-lens")
    except importlib.metadata.PackageNotFoundError:
        return "(unknown version)"


def _check_tl_model(tl: Any, tl_model: object) -> Any:
    """``tl_model``, or a ``TypeError`` if it is not a ``HookedTransformer`` of ``tl``."""
    if not isinstance(tl_model, tl.HookedTransformer):
        raise TypeError(
            f"expected a transformer_lens.HookedTransformer, got {type(tl_model).__name__}"
        )
    return tl_model
