"""Direct attribution for vector outputs: how much each component's write into the
residual stream, read out through the final norm and ``W_U``, points along a target.

For a component ``c`` (the embedding, one head, one layer's ``b_O``, one MLP, ...) that
writes ``c_{b,p}`` into the residual stream at batch item ``b`` and position ``p``, its
direct attribution along the target direction ``t_{b,p}`` is

.. math::
    A_c[b, p] = \\big\\langle \\mathrm{LN}^{lin}_{final}(c_{b,p})\\, W_U,\\; t_{b,p} \\big\\rangle,
    \\qquad \\mathrm{LN}^{lin}_{final}(c) = \\frac{\\mathrm{centre}(c)}{s_{b,p}} \\odot w

with ``s_{b,p}`` the final norm's scale cached for this run (``ln_final.hook_scale``),
``centre`` removing the mean for LN/LNPre only and ``w`` applied for LN/RMS only
(:meth:`~vecinterp.ActivationCache.apply_ln_to_stack`). Because the scale is frozen at
its cached value the map is linear, so the attributions of a complete set of components
plus the constant term ``⟨b W_U, t⟩`` of the final norm's bias (LN only) add up to
``⟨y_{b,p} − b_U, t_{b,p}⟩`` exactly, ``y`` being the model's output. This is the "direct
logit attribution" of Bhargav & Gu (2024, §4.3), with targets the next vector
``a_{m+1}`` or the step ``a_{m+1} − a_m``.
"""

import re
import warnings
from dataclasses import dataclass
from typing import cast

import torch
from einops import einsum
from jaxtyping import Bool, Float

from ..cache import ActivationCache, _resid_points
from ..model import HookedVectorTransformer
from ..model.components import TransformerBlock
from ..model.validation import check_bool, check_finite, check_input
from ._validate import check_model

COMPONENTS = ("all", "layers", "heads", "features")
_HEAD = re.compile(r"L(\d+)H\d+")
_ATTN_BIAS = re.compile(r"(\d+)_b_O")
# labels before TransformerLens's scheme was adopted: L{l}_attn, L{l}_mlp, L{l}_b_O
_OLD_LABEL = re.compile(r"L(\d+)_(attn|mlp|b_O)")
_OLD_SUFFIX = {"attn": "attn_out", "mlp": "mlp_out", "b_O": "b_O"}


@dataclass(frozen=True)
class DirectAttribution:
    """Direct attributions of residual-stream components, per batch item and position.

    Attributes:
        values: ``[component, batch, pos]``, ``values[i, b, p]`` the attribution of
            component ``labels[i]`` at ``(b, p)``.
        labels: one name per component, in TransformerLens's scheme (as
            :meth:`~vecinterp.ActivationCache.decompose_resid` and
            :meth:`~vecinterp.ActivationCache.stack_head_results` label them):
            ``"embed"`` (``x W_E + b_E``), ``"pos_embed"``, ``"L{l}H{h}"`` (head ``h`` of
            block ``l``), ``"{l}_b_O"`` (block ``l``'s attention output bias),
            ``"{l}_attn_out"`` (block ``l``'s whole attention output), ``"{l}_mlp_out"``
            (block ``l``'s MLP output, ``b_out`` included) and ``"ln_final_b"`` (the
            constant ``⟨b W_U, t⟩`` of an ``LN`` final norm). Indexing also accepts the
            labels of vecinterp 0.x (``"L{l}_attn"``, ``"L{l}_mlp"``, ``"L{l}_b_O"``),
            with a ``DeprecationWarning``.
        loss_mask: ``[batch, pos]`` positions that :meth:`mean` averages over by default
            (``None``: all).

    Example:
        >>> import torch
        >>> from vecinterp.analysis.attribution import DirectAttribution
        >>> attr = DirectAttribution(torch.tensor([[[1.0, 3.0]], [[2.0, 0.0]]]), ("a", "b"))
        >>> attr.mean().tolist(), attr["b"].tolist()
        ([2.0, 1.0], [[2.0, 0.0]])
    """

    values: Float[torch.Tensor, "component batch pos"]
    labels: tuple[str, ...]
    loss_mask: Bool[torch.Tensor, "batch pos"] | None = None

    def __post_init__(self) -> None:
        if len(self.labels) != self.values.shape[0]:
            raise ValueError(
                f"{len(self.labels)} labels for {self.values.shape[0]} components in values"
            )
        if len(set(self.labels)) != len(self.labels):
            raise ValueError(f"labels must be distinct, got {self.labels}")
        if self.loss_mask is not None and self.loss_mask.shape != self.values.shape[1:]:
            raise ValueError(
                f"loss_mask must have shape [batch, pos]={tuple(self.values.shape[1:])}, "
                f"got {tuple(self.loss_mask.shape)}"
            )

    def __getitem__(self, label: str) -> Float[torch.Tensor, "batch pos"]:
        """The attribution ``[batch, pos]`` of the component named ``label``."""
        old = _OLD_LABEL.fullmatch(label) if isinstance(label, str) else None
        if old is not None and label not in self.labels:
            new = f"{old.group(1)}_{_OLD_SUFFIX[old.group(2)]}"
            warnings.warn(
                f"component label {label!r} is now {new!r} (TransformerLens's labels, as in "
                "decompose_resid)",
                DeprecationWarning,
                stacklevel=2,
            )
            label = new
        if label not in self.labels:
            raise KeyError(f"no component {label!r}; components: {list(self.labels)}")
        return self.values[self.labels.index(label)]

    def total(self) -> Float[torch.Tensor, "batch pos"]:
        """``values.sum(0)``: with ``components="all"`` or ``"layers"``, ``⟨y − b_U, t⟩``."""
        return self.values.sum(0)

    def mean(
        self, loss_mask: Bool[torch.Tensor, "batch pos"] | Bool[torch.Tensor, " pos"] | None = None
    ) -> Float[torch.Tensor, " component"]:
        """Each component's mean attribution over the selected positions.

        .. math:: \\bar A_c = \\frac{1}{|M|} \\sum_{(b, p) \\in M} A_c[b, p]

        Args:
            loss_mask: boolean ``[batch, pos]`` or ``[pos]`` selecting ``M``; ``None`` uses
                the mask stored in this result, or every position if there is none.
        """
        mask = self.loss_mask if loss_mask is None else _check_mask(loss_mask, self.values)
        if mask is None:
            return self.values.mean(dim=(1, 2))
        count = int(mask.sum())
        if count == 0:
            raise ValueError("loss_mask selects no position")
        return (self.values * mask).sum(dim=(1, 2)) / count

    def by_layer(self) -> "DirectAttribution":
        """Merge each block's heads and ``b_O`` into one ``"{l}_attn_out"`` component.

        Other components are kept as they are, in order; the totals are unchanged. On a
        ``components="heads"`` result, ``"{l}_attn_out"`` is the sum of the heads alone.

        Example:
            >>> import torch
            >>> from vecinterp.analysis.attribution import DirectAttribution
            >>> labels = ("L0H0", "L0H1", "0_b_O", "0_mlp_out")
            >>> attr = DirectAttribution(torch.ones(4, 1, 2), labels)
            >>> merged = attr.by_layer()
            >>> merged.labels, merged["0_attn_out"].tolist()
            (('0_attn_out', '0_mlp_out'), [[3.0, 3.0]])
        """
        groups: dict[str, list[int]] = {}
        for i, label in enumerate(self.labels):
            match = _HEAD.fullmatch(label) or _ATTN_BIAS.fullmatch(label)
            groups.setdefault(f"{match.group(1)}_attn_out" if match else label, []).append(i)
        values = torch.stack([self.values[idx].sum(0) for idx in groups.values()])
        return DirectAttribution(values, tuple(groups), self.loss_mask)


def direct_attribution(
    model: HookedVectorTransformer,
    cache: ActivationCache,
    targets: Float[torch.Tensor, "batch pos d_out"],
    *,
    components: str = "all",
    loss_mask: Bool[torch.Tensor, "batch _pos"] | Bool[torch.Tensor, " _pos"] | None = None,
) -> DirectAttribution:
    """Direct attribution of every residual-stream component along target directions.

    ``A_c[b, p] = ⟨LN_final_lin(c_{b,p}) W_U, t_{b,p}⟩``, the final norm linearised at the
    scale cached in ``cache`` (see the module docstring). With ``components="all"`` or
    ``"layers"`` or ``"features"`` the components are complete and

    .. math:: \\sum_c A_c[b, p] = \\langle y_{b,p} - b_U,\\; t_{b,p} \\rangle

    holds exactly (to rounding), ``y`` the output of the cached run.

    Args:
        model: the model that produced ``cache``.
        cache: the activations of one run, with ``hook_embed`` (and ``hook_pos_embed``),
            ``ln_final.hook_scale``, and per block ``hook_result`` plus ``hook_mlp_out``
            (``"all"``), or ``hook_attn_out`` plus ``hook_mlp_out`` (``"layers"``), or
            ``hook_result`` only (``"heads"``); ``run_with_cache`` with the default
            ``names_filter`` caches all of them.
        targets: target directions ``[batch, pos_t, d_out]``, e.g. the task's targets
            (the next vectors) or :func:`next_vector_targets`. ``pos_t`` may be smaller than
            the run's ``pos``: then the first ``pos_t`` positions are attributed (so
            next-vector targets without a vector after the last input fit directly).
        components: ``"all"``: ``embed``, ``pos_embed`` (learned/sinusoidal positions
            only), every head ``L{l}H{h}``, every ``{l}_b_O``, every ``{l}_mlp_out`` and
            ``ln_final_b`` (LN only); ``"layers"``: the same with each block's heads and
            ``b_O`` replaced by its whole attention output ``{l}_attn_out``; ``"heads"``:
            the heads alone (not a complete decomposition: the sum identity does not
            hold); ``"features"`` (a model made by :func:`vecinterp.dictionary.splice`):
            ``"layers"``'s components with each one that a dictionary is spliced on (an
            SAE at ``hook_attn_out``/``hook_mlp_out``, a transcoder replacing an MLP)
            split into that dictionary's features, bias, skip and error
            (``"1_mlp_out.feature_3"``, ``"1_mlp_out.bias"``, ``"1_mlp_out.error"``: the
            stack of :func:`vecinterp.dictionary.decompose_resid_features`), so the sum
            identity still holds and feature ``i``'s attribution is ``⟨LN_final_lin(acts_i
            W_dec[i]) W_U, t⟩``. A dictionary on the residual stream is a view of the
            whole stream, not a component, so it adds nothing here (see the how-to). The
            labels are TransformerLens's, as in
            :meth:`~vecinterp.ActivationCache.decompose_resid`.
        loss_mask: boolean ``[batch, pos]`` or ``[pos]`` (``pos`` that of the run or of the
            targets), stored in the result as the default positions of
            :meth:`DirectAttribution.mean`. Values at masked-out positions are kept.

    Returns:
        A :class:`DirectAttribution` with ``values [component, batch, pos_t]``.

    Raises ``ValueError`` (never a sum that silently fails) when the model's weights
    changed after the run (naming the weight), and, with ``"all"``, ``"layers"`` or
    ``"features"``, when a hook of the run edited a point the identity assumes unedited: a
    ``hook_resid_pre/mid/post``, ``ln_final.hook_normalized`` or ``unembed.hook_out``;
    with ``"all"`` also a ``hook_attn_out`` (the heads and ``b_O`` would no longer sum to
    it: ``"layers"`` reads the edited one); with ``"features"`` also what
    :func:`~vecinterp.dictionary.decompose_resid_features` refuses (an edit of a spliced
    point or of its ``hook_sae_recons``, a residual dictionary without the error term
    upstream). Edits of ``hook_embed``, ``hook_result``,
    ``hook_mlp_out``, anything inside attention or an MLP, and a norm's ``hook_scale``
    keep the identity exact.

    Example:
        >>> import torch
        >>> from vecinterp import HookedVectorTransformer, VectorTransformerConfig
        >>> from vecinterp.analysis.attribution import direct_attribution, next_vector_targets
        >>> cfg = VectorTransformerConfig(d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2,
        ...                               n_ctx=6)
        >>> model = HookedVectorTransformer(cfg, seed=0, dtype=torch.float64)
        >>> x = torch.randn(4, 6, 3, dtype=torch.float64)
        >>> y, cache = model.run_with_cache(x)
        >>> t = next_vector_targets(model, x)  # [4, 5, 3]: no target after the last input
        >>> attr = direct_attribution(model, cache, t)
        >>> attr.values.shape, attr.labels[:3]
        (torch.Size([11, 4, 5]), ('embed', 'pos_embed', 'L0H0'))
        >>> rhs = ((y[:, :5] - model.unembed.b_U) * t).sum(-1)  # ⟨y − b_U, t⟩
        >>> bool(torch.allclose(attr.total(), rhs, rtol=0, atol=1e-12))
        True
    """
    model = check_model(model)
    if not isinstance(cache, ActivationCache):
        raise TypeError(f"cache must be an ActivationCache, got {type(cache).__name__}")
    if cache.model is not model:
        raise ValueError("cache was not produced by this model (cache.model is not model)")
    if components not in COMPONENTS:
        raise ValueError(f"components must be one of {COMPONENTS}, got {components!r}")
    _check_run(model, cache, components)
    with torch.no_grad():
        embed = cache["embed"]
        batch, n_pos, _ = embed.shape
        targets = _check_targets(targets, batch, n_pos, model.W_U.shape[1], embed)
        n_t = targets.shape[1]
        if loss_mask is not None:
            loss_mask = _check_mask(loss_mask, embed[..., 0], n_t)

        stack, labels = _components(model, cache, components)
        read = cache.apply_ln_to_stack(stack, layer=None)
        # ⟨r W_U, t⟩ = ⟨r, t W_U^T⟩: pull each target back into the residual stream once
        W_U = model.W_U.detach()
        t_resid = einsum(targets, W_U, "batch pos d_out, d_model d_out -> batch pos d_model")
        values = einsum(
            read[:, :, :n_t],
            t_resid,
            "component batch pos d_model, batch pos d_model -> component batch pos",
        )
        ln_b = getattr(model.ln_final, "b", None)
        if components != "heads" and ln_b is not None:
            bias = einsum(ln_b.detach(), t_resid, "d_model, batch pos d_model -> batch pos")
            values = torch.cat([values, bias[None]])
            labels.append("ln_final_b")
    return DirectAttribution(values, tuple(labels), loss_mask)


def next_vector_targets(
    model: HookedVectorTransformer,
    x: Float[torch.Tensor, "batch pos d_in"],
    *,
    final: Float[torch.Tensor, "batch d_in"] | None = None,
    minus_current: bool = False,
) -> Float[torch.Tensor, "batch _pos d_out"]:
    """Targets for next-vector prediction built from the inputs themselves.

    The target at position ``p`` is the next input ``x_{p+1}`` or, with ``minus_current``,
    the step ``x_{p+1} − x_p`` (how far the prediction should move from the current
    vector; paper §4.3). The last position has no next input: with ``final=None`` it is
    dropped (``pos_t = pos − 1``; :func:`direct_attribution` then attributes the first
    ``pos − 1`` positions); else ``final [batch, d_in]`` (e.g. the task's last target) is
    used as the vector after the last input (``pos_t = pos``).

    Args:
        model: the model; its ``d_in`` must equal its ``d_out`` (targets are read-out
            directions, so they must live in the input space too).
        x: the model's inputs ``[batch, pos, d_in]``.
        final: the vector following ``x[:, -1]``, ``[batch, d_in]`` (finite), or ``None``.
        minus_current: return ``x_{p+1} − x_p`` instead of ``x_{p+1}`` (a bool).

    Returns:
        ``[batch, pos − 1, d_out]`` (``final=None``) or ``[batch, pos, d_out]``.

    Example:
        >>> import torch
        >>> from vecinterp import HookedVectorTransformer, VectorTransformerConfig
        >>> from vecinterp.analysis.attribution import next_vector_targets
        >>> model = HookedVectorTransformer(VectorTransformerConfig(
        ...     d_in=1, d_model=4, d_head=2, n_heads=2, n_layers=1, n_ctx=4))
        >>> x = torch.tensor([[[1.0], [2.0], [4.0]]])
        >>> next_vector_targets(model, x).flatten().tolist()
        [2.0, 4.0]
        >>> next_vector_targets(model, x, final=torch.tensor([[8.0]]), minus_current=True)
        ... # doctest: +NORMALIZE_WHITESPACE
        tensor([[[1.], [2.], [4.]]])
    """
    model = check_model(model)
    check_bool("minus_current", minus_current)
    cfg = model.cfg
    if cfg.d_in != cfg.d_out:
        raise ValueError(
            f"next-vector targets need d_in == d_out, but the model has d_in={cfg.d_in} "
            f"and d_out={cfg.d_out}; pass the task's targets [batch, pos, d_out] instead"
        )
    x = check_input(x, cfg, model.W_E)
    if final is None:
        if x.shape[1] < 2:
            raise ValueError(
                f"next-vector targets without final need at least 2 positions, got {x.shape[1]}"
            )
        nxt, cur = x[:, 1:], x[:, :-1]
    else:
        if not isinstance(final, torch.Tensor):
            raise TypeError(f"final must be a tensor [batch, d_in], got {type(final).__name__}")
        if final.shape != (x.shape[0], cfg.d_in):
            raise ValueError(
                f"final must have shape [batch, d_in]={(x.shape[0], cfg.d_in)}, "
                f"got {tuple(final.shape)}"
            )
        if not final.is_floating_point():
            raise TypeError(f"final must be a floating-point tensor, got {final.dtype}")
        check_finite("final", final)
        nxt, cur = torch.cat([x[:, 1:], final.to(x)[:, None]], dim=1), x
    return nxt - cur if minus_current else nxt.clone()


# -- internals ------------------------------------------------------------------------------
def _check_run(model: HookedVectorTransformer, cache: ActivationCache, components: str) -> None:
    """Refuse a cache whose weights changed since the run, or (for a complete set of
    components) whose run had a hook that breaks ``Σ A = ⟨y − b_U, t⟩``."""
    what = f"direct_attribution(components={components!r})"
    cache._check_weights(what)
    if components == "heads":  # no identity claimed
        return
    cfg = model.cfg
    cache._check_unedited(
        _resid_points(cfg, cfg.n_layers, False),
        what,
        "attribute a run without that edit, or edit a component (hook_attn_out, "
        "hook_mlp_out, hook_result, ...) instead",
    )
    cache._check_unedited(
        ["ln_final.hook_normalized", "unembed.hook_out"],
        what,
        "the output y is then not the final norm's linearised sum read out by W_U, so "
        "Σ A = ⟨y − b_U, t⟩ cannot hold",
    )
    if components == "all":
        cache._check_unedited(
            [f"blocks.{ell}.hook_attn_out" for ell in range(cfg.n_layers)],
            what,
            "the heads and b_O then no longer sum to the attention output that flowed; use "
            "components='layers', which reads the cached (edited) hook_attn_out",
        )


def _components(
    model: HookedVectorTransformer, cache: ActivationCache, components: str
) -> tuple[torch.Tensor, list[str]]:
    """The stack ``[component, batch, pos, d_model]`` and its labels, in residual order."""
    cfg = model.cfg
    if components == "heads":
        heads, labels = cache.stack_head_results(return_labels=True)
        return heads, list(labels)
    if components == "features":
        from ..dictionary.decompose import decompose_resid_features  # imports the cache

        stack, feature_labels = decompose_resid_features(cache, None, return_labels=True)
        return stack, list(feature_labels)
    embed = cache["embed"]
    parts, labels = [embed], ["embed"]
    if model.pos_embed is not None:
        parts.append(cache["pos_embed"].expand_as(embed))
        labels.append("pos_embed")
    if components == "all":
        heads = cache.stack_head_results()
    for ell in range(cfg.n_layers):
        if components == "all":
            parts += list(heads[ell * cfg.n_heads : (ell + 1) * cfg.n_heads])
            labels += [f"L{ell}H{h}" for h in range(cfg.n_heads)]
            b_O = cast(TransformerBlock, model.blocks[ell]).attn.b_O.detach().to(embed.device)
            parts.append(b_O.expand_as(embed))
            labels.append(f"{ell}_b_O")
        else:
            parts.append(cache["attn_out", ell])
            labels.append(f"{ell}_attn_out")
        if not cfg.attn_only:
            parts.append(cache["mlp_out", ell])
            labels.append(f"{ell}_mlp_out")
    return torch.stack(parts), labels


def _check_targets(
    targets: object, batch: int, n_pos: int, d_out: int, ref: torch.Tensor
) -> torch.Tensor:
    if not isinstance(targets, torch.Tensor):
        raise TypeError(
            f"targets must be a tensor [batch, pos, d_out], got {type(targets).__name__}"
        )
    if (
        targets.ndim != 3
        or targets.shape[0] != batch
        or not 1 <= targets.shape[1] <= n_pos
        or targets.shape[2] != d_out
    ):
        raise ValueError(
            f"targets must have shape [batch={batch}, pos<={n_pos}, d_out={d_out}] to match "
            f"the cached run, got {tuple(targets.shape)}"
        )
    if not targets.is_floating_point():
        raise TypeError(f"targets must be a floating-point tensor, got {targets.dtype}")
    if targets.device != ref.device:
        raise ValueError(f"targets are on {targets.device} but the cache is on {ref.device}")
    if not bool(torch.isfinite(targets).all()):
        raise ValueError("targets contain NaN or inf")
    return targets.to(ref.dtype)


def _check_mask(mask: object, ref: torch.Tensor, n_t: int | None = None) -> torch.Tensor:
    """``mask`` as a bool ``[batch, n_t]``, from ``[batch, pos]``/``[pos]`` with ``pos`` the
    last axis of ``ref`` or ``n_t`` (longer masks are cut to the first ``n_t``)."""
    shape = tuple(ref.shape[-2:])
    n_t = shape[1] if n_t is None else n_t
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise TypeError(f"loss_mask must be a bool tensor [batch, pos] or [pos], got {mask!r}")
    allowed = {shape, shape[1:], (shape[0], n_t), (n_t,)}
    if tuple(mask.shape) not in allowed:
        raise ValueError(
            f"loss_mask must have shape [batch, pos] or [pos] with batch={shape[0]} and "
            f"pos={shape[1]} (or {n_t}, the targets' positions), got {tuple(mask.shape)}"
        )
    mask = mask.to(ref.device)[..., :n_t]
    return mask.expand(shape[0], n_t).clone()
