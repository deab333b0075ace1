"""The model layer: configuration, components, the transformer, weight processing, I/O."""

from .config import VectorTransformerConfig
from .transformer import HookedVectorTransformer

__all__ = ["HookedVectorTransformer", "VectorTransformerConfig"]
