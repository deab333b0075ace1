"""The one configuration object of a :class:`~vecinterp.HookedVectorTransformer`."""

import dataclasses
import difflib
import functools
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

ACT_FNS = ("relu", "gelu", "gelu_tanh", "silu")
NORMALIZATIONS = ("LN", "LNPre", "RMS", "RMSPre", None)
POSITIONALS = ("learned", "sinusoidal", "rotary", "none")
INITS = ("gpt2", "transformer_lens")
# the largest init_range: its draws (|z| < 40 in any realistic number of them) fit float16
_MAX_INIT_RANGE = 1000.0

# TransformerLens's HookedTransformerConfig names users type, and what they are here
_TL_NAMES = {
    "d_vocab": "d_in (the size of each input vector; d_out defaults to it)",
    "d_vocab_out": "d_out (the size of each output vector)",
    "normalization_type": "normalization",
    "positional_embedding_type": "positional ('learned' is TransformerLens's 'standard')",
    "attention_dir": "causal (True for 'causal', False for 'bidirectional')",
    "initializer_range": "init_range",
    "rotary_dim": "nothing: rotary embeddings here rotate all of d_head",
}


def _unknown_fields_hint(unknown: list[str], known: set[str]) -> str:
    """What each unknown field is called here: TransformerLens's names mapped, the rest
    matched against the known fields."""
    hints = []
    for name in unknown:
        if name in _TL_NAMES:
            hints.append(f"{name!r} is TransformerLens's name; here use {_TL_NAMES[name]}")
        else:
            close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
            if close:
                hints.append(f"{name!r}: did you mean {' or '.join(map(repr, close))}?")
    return "; ".join(hints)


def _require_positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"VectorTransformerConfig.{name} must be a positive int, got {value!r}")


@dataclass(frozen=True)
class VectorTransformerConfig:
    """Hyper-parameters of a vector-input, vector-output transformer.

    The model reads ``x: [batch, pos, d_in]`` and writes ``y: [batch, pos, d_out]``.
    Invalid values raise a :class:`ValueError` naming the field and what is allowed.

    Args:
        d_in: size of each input vector.
        d_out: size of each output vector; defaults to ``d_in``.
        d_model: width of the residual stream.
        d_head: width of each attention head.
        n_heads: heads per layer.
        n_layers: number of transformer blocks.
        d_mlp: hidden width of each MLP; defaults to ``4 * d_model``. Ignored when
            ``attn_only``.
        n_ctx: largest number of positions the model accepts.
        act_fn: MLP nonlinearity: ``"relu"``, ``"gelu"`` (exact, erf), ``"gelu_tanh"``
            (GPT-2's tanh approximation) or ``"silu"``.
        normalization: ``"LN"`` (LayerNorm with weight and bias), ``"LNPre"`` (LayerNorm
            without them, what folding produces), ``"RMS"``, ``"RMSPre"`` or ``None``.
        positional: ``"learned"`` (a trained ``W_pos``), ``"sinusoidal"`` (a fixed
            ``W_pos``), ``"rotary"`` (queries and keys rotated, no ``W_pos``) or
            ``"none"``.
        attn_only: blocks without MLPs.
        causal: mask attention to earlier and equal positions only.
        embed_bias: give the linear embedding a bias ``b_E``.
        eps: the epsilon of the normalization layers.
        rotary_base: the base of the rotary frequencies.
        init: how :meth:`~vecinterp.HookedVectorTransformer.init_weights` draws the weight
            matrices. ``"gpt2"`` (the default): every ``W_*`` ~ N(0, init_range²), with
            ``W_O`` and ``W_out`` shrunk further by ``1/sqrt(2 n_layers)`` as in GPT-2.
            ``"transformer_lens"``: TransformerLens's default (``init_mode="gpt2"`` of
            ``HookedTransformer``), every ``W_*`` ~ N(0, init_range²) with no shrinking,
            where init_range defaults to TransformerLens's ``0.8 / sqrt(d_model)``. A model
            trained with TransformerLens (or a fork of it) started from the second. Biases
            start at 0 and normalization weights at 1 either way.
        init_range: standard deviation of the normal initialisation of weight matrices;
            ``None`` (the default) sets the default of ``init``: 0.02 for ``"gpt2"``,
            ``0.8 / sqrt(d_model)`` for ``"transformer_lens"``. The config stores the
            number (so a config saved before ``init`` existed, with 0.02, equals today's
            default), and :meth:`replace` that changes ``init`` (or ``d_model`` under
            ``"transformer_lens"``) without naming ``init_range`` moves a default range to
            the new default.
        gated_mlp: a gated MLP (Llama's): ``post = act(x W_gate + b_gate) * (x W_in +
            b_in)``, ``out = post W_out + b_out``, with the extra hook ``hook_pre_linear``
            (``x W_in + b_in``); ``hook_pre`` is the gate's pre-activation. Ignored when
            ``attn_only``.
        n_key_value_heads: grouped-query attention: keys and values are computed for this
            many heads, and query head ``h`` reads key/value head ``h // (n_heads //
            n_key_value_heads)`` (Llama's ``repeat_kv``). Must divide ``n_heads``;
            ``None`` (the default) means ``n_heads``, ordinary multi-head attention, and
            the config stores ``n_heads`` (so a config saved before the field existed
            equals one naming ``n_key_value_heads=n_heads``); :meth:`replace` that
            changes ``n_heads`` without naming it keeps ordinary attention. With fewer
            key/value heads than query heads the keys and values are stored as ``_W_K``,
            ``_W_V`` ``[n_key_value_heads, d_model, d_head]`` and ``_b_K``, ``_b_V``
            (TransformerLens's ``GroupedQueryAttention``), and ``W_K`` etc. read them
            expanded per query head.

    Example:
        >>> import vecinterp as vi
        >>> cfg = vi.VectorTransformerConfig(d_in=4, d_model=16, d_head=4, n_heads=2,
        ...                                  n_layers=1, n_ctx=8)
        >>> cfg.d_out, cfg.d_mlp
        (4, 64)
    """

    d_in: int
    d_model: int
    d_head: int
    n_heads: int
    n_layers: int
    n_ctx: int
    d_out: int | None = None
    d_mlp: int | None = None
    act_fn: str = "relu"
    normalization: str | None = "LN"
    positional: str = "learned"
    attn_only: bool = False
    causal: bool = True
    embed_bias: bool = False
    eps: float = 1e-5
    rotary_base: float = 10000.0
    init: str = "gpt2"
    init_range: float | None = None
    gated_mlp: bool = False
    n_key_value_heads: int | None = None

    def __post_init__(self) -> None:
        for name in ("d_in", "d_model", "d_head", "n_heads", "n_layers", "n_ctx"):
            _require_positive_int(name, getattr(self, name))
        if self.n_key_value_heads is None:
            object.__setattr__(self, "n_key_value_heads", self.n_heads)
        _require_positive_int("n_key_value_heads", self.n_key_value_heads)
        if self.n_heads % self.n_kv_heads != 0:
            raise ValueError(
                f"VectorTransformerConfig.n_key_value_heads must divide n_heads "
                f"({self.n_heads}): each key/value head serves a group of n_heads // "
                f"n_key_value_heads query heads; got {self.n_key_value_heads}"
            )
        if self.d_out is None:
            object.__setattr__(self, "d_out", self.d_in)
        _require_positive_int("d_out", self.d_out)
        if self.d_mlp is None:
            object.__setattr__(self, "d_mlp", 4 * self.d_model)
        _require_positive_int("d_mlp", self.d_mlp)
        if self.act_fn not in ACT_FNS:
            raise ValueError(
                f"VectorTransformerConfig.act_fn must be one of {ACT_FNS}, got {self.act_fn!r}"
            )
        if self.normalization not in NORMALIZATIONS:
            raise ValueError(
                "VectorTransformerConfig.normalization must be one of "
                f"{NORMALIZATIONS}, got {self.normalization!r}"
            )
        if self.positional not in POSITIONALS:
            raise ValueError(
                "VectorTransformerConfig.positional must be one of "
                f"{POSITIONALS}, got {self.positional!r}"
            )
        if self.positional == "rotary" and self.d_head % 2 != 0:
            raise ValueError(
                f"VectorTransformerConfig.d_head must be even with positional='rotary', "
                f"got {self.d_head}"
            )
        if self.positional == "sinusoidal" and self.d_model % 2 != 0:
            raise ValueError(
                f"VectorTransformerConfig.d_model must be even with positional='sinusoidal', "
                f"got {self.d_model}"
            )
        if self.init not in INITS:
            raise ValueError(
                f"VectorTransformerConfig.init must be one of {INITS}, got {self.init!r}"
            )
        if self.init_range is None:
            object.__setattr__(self, "init_range", self.default_init_range())
        for name in ("attn_only", "causal", "embed_bias", "gated_mlp"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(
                    f"VectorTransformerConfig.{name} must be a bool, got {getattr(self, name)!r}"
                )
        # every float field: a non-finite value would poison every output (eps=inf makes
        # each normalization output 0, init_range=inf gives NaN, rotary_base=inf freezes
        # all but one frequency)
        for field in dataclasses.fields(self):
            if field.type not in (float, "float", float | None, "float | None"):
                continue
            value = getattr(self, field.name)  # init_range: a number by now
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(
                    f"VectorTransformerConfig.{field.name} must be a positive number, got {value!r}"
                )
            if not math.isfinite(value):
                raise ValueError(
                    f"VectorTransformerConfig.{field.name} must be a positive number, got "
                    f"{value!r}, which is not finite"
                )
        if self.init_std > _MAX_INIT_RANGE:
            raise ValueError(
                f"VectorTransformerConfig.init_range must be at most {_MAX_INIT_RANGE:g}, got "
                f"{self.init_range!r}: it is the standard deviation of the initial weight "
                "matrices (0.02 by default), and draws at that scale overflow the weights' "
                "dtype to inf (float16 holds up to 65504, float32 3.4e38) or make the "
                "activations do so"
            )

    def __getattr__(self, name: str) -> Any:
        # only reached for a name that is not a field: say what TransformerLens's
        # HookedTransformerConfig attributes are called here
        if name in _TL_NAMES:
            raise AttributeError(
                f"VectorTransformerConfig has no attribute {name!r}: that is "
                f"TransformerLens's name; here use {_TL_NAMES[name]}"
            )
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def default_init_range(self) -> float:
        """The default ``init_range`` of this config's ``init``: 0.02 for ``"gpt2"``,
        TransformerLens's ``0.8 / sqrt(d_model)`` for ``"transformer_lens"``.

        Example:
            >>> import vecinterp as vi
            >>> cfg = vi.VectorTransformerConfig(d_in=4, d_model=64, d_head=8, n_heads=8,
            ...                                  n_layers=2, n_ctx=8, init="transformer_lens")
            >>> cfg.init_range, cfg.default_init_range()   # 0.8 / sqrt(64)
            (0.1, 0.1)
            >>> cfg.replace(init="gpt2").init_range          # a default range follows init
            0.02
        """
        if self.init == "transformer_lens":
            return 0.8 / math.sqrt(self.d_model)
        return 0.02

    @property
    def init_std(self) -> float:
        """The standard deviation of the initial weight matrices (``init_range``); ``W_O``
        and ``W_out`` start smaller by ``1/sqrt(2 n_layers)`` under ``init="gpt2"``."""
        assert self.init_range is not None  # set in __post_init__
        return float(self.init_range)

    @property
    def n_kv_heads(self) -> int:
        """The number of key/value heads (``n_key_value_heads``, a number by now)."""
        assert self.n_key_value_heads is not None  # set in __post_init__
        return int(self.n_key_value_heads)

    @property
    def is_gqa(self) -> bool:
        """Whether keys and values are shared by groups of query heads
        (``n_key_value_heads < n_heads``)."""
        return self.n_kv_heads < self.n_heads

    @property
    def has_ln_weights(self) -> bool:
        """Whether the normalization layers carry a weight ``w`` (LN and RMS)."""
        return self.normalization in ("LN", "RMS")

    @property
    def is_mean_removing(self) -> bool:
        """Whether every normalization removes the mean of its input (LN and LNPre)."""
        return self.normalization in ("LN", "LNPre")

    def replace(self, **changes: Any) -> "VectorTransformerConfig":
        """A copy with some fields changed (validated again). If ``init_range`` is the
        default of this config's ``init`` and the change does not name it, the copy gets
        the default of its own ``init`` and ``d_model``; likewise an ordinary-attention
        config (``n_key_value_heads == n_heads``) stays one when ``n_heads`` changes."""
        if "init_range" not in changes and self.init_range == self.default_init_range():
            changes["init_range"] = None
        if "n_key_value_heads" not in changes and not self.is_gqa:
            changes["n_key_value_heads"] = None
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """The fields as a JSON-serialisable dict."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "VectorTransformerConfig":
        """Build a config from :meth:`to_dict`'s output; unknown or missing required keys
        raise ``ValueError``, anything but a mapping ``TypeError``.

        Example:
            >>> import vecinterp as vi
            >>> cfg = vi.VectorTransformerConfig(d_in=4, d_model=16, d_head=4, n_heads=2,
            ...                                  n_layers=1, n_ctx=8)
            >>> vi.VectorTransformerConfig.from_dict(cfg.to_dict()) == cfg
            True
        """
        if not isinstance(data, Mapping):
            raise TypeError(
                "VectorTransformerConfig.from_dict needs a dict of fields (what to_dict "
                f"returns; from JSON: from_dict(json.loads(text))), got {type(data).__name__}"
            )
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            hint = _unknown_fields_hint(unknown, known)
            raise ValueError(
                f"unknown VectorTransformerConfig fields {unknown}"
                + (f" ({hint})" if hint else "")
                + f"; known: {sorted(known)}"
            )
        required = {
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        }
        missing = sorted(required - set(data))
        if missing:
            raise ValueError(f"VectorTransformerConfig fields missing: {missing}")
        return cls(**data)

    def to_json(self) -> str:
        """The config as a JSON string."""
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)


def same_config(record: object, cfg: VectorTransformerConfig) -> bool:
    """Whether a recorded config (a dict as :meth:`VectorTransformerConfig.to_dict` wrote
    it, in a save or a training checkpoint) is ``cfg``. Compared as configs, not dicts, so
    that a record written before a field existed, or with a default left as ``None``, is the
    config it describes; anything unreadable is not."""
    if not isinstance(record, dict):
        return False
    try:
        return VectorTransformerConfig.from_dict(record) == cfg
    except (TypeError, ValueError):
        return False


def _init_with_hints(init: Any) -> Any:
    """Wrap the dataclass ``__init__`` so that an unknown keyword (often a TransformerLens
    name such as ``d_vocab``) is refused with what to use instead."""

    @functools.wraps(init)
    def __init__(self: VectorTransformerConfig, *args: Any, **kwargs: Any) -> None:
        known = {f.name for f in dataclasses.fields(VectorTransformerConfig)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            hint = _unknown_fields_hint(unknown, known)
            raise TypeError(
                f"VectorTransformerConfig got unexpected field(s) {unknown}"
                + (f": {hint}" if hint else "")
                + f"; the fields are {sorted(known)}"
            )
        init(self, *args, **kwargs)

    return __init__


# after the class is built, so that the dataclass's signature stays what tools show
setattr(  # noqa: B010 (an assignment to __init__ would upset the type checker)
    VectorTransformerConfig,
    "__init__",
    _init_with_hints(VectorTransformerConfig.__init__),
)
