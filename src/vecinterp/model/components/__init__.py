"""The components of a :class:`~vecinterp.HookedVectorTransformer`, one per file."""

from .attention import Attention, GroupedQueryAttention
from .block import TransformerBlock
from .embed import Embed
from .mlp import MLP, GatedMLP
from .norm import Norm
from .pos_embed import PosEmbed
from .rotary import Rotary
from .unembed import Unembed

__all__ = [
    "MLP",
    "Attention",
    "Embed",
    "GatedMLP",
    "GroupedQueryAttention",
    "Norm",
    "PosEmbed",
    "Rotary",
    "TransformerBlock",
    "Unembed",
]
