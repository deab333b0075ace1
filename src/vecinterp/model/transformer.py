"""The hookable vector-input, vector-output transformer.

One file because it is one class: construction and the forward pass are a third of it,
and most of the rest is TransformerLens's model-level weight stacks (``W_Q``, ``b_O``,
``W_in``, ``OV``, ...) with their examples, which users look for on the class and the API
page lists with it (a mixin in another file would drop them from that page).

In the model layer (see :mod:`vecinterp.model`): ``run_with_cache`` hands the run to the
cache layer above, :mod:`vecinterp.cache.recording`, imported when it is called.
"""

import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from jaxtyping import Bool, Float
from torch import nn

from ..factored_matrix import FactoredMatrix
from ..hooks import HookedModule, HookPoint, NameFilter
from ..hooks.hook_point import idle
from ..loss import loss_positions, masked_mse, mse_at
from .components import Embed, Norm, PosEmbed, TransformerBlock, Unembed
from .config import VectorTransformerConfig
from .validation import (
    check_bool,
    check_device,
    check_finite,
    check_float_dtype,
    check_input,
    check_like,
    check_seed,
)

if TYPE_CHECKING:
    from ..cache import ActivationCache

RETURN_TYPES = ("output", "loss", "both")

_NO_TOKENIZER = (
    "vecinterp has no tokenizer: the inputs are already float vectors [batch, pos, d_in], "
    "so call model(x) on them"
)
_RETURNS_A_COPY = "; it returns a new model and leaves model unchanged"
# TransformerLens's HookedTransformer attributes that users type, and what to use here
_TL_HABITS = {
    "process_weights_": "use model = vi.process_weights(model) (fold_ln, "
    "center_writing_weights, fold_value_biases; no center_unembed, which would change a "
    "regression output)" + _RETURNS_A_COPY,
    "fold_layer_norm": "use model = vi.fold_layer_norm(model)" + _RETURNS_A_COPY,
    "center_writing_weights": "use model = vi.center_writing_weights(model)" + _RETURNS_A_COPY,
    "fold_value_biases": "use model = vi.fold_value_biases(model)" + _RETURNS_A_COPY,
    "center_unembed": "not offered: removing W_U's mean leaves a softmax's output as it "
    "was, but changes a regression output",
    "to_tokens": _NO_TOKENIZER,
    "to_str_tokens": _NO_TOKENIZER,
    "to_string": _NO_TOKENIZER,
    "to_single_token": _NO_TOKENIZER,
    "tokenizer": _NO_TOKENIZER,
}

_skip_init = False  # True only inside uninitialised_weights()


@contextmanager
def uninitialised_weights() -> Iterator[None]:
    """Inside, ``HookedVectorTransformer(...)`` leaves its weight matrices uninitialised
    (``torch.empty``: any values, NaN included) instead of drawing them.

    For internal callers that overwrite *every* tensor of the new model's state dict
    next (``vi.load``, the weight-processing copies): drawing ~3M float64 normals per
    model cost a second per dozen copies. A caller that cannot fill every tensor must
    not use it.
    """
    global _skip_init
    previous, _skip_init = _skip_init, True
    try:
        yield
    finally:
        _skip_init = previous


class HookedVectorTransformer(HookedModule):
    """A GPT-2-style pre-norm transformer on real vectors, with a hook at every activation.

    ``x [batch, pos, d_in]`` is embedded by ``W_E``, positions are added (or rotated into
    queries and keys), ``n_layers`` blocks of attention and MLP write into the residual
    stream, and ``W_U`` reads ``[batch, pos, d_out]`` out of the final normalised
    residual. Parameter and hook names are TransformerLens's (see the Concepts page).

    Args:
        cfg: the configuration.
        seed: seed of the weight initialisation (a private generator; the global RNG is
            left alone). ``None`` draws from the global RNG.
        dtype: parameter dtype, a floating-point ``torch.dtype`` (a string such as
            ``"float32"`` is refused, not converted).
        device: parameter device; ``None``: the CPU. A CUDA device that this machine
            lacks is refused with a ``ValueError`` naming ``device``.

    Example:
        >>> import torch, vecinterp as vi
        >>> cfg = vi.VectorTransformerConfig(d_in=3, d_model=8, d_head=4, n_heads=2,
        ...                                  n_layers=2, n_ctx=6)
        >>> model = vi.HookedVectorTransformer(cfg, seed=0)
        >>> y, cache = model.run_with_cache(torch.randn(5, 6, 3))
        >>> y.shape, cache["pattern", 1].shape
        (torch.Size([5, 6, 3]), torch.Size([5, 2, 6, 6]))
    """

    pos_embed: PosEmbed | None

    def __init__(
        self,
        cfg: VectorTransformerConfig,
        seed: int | None = 0,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device | None = None,
    ):
        super().__init__()
        if not isinstance(cfg, VectorTransformerConfig):
            raise TypeError(f"cfg must be a VectorTransformerConfig, got {type(cfg).__name__}")
        check_seed("seed", seed, allow_none=True)
        check_float_dtype("dtype", dtype)
        if device is not None:
            check_device("device", device)
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()
        if cfg.positional in ("learned", "sinusoidal"):
            self.pos_embed = PosEmbed(cfg)
            self.hook_pos_embed = HookPoint()
        else:
            self.pos_embed = None
        self.blocks = nn.ModuleList(TransformerBlock(cfg) for _ in range(cfg.n_layers))
        self.ln_final = Norm(cfg) if cfg.normalization is not None else nn.Identity()
        self.unembed = Unembed(cfg)
        if not _skip_init:
            self.init_weights(seed)
        self.to(dtype=dtype, device=device)
        self.setup_hooks()

    def init_weights(self, seed: int | None = 0) -> None:
        """Weight matrices ~ N(0, std²) with ``std = cfg.init_std``; biases 0; norm weights 1.

        ``cfg.init`` chooses the scheme: ``"gpt2"`` also scales ``W_O`` and ``W_out`` by
        ``1/sqrt(2 n_layers)`` as in GPT-2; ``"transformer_lens"`` draws every weight matrix
        with the same std (by default ``0.8 / sqrt(d_model)``), as TransformerLens's
        ``HookedTransformer`` does. The draws come in parameter order from one generator
        (the same distribution as TransformerLens's, not its exact numbers).

        ``seed`` seeds a private generator (an int; ``None`` draws from the global RNG).

        Example:
            >>> import torch, vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0)
            >>> W_E = model.W_E.detach().clone()
            >>> model.init_weights(seed=1)
            >>> model.init_weights(seed=0)
            >>> torch.equal(model.W_E, W_E)
            True
        """
        seed = check_seed("seed", seed, allow_none=True)
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        std = self.cfg.init_std
        resid_std = std / (2 * self.cfg.n_layers) ** 0.5 if self.cfg.init == "gpt2" else std
        with torch.no_grad():
            for name, p in self.named_parameters():
                leaf = name.rsplit(".", 1)[-1].lstrip("_")  # _W_K: grouped-query W_K
                if leaf.startswith("W_"):
                    s = resid_std if leaf in ("W_O", "W_out") else std
                    p.copy_(torch.randn(p.shape, generator=gen, dtype=torch.float64) * s)
                elif leaf == "w":
                    p.fill_(1.0)
                else:
                    p.zero_()

    # -- TransformerLens's entry points that have no counterpart here ------------------
    @classmethod
    def from_pretrained(cls, model_name: object = None, *args: Any, **kwargs: Any) -> Any:
        """Refused: there is no zoo of pretrained vector models to download.

        TransformerLens's ``HookedTransformer.from_pretrained("gpt2")`` fetches language
        models; vecinterp's models are trained on your own vector tasks. Load a model saved
        with :func:`~vecinterp.save` by :func:`vecinterp.load` (a path), or the reference
        model that ships with the package by
        ``vecinterp.tasks.affine_recurrence.load_reference()``. Raises
        ``NotImplementedError`` saying so.

        Example:
            >>> import vecinterp as vi
            >>> try:
            ...     vi.HookedVectorTransformer.from_pretrained("gpt2")
            ... except NotImplementedError as err:
            ...     print(str(err)[:58])
            HookedVectorTransformer has no pretrained models to downlo
        """
        raise NotImplementedError(
            f"HookedVectorTransformer has no pretrained models to download (asked for "
            f"{model_name!r}): load a model saved with vi.save by vecinterp.load(path), or "
            "the packaged reference model by vecinterp.tasks.affine_recurrence.load_reference()"
        )

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Accepted for TransformerLens's code; does nothing: ``hook_result`` is always on.

        TransformerLens computes each head's output ``blocks.{l}.attn.hook_result``
        ``[batch, pos, n_heads, d_model]`` only after ``set_use_attn_result(True)``. Here
        every forward computes each head's result anyway (the attention output is their
        sum plus ``b_O``), so the hook point always fires and ``run_with_cache`` stores
        it; there is no switch to flip. ``use_attn_result`` must still be a bool
        (``TypeError`` otherwise), and ``False`` does not remove the hook point.

        Example:
            >>> import torch, vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=1, n_ctx=5), seed=0)
            >>> model.set_use_attn_result(True)
            >>> _, cache = model.run_with_cache(torch.randn(2, 5, 3))
            >>> cache["result", 0].shape
            torch.Size([2, 5, 2, 8])
        """
        check_bool("use_attn_result", use_attn_result)

    # -- the forward pass -----------------------------------------------------------
    def forward(
        self,
        x: Float[torch.Tensor, "batch pos d_in"],
        *,
        targets: Float[torch.Tensor, "batch pos d_out"] | None = None,
        loss_mask: Bool[torch.Tensor, "batch pos"] | Bool[torch.Tensor, " pos"] | None = None,
        return_type: str = "output",
        start_at_layer: int | None = None,
        stop_at_layer: int | None = None,
    ) -> Any:
        """Run the model.

        Args:
            x: input vectors ``[batch, pos, d_in]``.
            targets: ``[batch, pos, d_out]``, needed for ``return_type`` ``"loss"``/``"both"``
                (refused with ``"output"``, which would ignore them).
            loss_mask: boolean ``[batch, pos]`` or ``[pos]`` for the loss (default: all).
            return_type: ``"output"`` (``[batch, pos, d_out]``), ``"loss"`` (masked MSE)
                or ``"both"`` (``(output, loss)``). TransformerLens's ``"logits"`` is
                refused: the output is a vector read out by ``W_U`` (the tensor
                TransformerLens calls logits) but no softmax follows, so code written for
                logits (``log_softmax``, ``argmax`` over a vocabulary) would run on it and
                mean nothing; ask for ``"output"``.
            start_at_layer: ``x`` is the residual stream ``[batch, pos, d_model]``
                entering block ``start_at_layer`` (e.g. a cached ``resid_pre``); the
                embeddings and earlier blocks are skipped.
            stop_at_layer: return the residual stream ``[batch, pos, d_model]`` entering
                block ``stop_at_layer`` (``n_layers``: after the last block, before
                ``ln_final``) instead of the output.

        Non-finite values: ``x`` and, for a loss, ``targets`` at the positions
        ``loss_mask`` selects must be finite (``ValueError`` naming the first bad index;
        a masked-out position may hold NaN, as :func:`~vecinterp.masked_mse` allows).
        The weights are not scanned on each call, which would cost a pass over every
        parameter per forward: a model with a NaN weight runs and returns NaN.
        :func:`~vecinterp.save` refuses such a model, and the circuit analyses
        (:func:`~vecinterp.eigenvalue_scores`, :func:`~vecinterp.composition_scores`,
        the circuits of :mod:`vecinterp.analysis.circuits`) name the non-finite weight.

        Example:
            >>> import torch, vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
            >>> x, t = torch.randn(2, 6, 3), torch.randn(2, 6, 3)
            >>> t[:, -1] = float("nan")  # no target at the last position
            >>> mask = torch.tensor([True] * 5 + [False])
            >>> bool(model(x, targets=t, loss_mask=mask, return_type="loss").isfinite())
            True
        """
        if torch.compiler.is_compiling() and not idle(*self._hook_points()):
            # hooks run as written, in Python: the hooked call leaves the compiled graph
            # (dynamo guards on every point's hooks, so adding or removing one re-decides)
            return _run_eagerly(
                self, x, targets=targets, loss_mask=loss_mask, return_type=return_type,
                start_at_layer=start_at_layer, stop_at_layer=stop_at_layer,
            )  # fmt: skip
        if return_type not in RETURN_TYPES:
            reason = (
                " ('logits' is TransformerLens's name: this model's output is a vector read "
                "out by W_U, with no softmax over a vocabulary after it; ask for "
                "return_type='output')"
                if return_type == "logits"
                else ""
            )
            raise ValueError(
                f"return_type must be one of {RETURN_TYPES}, got {return_type!r}{reason}"
            )
        if targets is not None and return_type == "output":
            raise ValueError(
                "targets were given with return_type='output', which returns the output alone "
                "and would ignore them: pass return_type='loss' (the masked MSE against "
                "targets) or 'both' (output and loss), or leave targets out"
            )
        n = self.cfg.n_layers
        blocks = self.blocks
        if len(blocks) != n:
            raise ValueError(
                f"model.blocks holds {len(blocks)} blocks but cfg.n_layers is {n}: a block was "
                "added or removed (del, pop, insert, append) and the config does not say so; "
                "build a model of the config you want and copy the blocks' weights into it"
            )
        start = 0 if start_at_layer is None else _boundary("start_at_layer", start_at_layer, n)
        stop = n if stop_at_layer is None else _boundary("stop_at_layer", stop_at_layer, n)
        if stop < start:
            raise ValueError(f"stop_at_layer={stop_at_layer} comes before start_at_layer={start}")
        if start_at_layer is None:
            check_input(x, self.cfg, self.embed.W_E)
            batch, n_pos, _ = x.shape
            resid = self.hook_embed(self.embed(x))
            if self.pos_embed is not None:
                resid = resid + self.hook_pos_embed(self.pos_embed(batch, n_pos))
        else:
            resid = check_input(x, self.cfg, self.embed.W_E, axis="d_model")
        for i in range(start, stop):  # not blocks[start:stop], which builds a ModuleList
            resid = blocks[i](resid)
        if stop_at_layer is not None:
            return resid
        out = self.unembed(self.ln_final(resid))
        if return_type == "output":
            return out
        if targets is None:
            raise ValueError(f"return_type={return_type!r} needs targets [batch, pos, d_out]")
        check_like("targets", targets, tuple(out.shape), out)
        used = loss_positions(loss_mask, out.shape[:-1], out.device)
        check_finite("targets", targets, where=used)
        if torch.compiler.is_compiling():  # masked_mse reads its count back: not in a graph
            count = used.sum()
            torch._assert_async(count > 0, "loss_mask selects no position")
            loss = mse_at(out, targets.to(out.dtype), loss_mask, reduction="sum") / count
        else:
            loss = masked_mse(out, targets.to(out.dtype), loss_mask)
        return loss if return_type == "loss" else (out, loss)

    def _hook_points(self) -> list[HookPoint]:
        """Every hook point below the model (a module walk, no naming: traced by dynamo)."""
        return [m for m in self.modules() if isinstance(m, HookPoint)]

    # -- caching --------------------------------------------------------------------
    def run_with_cache(
        self,
        x: Float[torch.Tensor, "batch pos d_in"],
        names_filter: NameFilter = None,
        *,
        incl_bwd: bool = False,
        loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
        device: str | torch.device | None = None,
        fwd_hooks: Sequence[Any] = (),
        **forward_kwargs: Any,
    ) -> tuple[Any, "ActivationCache"]:
        """Run the model and keep the activations of the selected hook points.

        Args:
            x: input vectors ``[batch, pos, d_in]``.
            names_filter: ``None`` (every hook), a name, a list of names, or a predicate.
            incl_bwd: also cache the gradient of ``loss_fn(output)`` with respect to each
                selected activation, under ``name + "_grad"``. Uses ``torch.autograd.grad``,
                so parameters' ``.grad`` are left untouched.
            loss_fn: maps the output to a scalar; required with ``incl_bwd``.
            device: move cached tensors there (default: where they were computed).
            fwd_hooks: extra ``(name, fn)`` hooks active during this run; they run before
                the caching hooks, so the cache sees their edits.
            **forward_kwargs: passed to :meth:`forward` (``targets``, ``loss_mask``,
                ``return_type``, ``start_at_layer``, ``stop_at_layer``).

        Returns:
            ``(output, cache)``; activations in the cache are detached. Each entry is
            what flowed through that hook point in this run, after every hook there
            (``fwd_hooks``, hooks already attached). With ``names_filter=None`` and no
            ``incl_bwd``, a ``relu`` MLP's ``hook_post`` with no hook attached is not
            stored but recomputed bit for bit from ``hook_pre`` when first read
            (``relu`` has no weights and no rounding); the cache lists it all the same.
            A hook further on that writes into a tensor shared with a cached entry
            (``resid_post`` of block ``l`` is the tensor ``resid_pre`` of ``l + 1``
            receives) cannot change the entry: it is copied just before that hook runs.

        The cache also records, at no measurable cost, the model's weights as the run
        began (each tensor's identity and version counter, no copy: analyses that read
        the weights refuse once they changed), which hook points had a forward hook
        this thread called (``cache.hooked_points``) and where a hook replaced the
        activation or wrote into it (``cache.edited_points``; under
        ``torch.inference_mode``, which keeps no version counters, every hooked point
        counts as edited). Decompositions refuse where an edit breaks their sum (see
        :class:`~vecinterp.ActivationCache`).

        Example:
            >>> import torch, vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=5), seed=0)
            >>> def zero_head_0(result, hook):
            ...     result[:, :, 0] = 0.0
            >>> y, cache = model.run_with_cache(
            ...     torch.randn(4, 5, 3), fwd_hooks=[("blocks.0.attn.hook_result", zero_head_0)])
            >>> bool((cache["result", 0][:, :, 0] == 0).all())
            True
        """
        # The cache layer sits above the model layer (vecinterp.cache imports the model's
        # types, never the reverse at import time): this method is the model's one way up,
        # an import when it is called, of the module that builds the cache.
        from ..cache.recording import run_with_cache

        return run_with_cache(
            self,
            x,
            names_filter,
            incl_bwd=incl_bwd,
            loss_fn=loss_fn,
            device=device,
            fwd_hooks=fwd_hooks,
            **forward_kwargs,
        )

    # -- conveniences -----------------------------------------------------------------
    @property
    def W_E(self) -> Float[torch.Tensor, "d_in d_model"]:
        """The embedding ``[d_in, d_model]``."""
        return self.embed.W_E

    @property
    def W_U(self) -> Float[torch.Tensor, "d_model d_out"]:
        """The unembedding ``[d_model, d_out]``."""
        return self.unembed.W_U

    def _stack(self, name: str) -> torch.Tensor:
        return torch.stack([getattr(block.attn, name) for block in self.blocks])

    @property
    def W_Q(self) -> Float[torch.Tensor, "n_layers n_heads d_model d_head"]:
        """Every layer's ``W_Q`` stacked, ``[n_layers, n_heads, d_model, d_head]``."""
        return self._stack("W_Q")

    @property
    def W_K(self) -> Float[torch.Tensor, "n_layers n_heads d_model d_head"]:
        """Every layer's ``W_K`` stacked, ``[n_layers, n_heads, d_model, d_head]`` (under
        grouped-query attention each query head's copy of its group's ``_W_K``)."""
        return self._stack("W_K")

    @property
    def W_V(self) -> Float[torch.Tensor, "n_layers n_heads d_model d_head"]:
        """Every layer's ``W_V`` stacked, ``[n_layers, n_heads, d_model, d_head]`` (under
        grouped-query attention each query head's copy of its group's ``_W_V``)."""
        return self._stack("W_V")

    @property
    def W_O(self) -> Float[torch.Tensor, "n_layers n_heads d_head d_model"]:
        """Every layer's ``W_O`` stacked, ``[n_layers, n_heads, d_head, d_model]``."""
        return self._stack("W_O")

    # TransformerLens's other model-level stacks. Like W_Q..W_O they are new tensors
    # (torch.stack): gradients flow through them, but writing into one leaves the model as
    # it was; edit the per-block parameter (model.blocks[l].attn.b_Q) instead.

    @property
    def b_Q(self) -> Float[torch.Tensor, "n_layers n_heads d_head"]:
        """Every layer's query bias stacked, ``[n_layers, n_heads, d_head]``: ``b_Q[l]``
        holds the values of ``blocks[l].attn.b_Q`` (a copy, like every stacked weight).

        Example:
            >>> import torch, vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=3, n_ctx=6), seed=0)
            >>> model.b_Q.shape, torch.equal(model.b_Q[1], model.blocks[1].attn.b_Q)
            (torch.Size([3, 2, 4]), True)
        """
        return self._stack("b_Q")

    @property
    def b_K(self) -> Float[torch.Tensor, "n_layers n_heads d_head"]:
        """Every layer's key bias stacked, ``[n_layers, n_heads, d_head]``.

        Example:
            >>> import vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=3, n_ctx=6), seed=0)
            >>> model.b_K.shape
            torch.Size([3, 2, 4])
        """
        return self._stack("b_K")

    @property
    def b_V(self) -> Float[torch.Tensor, "n_layers n_heads d_head"]:
        """Every layer's value bias stacked, ``[n_layers, n_heads, d_head]``.

        Example:
            >>> import vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=3, n_ctx=6), seed=0)
            >>> model.b_V.shape
            torch.Size([3, 2, 4])
        """
        return self._stack("b_V")

    @property
    def b_O(self) -> Float[torch.Tensor, "n_layers d_model"]:
        """Every layer's attention output bias stacked, ``[n_layers, d_model]`` (one per
        layer, shared by its heads).

        Example:
            >>> import vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=3, n_ctx=6), seed=0)
            >>> model.b_O.shape
            torch.Size([3, 8])
        """
        return self._stack("b_O")

    def _mlp_stack(self, name: str) -> torch.Tensor:
        if self.cfg.attn_only:
            raise AttributeError(
                f"{name}: this model is attention-only (cfg.attn_only=True), its blocks have "
                "no MLP and so no W_in, b_in, W_out or b_out"
            )
        return torch.stack([getattr(block.mlp, name) for block in self.blocks])

    @property
    def W_in(self) -> Float[torch.Tensor, "n_layers d_model d_mlp"]:
        """Every layer's MLP input weight stacked, ``[n_layers, d_model, d_mlp]``.

        ``AttributeError`` (saying why) on an attention-only model.

        Example:
            >>> import torch, vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=3, d_mlp=16, n_ctx=6))
            >>> model.W_in.shape, torch.equal(model.W_in[2], model.blocks[2].mlp.W_in)
            (torch.Size([3, 8, 16]), True)
        """
        return self._mlp_stack("W_in")

    @property
    def b_in(self) -> Float[torch.Tensor, "n_layers d_mlp"]:
        """Every layer's MLP input bias stacked, ``[n_layers, d_mlp]`` (``AttributeError`` on
        an attention-only model).

        Example:
            >>> import vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=3, d_mlp=16, n_ctx=6))
            >>> model.b_in.shape
            torch.Size([3, 16])
        """
        return self._mlp_stack("b_in")

    @property
    def W_gate(self) -> Float[torch.Tensor, "n_layers d_model d_mlp"]:
        """Every layer's gate weight stacked, ``[n_layers, d_model, d_mlp]``
        (``AttributeError`` unless ``cfg.gated_mlp``).

        Example:
            >>> import vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=3, d_mlp=16, n_ctx=6,
            ...     gated_mlp=True))
            >>> model.W_gate.shape
            torch.Size([3, 8, 16])
        """
        return self._gate_stack("W_gate")

    @property
    def b_gate(self) -> Float[torch.Tensor, "n_layers d_mlp"]:
        """Every layer's gate bias stacked, ``[n_layers, d_mlp]`` (``AttributeError``
        unless ``cfg.gated_mlp``)."""
        return self._gate_stack("b_gate")

    def _gate_stack(self, name: str) -> torch.Tensor:
        if not self.cfg.gated_mlp:
            raise AttributeError(
                f"{name}: this model's MLPs are not gated (cfg.gated_mlp=False), so they "
                "have no W_gate or b_gate"
            )
        return self._mlp_stack(name)

    @property
    def W_out(self) -> Float[torch.Tensor, "n_layers d_mlp d_model"]:
        """Every layer's MLP output weight stacked, ``[n_layers, d_mlp, d_model]``
        (``AttributeError`` on an attention-only model).

        Example:
            >>> import vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=3, d_mlp=16, n_ctx=6))
            >>> model.W_out.shape
            torch.Size([3, 16, 8])
        """
        return self._mlp_stack("W_out")

    @property
    def b_out(self) -> Float[torch.Tensor, "n_layers d_model"]:
        """Every layer's MLP output bias stacked, ``[n_layers, d_model]`` (``AttributeError``
        on an attention-only model).

        Example:
            >>> import vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=3, d_mlp=16, n_ctx=6))
            >>> model.b_out.shape
            torch.Size([3, 8])
        """
        return self._mlp_stack("b_out")

    @property
    def W_pos(self) -> Float[torch.Tensor, "n_ctx d_model"]:
        """The additive positional embedding ``[n_ctx, d_model]``: the trained parameter
        ``pos_embed.W_pos`` (``positional="learned"``) or the fixed sinusoidal table
        (``"sinusoidal"``, a buffer: not trained). Not a copy.

        ``AttributeError`` (saying why) with ``positional="rotary"`` or ``"none"``, which
        add nothing to the residual stream.

        Example:
            >>> import vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6), seed=0)
            >>> model.W_pos.shape, model.W_pos is model.pos_embed.W_pos
            (torch.Size([6, 8]), True)
        """
        if self.pos_embed is None:
            rotary = self.cfg.positional == "rotary"
            raise AttributeError(
                f"W_pos: this model has positional={self.cfg.positional!r}, which adds no "
                "positional embedding to the residual stream"
                + (" (queries and keys are rotated instead)" if rotary else "")
            )
        W_pos: torch.Tensor = self.pos_embed.W_pos
        return W_pos

    @property
    def b_U(self) -> Float[torch.Tensor, " d_out"]:
        """The unembedding bias ``[d_out]`` (``unembed.b_U``, not a copy).

        Example:
            >>> import vecinterp as vi
            >>> model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(
            ...     d_in=3, d_out=5, d_model=8, d_head=4, n_heads=2, n_layers=2, n_ctx=6))
            >>> model.b_U.shape, model.b_U is model.unembed.b_U
            (torch.Size([5]), True)
        """
        return self.unembed.b_U

    def __getattr__(self, name: str) -> Any:
        # nn.Module answers a property's AttributeError with its own "has no attribute";
        # give the property's message (why W_pos or W_in is absent) instead, and for
        # TransformerLens's methods that have another form here, what to use
        try:
            return super().__getattr__(name)
        except AttributeError:
            prop = getattr(type(self), name, None)
            if isinstance(prop, property) and prop.fget is not None:
                return prop.fget(self)
            if name in _TL_HABITS:
                raise AttributeError(
                    f"{type(self).__name__} has no attribute {name!r} (TransformerLens's "
                    f"HookedTransformer.{name}): {_TL_HABITS[name]}"
                ) from None
            raise

    @property
    def OV(self) -> FactoredMatrix:
        """Every head's OV circuit ``W_V W_O`` as a :class:`~vecinterp.FactoredMatrix`
        ``[n_layers, n_heads, d_model, d_model]`` (row vectors: ``resid @ OV``). Value
        biases are not included: fold them first (:func:`~vecinterp.fold_value_biases`)."""
        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def QK(self) -> FactoredMatrix:
        """Every head's QK circuit ``W_Q W_K^T`` as a :class:`~vecinterp.FactoredMatrix`
        ``[n_layers, n_heads, d_model, d_model]``: ``score = q_resid QK k_resid^T / sqrt(d_head)``
        up to the query and key biases (not included) and rotary rotation."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-1, -2))

    def layer_index(self, layer: int) -> int:
        """``layer`` as a non-negative index (negative counts from the end); checked."""
        n = self.cfg.n_layers
        if isinstance(layer, bool) or not isinstance(layer, int) or not -n <= layer < n:
            raise ValueError(f"layer must be an int in [{-n}, {n - 1}], got {layer!r}")
        return layer % n

    def __repr__(self) -> str:
        c = self.cfg
        n_params = sum(p.numel() for p in self.parameters())
        return (
            f"HookedVectorTransformer(d_in={c.d_in}, d_out={c.d_out}, d_model={c.d_model}, "
            f"n_layers={c.n_layers}, n_heads={c.n_heads}, d_head={c.d_head}, "
            f"d_mlp={None if c.attn_only else c.d_mlp}, normalization={c.normalization!r}, "
            f"positional={c.positional!r}, params={n_params:,})"
        )


# torch.compiler.disable, but importing dynamo at its first call rather than with
# vecinterp (torch.compiler.disable imports it at once: seconds on every import)
@torch._disable_dynamo
def _run_eagerly(model: HookedVectorTransformer, x: torch.Tensor, **kwargs: Any) -> Any:
    """``model.forward`` outside the compiled graph, for a compiled model called with hooks
    attached; warns that hooked calls are not compiled (once, under Python's default
    warning filter, which shows a warning once per place that issues it)."""
    warnings.warn(
        "a compiled HookedVectorTransformer was called with hooks attached: hooked calls "
        "run eagerly (not compiled), so every hook runs as written; calls without hooks "
        "use the compiled graph",
        CompiledHooksWarning,
        stacklevel=1,
    )
    return model.forward(x, **kwargs)


# What torch.compile(model, fullgraph=True) says when a hooked call cannot leave the graph:
# dynamo reads a skipped function's `_torchdynamo_disable_msg` into its error (which
# otherwise tells the user to file an issue with PyTorch)
_run_eagerly._torchdynamo_disable = True  # type: ignore[attr-defined]
_run_eagerly._torchdynamo_disable_msg = (  # type: ignore[attr-defined]
    "a HookedVectorTransformer compiled with fullgraph=True was called with hooks attached: "
    "remove the hooks, call the model itself (or compiled.run_with_hooks), or compile "
    "without fullgraph=True (hooked calls then run eagerly)"
)


class CompiledHooksWarning(UserWarning):
    """Warned (once, under Python's default warning filter) when a ``torch.compile``-d
    :class:`HookedVectorTransformer` is called with hooks attached (``add_hook``, a
    ``hooks()`` context, ``run_with_hooks``, ``run_with_cache``, PyTorch module hooks on a
    hook point): such calls run eagerly, outside the compiled graph, so every hook runs
    as written. Calls without hooks use the compiled graph. See :doc:`/howto_compile`.

    Example:
        >>> import warnings, vecinterp as vi
        >>> warnings.simplefilter("ignore", vi.CompiledHooksWarning)  # silence it
    """


def _boundary(name: str, value: object, n_layers: int) -> int:
    """A block boundary in ``[-n_layers, n_layers]`` as an index in ``[0, n_layers]``;
    negative values count from the end as in a slice (``-1``: before the last block)."""
    if isinstance(value, bool) or not isinstance(value, int) or not -n_layers <= value <= n_layers:
        raise ValueError(f"{name} must be an int in [-{n_layers}, {n_layers}], got {value!r}")
    return value + n_layers if value < 0 else value
