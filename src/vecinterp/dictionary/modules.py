"""Sparse dictionaries: a sparse autoencoder (SAE) and a transcoder, as hooked modules.

Both rewrite an activation as a sparse sum of learned directions, the **rows** of
``W_dec [d_sae, d_out]`` (unit norm), with the library's row-vector convention
(``acts @ W_dec``) and SAELens's layout and hook names:

- SAE (pre-encoder bias, as SAELens and Bricken et al. 2023):
  ``acts = f((x - b_dec) @ W_enc + b_enc)``, ``recons = acts @ W_dec + b_dec``.
- Transcoder (Dunefsky et al. 2024, arXiv 2406.11944): reads one hook point and predicts
  another, ``acts = f(x @ W_enc + b_enc)``, ``recons = acts @ W_dec + b_dec`` (+
  ``x @ W_skip`` with the optional linear skip).

``f`` is one of (``DictionaryConfig.activation``):

- ``"relu"``, trained with an L1 penalty (Bricken et al., "Towards Monosemanticity", 2023);
- ``"topk"`` (Gao et al., "Scaling and evaluating sparse autoencoders", 2024, arXiv
  2406.04093): keep each row's ``k`` largest pre-activations, ReLU'd, zero the rest;
- ``"batchtopk"`` (Bussmann et al., "BatchTopK Sparse Autoencoders", 2024, arXiv
  2412.06410): in training, keep the ``batch * k`` largest pre-activations of the whole
  batch (rows may use more or fewer than ``k``); at inference (:meth:`~SparseDictionary.
  activate`), ``pre * 1{pre > threshold}`` with one learned global ``threshold`` (a
  buffer, estimated during training), so a row's code does not depend on its batch;
- ``"jumprelu"`` (Rajamanoharan et al., "Jumping Ahead: Improving Reconstruction Fidelity
  with JumpReLU Sparse Autoencoders", 2024, arXiv 2407.14435): ``pre * 1{pre >
  theta}`` with a learned threshold per feature, ``theta = exp(log_threshold)``, trained
  with an L0 penalty through straight-through estimators (:mod:`.jumprelu`).

Hook points, by SAELens's names: ``hook_sae_input`` (x), ``hook_sae_acts_pre``,
``hook_sae_acts_post`` (the feature activations), ``hook_sae_recons`` and, with
``use_error_term``, ``hook_sae_error`` (target - recons, added back to the output so that
the module returns its target exactly).
"""

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import Any

import torch
from jaxtyping import Float
from torch import nn

from ..hooks import HookedModule, HookPoint
from .jumprelu import jumprelu

ACTIVATIONS = ("relu", "topk", "batchtopk", "jumprelu")
"""The activation functions a dictionary may use."""
_DTYPES = {"float32": torch.float32, "float64": torch.float64}
_WITH_K = ("topk", "batchtopk")
JUMPRELU_INIT_THRESHOLD = 0.001
"""A JumpReLU dictionary's thresholds at the start by default (SAELens's default;
``DictionaryConfig.init_threshold``)."""


@dataclass(frozen=True)
class DictionaryConfig:
    """The shape and kind of a sparse dictionary (:class:`SparseAutoencoder`,
    :class:`Transcoder`); validated when built.

    Attributes:
        d_in: width of the activation read (the SAE's and the transcoder's input), >= 1.
        d_sae: number of features (dictionary rows), >= 1.
        activation: ``"relu"`` (trained with an L1 penalty), ``"topk"``, ``"batchtopk"``
            or ``"jumprelu"`` (trained with an L0 penalty); see :mod:`.modules`.
        k: active features per row for ``"topk"`` (mean per row for ``"batchtopk"``;
            ``1 <= k <= d_sae``); ``None`` for the others.
        d_out: a transcoder's output width (``None``: ``d_in``); an SAE's is ``d_in``.
        transcoder: whether this is a transcoder (reads ``hook_in``, predicts ``hook_out``).
        skip: a transcoder's linear skip ``W_skip [d_in, d_out]`` (transcoders only).
        hook_in: the model hook point the dictionary reads (optional; used by training
            from an :class:`ActivationBuffer`).
        hook_out: the hook point a transcoder predicts (optional, transcoders only).
        dtype: ``"float32"`` or ``"float64"``.
        bandwidth: the width ``eps`` of JumpReLU's rectangle kernel (its pseudo-derivatives
            see pre-activations within ``eps / 2`` of the threshold); > 0. The paper's
            0.001 suits activations of unit mean squared norm; scale it with the data.
            Ignored by the other activations.
        init_threshold: JumpReLU's thresholds at the start, ``exp(log_threshold)``; > 0.
            SAELens's 0.001 makes the first steps a ReLU without sparsity penalty (every
            positive pre-activation fires); on the planted test a threshold between the
            crosstalk of other features and a feature's own activation (0.5 there) is what
            recovers every direction (see :func:`~vecinterp.dictionary.train_dictionary`).
            Ignored by the other activations.

    Example:
        >>> from vecinterp.dictionary import DictionaryConfig
        >>> cfg = DictionaryConfig(d_in=8, d_sae=32, activation="topk", k=4)
        >>> cfg.d_out, cfg.to_dict()["k"]
        (8, 4)
        >>> DictionaryConfig(d_in=8, d_sae=4, activation="topk", k=5)
        Traceback (most recent call last):
        ...
        ValueError: k must be an int with 1 <= k <= d_sae (4) for activation='topk', got 5
    """

    d_in: int
    d_sae: int
    activation: str = "relu"
    k: int | None = None
    d_out: int | None = None
    transcoder: bool = False
    skip: bool = False
    hook_in: str | None = None
    hook_out: str | None = None
    dtype: str = "float32"
    bandwidth: float = 0.001
    init_threshold: float = JUMPRELU_INIT_THRESHOLD

    def __post_init__(self) -> None:
        for name in ("d_in", "d_sae"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if self.activation in _WITH_K:
            k = self.k
            if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= self.d_sae:
                raise ValueError(
                    f"k must be an int with 1 <= k <= d_sae ({self.d_sae}) for "
                    f"activation={self.activation!r}, got {k!r}"
                )
        elif self.k is not None:
            raise ValueError(
                f"k is for activation='topk' or 'batchtopk' only; got k={self.k!r} with "
                f"{self.activation!r}"
            )
        for name in ("bandwidth", "init_threshold"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        for name in ("transcoder", "skip"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if not self.transcoder:
            if self.d_out is None:
                object.__setattr__(self, "d_out", self.d_in)
            for name in ("skip", "hook_out"):
                if getattr(self, name) not in (None, False):
                    raise ValueError(f"{name} is for transcoders only (transcoder=True)")
            if self.d_out != self.d_in:
                raise ValueError(
                    f"an SAE reconstructs its input: d_out must be d_in ({self.d_in}), got "
                    f"{self.d_out!r} (a transcoder predicts another width: transcoder=True)"
                )
        elif self.d_out is None:
            object.__setattr__(self, "d_out", self.d_in)
        d_out = self.d_out
        if isinstance(d_out, bool) or not isinstance(d_out, int) or d_out < 1:
            raise ValueError(f"d_out must be an int >= 1, got {d_out!r}")
        for name in ("hook_in", "hook_out"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, str):
                raise TypeError(f"{name} must be a hook name (str) or None, got {value!r}")
        if self.dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {tuple(_DTYPES)}, got {self.dtype!r}")

    @property
    def torch_dtype(self) -> torch.dtype:
        """The torch dtype of the weights."""
        return _DTYPES[self.dtype]

    def to_dict(self) -> dict[str, Any]:
        """The config as a JSON-able dict (:meth:`from_dict` reads it back)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "DictionaryConfig":
        """Build from :meth:`to_dict`'s dict; ``ValueError`` naming unknown fields."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(record) - known)
        if unknown:
            raise ValueError(f"unknown DictionaryConfig field(s) {unknown}")
        return cls(**record)

    def __str__(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)


class SparseDictionary(HookedModule):
    """What :class:`SparseAutoencoder` and :class:`Transcoder` share: the weights, the
    hook points, the forward pass and the decoder-norm constraint. Build one of the two.

    Attributes:
        cfg: the :class:`DictionaryConfig`.
        W_enc: ``[d_in, d_sae]``; ``b_enc``: ``[d_sae]``.
        W_dec: ``[d_sae, d_out]``, unit-norm rows (the feature directions); ``b_dec``:
            ``[d_out]`` (an SAE's is also its pre-encoder bias).
        W_skip: ``[d_in, d_out]`` for a transcoder with ``skip``, else ``None``.
        log_threshold: ``[d_sae]`` (``"jumprelu"`` only), the log of each feature's
            threshold (a parameter; starts at ``log(cfg.init_threshold)``).
        threshold: ``[]`` (``"batchtopk"`` only), the global inference threshold (a
            buffer, 0 until :func:`~vecinterp.dictionary.train_dictionary` estimates it).
        use_error_term: add ``hook_sae_error`` (target - recons) to the output, so the
            output is the target exactly (default ``False``: the output is ``recons``).

    Example:
        >>> import torch
        >>> from vecinterp.dictionary import DictionaryConfig, SparseAutoencoder
        >>> sae = SparseAutoencoder(DictionaryConfig(d_in=4, d_sae=8), seed=0)
        >>> isinstance(sae, SparseDictionary), sorted(sae.hook_dict)[:2]
        (True, ['hook_sae_acts_post', 'hook_sae_acts_pre'])
    """

    W_skip: nn.Parameter | None
    log_threshold: nn.Parameter | None
    threshold: torch.Tensor | None

    def __init__(self, cfg: DictionaryConfig, seed: int = 0):
        super().__init__()
        if not isinstance(cfg, DictionaryConfig):
            raise TypeError(f"cfg must be a DictionaryConfig, got {type(cfg).__name__}")
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        self.cfg = cfg
        d_in, d_sae, d_out = cfg.d_in, cfg.d_sae, int(cfg.d_out or cfg.d_in)
        # drawn in float64 and cast, so float32 and float64 dictionaries start alike
        gen = torch.Generator().manual_seed(seed)
        w_dec = torch.randn(d_sae, d_out, generator=gen, dtype=torch.float64)
        w_dec = w_dec / w_dec.norm(dim=1, keepdim=True)
        dtype = cfg.torch_dtype
        self.W_dec = nn.Parameter(w_dec.to(dtype))
        if d_in == d_out and not cfg.transcoder:
            w_enc = w_dec.T.clone()  # the encoder starts as the decoder's transpose
        else:
            w_enc = torch.randn(d_in, d_sae, generator=gen, dtype=torch.float64)
            w_enc = w_enc / w_enc.norm(dim=0, keepdim=True)
        self.W_enc = nn.Parameter(w_enc.to(dtype))
        self.b_enc = nn.Parameter(torch.zeros(d_sae, dtype=dtype))
        self.b_dec = nn.Parameter(torch.zeros(d_out, dtype=dtype))
        self.W_skip = nn.Parameter(torch.zeros(d_in, d_out, dtype=dtype)) if cfg.skip else None
        self.log_threshold = None
        if cfg.activation == "jumprelu":
            start = torch.full((d_sae,), math.log(cfg.init_threshold), dtype=dtype)
            self.log_threshold = nn.Parameter(start)
        if cfg.activation == "batchtopk":
            self.register_buffer("threshold", torch.zeros((), dtype=dtype))
        else:
            self.threshold = None
        self.use_error_term = False
        self.hook_sae_input = HookPoint()
        self.hook_sae_acts_pre = HookPoint()
        self.hook_sae_acts_post = HookPoint()
        self.hook_sae_recons = HookPoint()
        self.hook_sae_error = HookPoint()
        self.setup_hooks()

    # -- the pieces of the forward pass ----------------------------------------------
    def activate(self, pre: torch.Tensor) -> torch.Tensor:
        """The activation function at inference on pre-activations ``[..., d_sae]``: ReLU;
        TopK (each row's ``k`` largest kept and ReLU'd, the rest zero); BatchTopK's
        ``pre * 1{pre > threshold}`` (with the threshold 0 of an untrained one: ReLU);
        JumpReLU's ``pre * 1{pre > exp(log_threshold)}``. Rows are independent."""
        activation = self.cfg.activation
        if activation == "relu":
            return torch.relu(pre)
        if activation == "topk":
            values, index = pre.topk(int(self.cfg.k or 1), dim=-1)
            return torch.zeros_like(pre).scatter(-1, index, torch.relu(values))
        if activation == "batchtopk":
            assert self.threshold is not None
            return pre * (pre > self.threshold.clamp_min(0)).to(pre.dtype)
        assert self.log_threshold is not None
        return jumprelu(pre, self.log_threshold.exp(), self.cfg.bandwidth)

    def activate_batch(self, pre: torch.Tensor) -> torch.Tensor:
        """The activation function in training: as :meth:`activate`, except BatchTopK,
        which keeps the ``n * k`` largest ReLU'd pre-activations of all ``n`` rows of
        ``pre [..., d_sae]`` together (ties: the lower flat index first) and zeros the rest.

        Example:
            >>> import torch
            >>> from vecinterp.dictionary import DictionaryConfig, SparseAutoencoder
            >>> sae = SparseAutoencoder(DictionaryConfig(d_in=2, d_sae=3,
            ...                         activation="batchtopk", k=1))
            >>> sae.activate_batch(torch.tensor([[3.0, 2.0, 0.0], [1.0, 0.5, -1.0]]))
            tensor([[3., 2., 0.],
                    [0., 0., 0.]])
        """
        if self.cfg.activation != "batchtopk":
            return self.activate(pre)
        flat = torch.relu(pre).reshape(-1)
        keep = min(flat.numel(), (flat.numel() // self.cfg.d_sae) * int(self.cfg.k or 1))
        values, index = flat.topk(keep, sorted=False)
        return torch.zeros_like(flat).scatter(0, index, values).reshape(pre.shape)

    def encode_pre(self, x: Float[torch.Tensor, "... d_in"]) -> Float[torch.Tensor, "... d_sae"]:
        """The pre-activations of ``x`` (through ``hook_sae_input`` and
        ``hook_sae_acts_pre``): ``(x - b_dec) @ W_enc + b_enc`` for an SAE, ``x @ W_enc +
        b_enc`` for a transcoder."""
        x = self.hook_sae_input(self._check_input(x))
        centred = x if self.cfg.transcoder else x - self.b_dec
        return self.hook_sae_acts_pre(centred @ self.W_enc + self.b_enc)

    def encode(self, x: Float[torch.Tensor, "... d_in"]) -> Float[torch.Tensor, "... d_sae"]:
        """The feature activations of ``x`` (through the hook points)."""
        return self.hook_sae_acts_post(self.activate(self.encode_pre(x)))

    def decode(
        self,
        acts: Float[torch.Tensor, "... d_sae"],
        x: Float[torch.Tensor, "... d_in"] | None = None,
    ) -> Float[torch.Tensor, "... d_out"]:
        """``acts @ W_dec + b_dec`` (+ ``x @ W_skip`` for a transcoder with a skip, which
        then needs ``x``), through ``hook_sae_recons``."""
        recons = acts @ self.W_dec + self.b_dec
        if self.W_skip is not None:
            if x is None:
                raise ValueError("a transcoder with a skip decodes with its input: pass x")
            recons = recons + x @ self.W_skip
        return self.hook_sae_recons(recons)

    def forward(
        self,
        x: Float[torch.Tensor, "... d_in"],
        target: Float[torch.Tensor, "... d_out"] | None = None,
    ) -> Float[torch.Tensor, "... d_out"]:
        """The reconstruction of ``x`` (an SAE) or prediction from it (a transcoder).

        With ``use_error_term``, the output is ``recons + hook_sae_error(target -
        recons)``: the target itself, with the error term hookable. An SAE's target is
        ``x``; a transcoder needs ``target`` then (``ValueError`` without it).
        """
        acts = self.encode(x)
        recons = self.decode(acts, x)
        if not self.use_error_term:
            return recons
        if target is None:
            if self.cfg.transcoder:
                raise ValueError(
                    "a transcoder with use_error_term=True needs target (the activation it "
                    "predicts) to form its error term"
                )
            target = x
        return recons + self.hook_sae_error(target - recons)

    def run_with_cache(
        self, x: torch.Tensor, target: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Run the dictionary and keep what flowed through each of its hook points
        (detached), by name: ``(output, cache)``.

        Example:
            >>> import torch
            >>> from vecinterp.dictionary import DictionaryConfig, SparseAutoencoder
            >>> sae = SparseAutoencoder(DictionaryConfig(d_in=4, d_sae=8), seed=0)
            >>> out, cache = sae.run_with_cache(torch.randn(3, 4))
            >>> cache["hook_sae_acts_post"].shape
            torch.Size([3, 8])
        """
        cache: dict[str, torch.Tensor] = {}

        def keep(act: torch.Tensor, hook: HookPoint) -> None:
            cache[str(hook.name)] = act.detach()

        out = self.run_with_hooks(x, target, fwd_hooks=[(lambda name: True, keep)])
        return out, cache

    # -- the decoder-norm constraint -------------------------------------------------
    @torch.no_grad()
    def normalise_decoder(self) -> None:
        """Scale each row of ``W_dec`` to unit norm (a zero row stays zero)."""
        norms = self.W_dec.norm(dim=1, keepdim=True)
        self.W_dec.div_(torch.where(norms > 0, norms, torch.ones_like(norms)))

    @torch.no_grad()
    def remove_parallel_gradient(self) -> None:
        """Project out of ``W_dec.grad`` each row's component along the row itself: a step
        then changes a feature's direction, not the norm the constraint fixes."""
        grad = self.W_dec.grad
        if grad is not None:
            grad.sub_((grad * self.W_dec).sum(dim=1, keepdim=True) * self.W_dec)

    def _check_input(self, x: object) -> torch.Tensor:
        if not isinstance(x, torch.Tensor) or not x.is_floating_point():
            raise TypeError(f"x must be a floating-point torch.Tensor, got {type(x).__name__}")
        if x.shape[-1:] != (self.cfg.d_in,):
            raise ValueError(f"x must be [..., d_in={self.cfg.d_in}], got shape {tuple(x.shape)}")
        return x

    def extra_repr(self) -> str:
        return str(self.cfg)


class SparseAutoencoder(SparseDictionary):
    """A sparse autoencoder: ``acts = f((x - b_dec) @ W_enc + b_enc)``,
    ``recons = acts @ W_dec + b_dec`` (see :mod:`vecinterp.dictionary.modules`).

    ``W_dec``'s rows start unit-norm and random (seeded), ``W_enc`` as its transpose,
    the biases at zero.

    Example:
        >>> import torch
        >>> from vecinterp.dictionary import DictionaryConfig, SparseAutoencoder
        >>> sae = SparseAutoencoder(DictionaryConfig(d_in=4, d_sae=8, activation="topk", k=2))
        >>> acts = sae.encode(torch.randn(5, 4))
        >>> int((acts > 0).sum(-1).max()) <= 2, sae(torch.randn(5, 4)).shape
        (True, torch.Size([5, 4]))
    """

    def __init__(self, cfg: DictionaryConfig, seed: int = 0):
        if isinstance(cfg, DictionaryConfig) and cfg.transcoder:
            raise ValueError("cfg.transcoder is True: build a Transcoder")
        super().__init__(cfg, seed)


class Transcoder(SparseDictionary):
    """A transcoder: reads one hook point, predicts another (by default an MLP's normalised
    input ``blocks.L.ln2.hook_normalized`` to its output ``blocks.L.hook_mlp_out``, see
    :func:`transcoder_hooks`); ``acts = f(x @ W_enc + b_enc)``, ``recons = acts @ W_dec +
    b_dec [+ x @ W_skip]``.

    Example:
        >>> import torch
        >>> from vecinterp.dictionary import DictionaryConfig, Transcoder
        >>> cfg = DictionaryConfig(d_in=4, d_sae=16, d_out=4, transcoder=True, skip=True)
        >>> tc = Transcoder(cfg, seed=0)
        >>> tc(torch.randn(3, 4)).shape, tc.W_skip.shape
        (torch.Size([3, 4]), torch.Size([4, 4]))
    """

    def __init__(self, cfg: DictionaryConfig, seed: int = 0):
        if isinstance(cfg, DictionaryConfig) and not cfg.transcoder:
            raise ValueError("cfg.transcoder is False: build a SparseAutoencoder")
        super().__init__(cfg, seed)


def transcoder_hooks(layer: int) -> tuple[str, str]:
    """The hook points a transcoder of block ``layer``'s MLP reads and predicts by default:
    the MLP's normalised input and its output.

    Example:
        >>> from vecinterp.dictionary import transcoder_hooks
        >>> transcoder_hooks(1)
        ('blocks.1.ln2.hook_normalized', 'blocks.1.hook_mlp_out')
    """
    if isinstance(layer, bool) or not isinstance(layer, int) or layer < 0:
        raise ValueError(f"layer must be an int >= 0, got {layer!r}")
    return f"blocks.{layer}.ln2.hook_normalized", f"blocks.{layer}.hook_mlp_out"


def make_dictionary(cfg: DictionaryConfig, seed: int = 0) -> SparseDictionary:
    """A :class:`Transcoder` or :class:`SparseAutoencoder`, as ``cfg.transcoder`` says."""
    return Transcoder(cfg, seed) if cfg.transcoder else SparseAutoencoder(cfg, seed)
