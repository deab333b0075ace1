"""The components of a :class:`~vecinterp.HookedVectorTransformer`, one per file."""

from .attention import Attention
from .block import TransformerBlock
from .embed import Embed
from .mlp import MLP
from .norm import Norm
from .pos_embed import PosEmbed
from .rotary import Rotary
from .unembed import Unembed

__all__ = ["MLP", "Attention", "Embed", "Norm", "PosEmbed", "Rotary", "TransformerBlock", "Unembed"]
