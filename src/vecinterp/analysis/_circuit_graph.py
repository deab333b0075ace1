"""The edge graph of circuit discovery and the forward pass that patches edges, batched.

Nodes. *Senders* write into the residual stream: the input embedding ``"embed"``
(``hook_embed``), each head ``(L, h)`` (its ``hook_result``) and each MLP ``("mlp", L)``
(``hook_mlp_out``). *Receivers* read it: each head's query, key and value input
``(L, h, "q"|"k"|"v")``, each MLP's input ``("mlp", L)`` and the output ``"output"`` (the
final residual stream that ``ln_final`` and ``W_U`` read). An *edge* joins a sender to a
receiver after it (the order of path patching's ``_Node``): a head reads the layers before
its own, an MLP its own layer's heads too, the output everything.

The residual stream at a receiver ``r`` is the sum of its senders' outputs plus a
constant ``c_r`` (the positional embedding and the attention biases ``b_O`` before ``r``,
the same in every run)::

    resid_r = c_r + sum_{s before r} out_s

Removing a set of edges into ``r`` replaces those senders' outputs, *at r only*, by their
values in the corrupted (or mean) run::

    in_r = resid_r - sum_{s: (s, r) removed} (out_s - corr_s)

:func:`forward` computes the model layer by layer this way, from the model's own weights
and modules: each head's q, k, v from its own ``in_r`` (through ``ln1``), each MLP from its
own, the output from its own, and every sender's output from those inputs. With no edge
removed no correction is subtracted, and the pass is the model's forward to rounding
(float64 tests: 1e-12). Trials (different sets of removed edges) are batched: the input
is tiled once per trial and the corrections are one matrix product per receiver group.
"""

from dataclasses import dataclass
from typing import cast

import torch

from ..model import HookedVectorTransformer
from ..model.components import TransformerBlock
from .path_patching import _Node

QKV = ("q", "k", "v")


@dataclass(frozen=True)
class Group:
    """Receivers computed together in a pass: the q/k/v inputs of one layer's heads
    (``"attn"``, rows in channel-major order ``(c, h)``), one MLP (``"mlp"``) or the output.
    ``n_senders``: how many senders (the first ones) come before these receivers."""

    kind: str
    layer: int
    rows: slice
    n_senders: int


class EdgeGraph:
    """Senders, receivers and edges of a model config, and where each lives in the masks.

    A set of removed edges is a boolean ``[n_receivers, n_senders]`` matrix (True:
    removed), only ``valid`` entries meaningful. Senders are in forward order (embed, then
    per layer its heads and its MLP); receivers too (per layer the ``3 * n_heads`` q/k/v
    inputs, channel-major, then the MLP; the output last).
    """

    def __init__(self, model: HookedVectorTransformer):
        cfg = model.cfg
        self.n_layers, self.n_heads, self.has_mlps = cfg.n_layers, cfg.n_heads, not cfg.attn_only
        self.senders: list[_Node] = [_Node("embed", -1)]
        self.receivers: list[_Node] = []
        self.groups: list[Group] = []
        for layer in range(cfg.n_layers):
            start = len(self.receivers)
            self.receivers += [_Node("head", layer, h, c) for c in QKV for h in range(cfg.n_heads)]
            rows = slice(start, len(self.receivers))
            self.groups.append(Group("attn", layer, rows, len(self.senders)))
            self.senders += [_Node("head", layer, h) for h in range(cfg.n_heads)]
            if self.has_mlps:
                self.receivers.append(_Node("mlp", layer))
                rows = slice(len(self.receivers) - 1, len(self.receivers))
                self.groups.append(Group("mlp", layer, rows, len(self.senders)))
                self.senders.append(_Node("mlp", layer))
        self.receivers.append(_Node("output", cfg.n_layers))
        rows = slice(len(self.receivers) - 1, len(self.receivers))
        self.groups.append(Group("output", cfg.n_layers, rows, len(self.senders)))
        self.group_of = [g for g, group in enumerate(self.groups) for _ in range(*_span(group))]
        self.n_before = [self.groups[g].n_senders for g in self.group_of]
        self.valid = torch.zeros(len(self.receivers), len(self.senders), dtype=torch.bool)
        for r, n in enumerate(self.n_before):
            self.valid[r, :n] = True
        self.sender_index = {node: i for i, node in enumerate(self.senders)}
        self.receiver_index = {node: i for i, node in enumerate(self.receivers)}
        # each sender's own inputs: a head's q, k, v receivers, an MLP's one; none for embed
        self.inputs_of: list[list[int]] = [[] for _ in self.senders]
        for r, node in enumerate(self.receivers):
            s = self.sender_of(node)
            if s is not None:
                self.inputs_of[s].append(r)

    @property
    def n_edges(self) -> int:
        return int(self.valid.sum())

    def sender_of(self, receiver: _Node) -> int | None:
        """The sender index of the node a receiver belongs to (``None`` for the output)."""
        if receiver.kind == "output":
            return None
        return self.sender_index[_Node(receiver.kind, receiver.layer, receiver.head)]


def _span(group: Group) -> tuple[int, int]:
    return group.rows.start, group.rows.stop


@dataclass
class CleanState:
    """A pass with no edge removed, recorded: the residual stream entering each group
    (``[batch, pos, d_model]``), every sender's output (``[n_senders, batch, pos,
    d_model]``) and the output."""

    resid: list[torch.Tensor]
    outs: torch.Tensor
    output: torch.Tensor


def run_clean(model: HookedVectorTransformer, graph: EdgeGraph, x: torch.Tensor) -> CleanState:
    """The pass of ``x`` with every edge kept, recording what later passes start from."""
    embed = model.embed(x)
    resid = embed
    if model.pos_embed is not None:
        resid = resid + model.pos_embed(x.shape[0], x.shape[1])
    record: tuple[list[torch.Tensor], list[torch.Tensor]] = ([], [])
    out = forward(model, graph, 0, resid, embed[None], record=record)
    outs = torch.stack([embed] + [s[0] for s in record[1]])
    return CleanState([r[0] for r in record[0]], outs, out[0])


def forward(
    model: HookedVectorTransformer,
    graph: EdgeGraph,
    start: int,
    resid: torch.Tensor,
    prefix: torch.Tensor,
    corr: torch.Tensor | None = None,
    removed: torch.Tensor | None = None,
    record: tuple[list[torch.Tensor], list[torch.Tensor]] | None = None,
) -> torch.Tensor:
    """The model from receiver group ``start`` on, with the edges ``removed`` patched.

    Args:
        start: the first group computed; the passes of ACDC start at the receiver tried.
        resid: the residual stream entering group ``start``, ``[batch, pos, d_model]``
            (shared by the trials) or ``[trials, batch, pos, d_model]``.
        prefix: the outputs of the senders before group ``start``, ``[n_prefix, batch, pos,
            d_model]`` (shared by the trials).
        corr: every sender's corrupted (or mean) output ``[n_senders, batch, pos,
            d_model]``; needed when ``removed`` removes anything.
        removed: ``[trials, n_receivers, n_senders]`` booleans on the CPU (only the
            weights of the corrections go to the model's device); ``None``: one trial,
            nothing removed.
        record: two lists, or ``None``; the residual stream entering each group is
            appended to the first, each sender's output computed in the pass (``[trials,
            batch, pos, d_model]``, in sender order) to the second.

    Returns:
        The output ``[trials, batch, pos, d_out]``.
    """
    n_trials = 1 if removed is None else removed.shape[0]
    batch, n_pos, d_model = resid.shape[-3:]
    resid = resid.expand(n_trials, batch, n_pos, d_model)
    n_prefix = prefix.shape[0]
    d_prefix = None if corr is None else (prefix - corr[:n_prefix]).reshape(n_prefix, -1)
    # A sender with no edge kept (in any trial) reaches nothing: every reader gets its
    # corrupted output. It is not computed; its corrupted output stands in the residual
    # stream, so its removed edges subtract nothing (the same sum, without the term that
    # would cancel).
    alive = None if removed is None else (graph.valid & ~removed).any(dim=1).any(dim=0)
    new: list[torch.Tensor] = []  # senders computed in this pass, [trials, batch, pos, d_model]
    out = resid
    for group in graph.groups[start:]:
        if record is not None:
            record[0].append(resid)
        first = group.n_senders  # this group's first sender (a head or the MLP)
        if group.kind == "attn":
            heads = [h for h in range(graph.n_heads) if alive is None or bool(alive[first + h])]
            rows = [c * graph.n_heads + h for c in range(len(QKV)) for h in heads]
            inputs = _inputs(resid, group, rows, removed, d_prefix, new, corr, alive, n_prefix)
            dead = None if corr is None else corr[first : first + graph.n_heads]
            results, attn_out = _attention(model, group.layer, inputs, n_trials, heads, dead)
            new += list(results)
            resid = resid + attn_out
        elif group.kind == "mlp":
            if alive is not None and not bool(alive[first]):
                assert corr is not None
                mlp_out = corr[first].expand(n_trials, batch, n_pos, d_model)
            else:
                block = cast(TransformerBlock, model.blocks[group.layer])
                inputs = _inputs(resid, group, [0], removed, d_prefix, new, corr, alive, n_prefix)
                flat = inputs[:, 0].reshape(n_trials * batch, n_pos, d_model)
                mlp_out = block.mlp(block.ln2(flat)).view(n_trials, batch, n_pos, d_model)
            new.append(mlp_out)
            resid = resid + mlp_out
        else:
            inputs = _inputs(resid, group, [0], removed, d_prefix, new, corr, alive, n_prefix)
            flat = inputs[:, 0].reshape(n_trials * batch, n_pos, d_model)
            out = model.unembed(model.ln_final(flat)).view(n_trials, batch, n_pos, -1)
    if record is not None:
        record[1].extend(new)
    return out


def _inputs(
    resid: torch.Tensor,
    group: Group,
    rows: list[int],
    removed: torch.Tensor | None,
    d_prefix: torch.Tensor | None,
    new: list[torch.Tensor],
    corr: torch.Tensor | None,
    alive: torch.Tensor | None,
    n_prefix: int,
) -> torch.Tensor:
    """The input of the group's receivers ``rows`` (indices within the group),
    ``[trials, len(rows), batch, pos, d_model]``, or ``[trials, 1, ...]`` (broadcast) when
    nothing is removed: ``resid`` minus the removed senders' ``out - corr``."""
    shape = resid.shape
    if removed is None:
        return resid[:, None]
    rem = removed[:, group.rows, : group.n_senders][:, rows]
    if not bool(rem.any()):
        return resid[:, None]
    assert corr is not None and d_prefix is not None and alive is not None
    n_trials, n_rows = rem.shape[:2]
    weights = rem.to(device=resid.device, dtype=resid.dtype)
    patch = torch.zeros(n_trials, n_rows, d_prefix.shape[1], dtype=resid.dtype, device=resid.device)
    if bool(rem[..., :n_prefix].any()):
        patch += weights[..., :n_prefix] @ d_prefix
    # the senders computed in this pass; the dead ones hold their corrupted output already
    live = [i for i in range(len(new)) if bool(alive[n_prefix + i])]
    if live and bool(rem[..., [n_prefix + i for i in live]].any()):
        diffs = torch.stack([new[i] - corr[n_prefix + i] for i in live], dim=1)
        columns = weights[..., [n_prefix + i for i in live]]
        patch += torch.bmm(columns, diffs.reshape(n_trials, len(live), -1))
    return resid[:, None] - patch.view(n_trials, n_rows, *shape[1:])


def _attention(
    model: HookedVectorTransformer,
    layer: int,
    inputs: torch.Tensor,
    n_trials: int,
    heads: list[int],
    dead: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's heads, each q/k/v from its own input; the model's attention arithmetic
    (``components/attention.py``) with the batch axis ``trials * batch``.

    Only ``heads`` are computed (``inputs`` holds their rows, channel-major, or one row for
    all); every other head's result is its corrupted output from ``dead`` ``[n_heads,
    batch, pos, d_model]``. Returns every head's result ``[n_heads, trials, batch, pos,
    d_model]`` and the layer's output ``sum_h result_h + b_O`` ``[trials, batch, pos,
    d_model]``."""
    block = cast(TransformerBlock, model.blocks[layer])
    attn = block.attn
    _, n_in, batch, n_pos, d_model = inputs.shape
    rows = n_trials * batch * n_pos
    h = len(heads)
    if h == attn.n_heads:
        result = _heads(block, inputs, n_trials, slice(None))
    else:
        assert dead is not None
        result = dead[:, None].expand(-1, n_trials, -1, -1, -1).reshape(attn.n_heads, rows, -1)
        if h:
            result = result.clone()
            result[heads] = _heads(block, inputs, n_trials, heads)
    attn_out = (result.sum(dim=0) + attn.b_O).view(n_trials, batch, n_pos, d_model)
    return result.view(attn.n_heads, n_trials, batch, n_pos, d_model), attn_out


def _heads(
    block: TransformerBlock, inputs: torch.Tensor, n_trials: int, heads: slice | list[int]
) -> torch.Tensor:
    """The results ``[len(heads), trials * batch * pos, d_model]`` of ``heads``, from their
    inputs (``[trials, 3 * len(heads) or 1, batch, pos, d_model]``)."""
    attn = block.attn
    _, n_in, batch, n_pos, d_model = inputs.shape
    rows = n_trials * batch * n_pos
    normed = block.ln1(inputs.reshape(n_trials * n_in * batch, n_pos, d_model))
    normed = normed.view(n_trials, n_in, batch, n_pos, d_model)
    weights = ((attn.W_Q, attn.b_Q), (attn.W_K, attn.b_K), (attn.W_V, attn.b_V))
    qkv = []
    for c, (w_all, b_all) in enumerate(weights):
        w, b = w_all[heads], b_all[heads]
        h = w.shape[0]
        if n_in == 1:  # one input for every head, as in the model: no copy per head
            x = normed[:, 0].reshape(1, rows, d_model).expand(h, rows, d_model)
        else:
            x = normed[:, c * h : (c + 1) * h].transpose(0, 1).reshape(h, rows, d_model)
        qkv.append(torch.baddbmm(b.unsqueeze(1), x, w).view(h, n_trials * batch, n_pos, -1))
    q, k, v = qkv
    h = v.shape[0]
    if attn.rotary is not None:  # [batch, pos, n_heads, d_head] views, as the hooks see
        q = attn.rotary(q.permute(1, 2, 0, 3)).permute(2, 0, 1, 3)
        k = attn.rotary(k.permute(1, 2, 0, 3)).permute(2, 0, 1, 3)
    d_head = v.shape[-1]
    q, k, v = (t.reshape(h * n_trials * batch, n_pos, d_head) for t in (q, k, v))
    if attn.causal:
        mask = attn.mask_bias[:n_pos, :n_pos]
        scores = torch.baddbmm(mask, q, k.transpose(1, 2), alpha=attn.scale)
    else:
        scores = torch.bmm(q, k.transpose(1, 2)).mul_(attn.scale)
    z = torch.bmm(scores.softmax(dim=-1), v).view(h, rows, d_head)
    return torch.bmm(z, attn.W_O[heads])  # [heads, rows, d_model]
