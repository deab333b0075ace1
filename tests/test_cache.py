"""ActivationCache: hook names and shapes, short keys, and the residual-stream
decompositions (each sums exactly to what the model computed)."""

import pytest
import torch
from einops import einsum

import vecinterp as vi
from helpers import random_input, random_model, tiny_cfg

EXACT = 1e-12  # float64: the decompositions are sums of the very tensors the model added

CFGS = {
    "LN-learned": tiny_cfg(),
    "RMS-rotary-gelu": tiny_cfg(normalization="RMS", positional="rotary", act_fn="gelu"),
    "none-none-noncausal": tiny_cfg(normalization=None, positional="none", causal=False),
    "LNPre-sinusoidal-attn_only-3L": tiny_cfg(
        normalization="LNPre", positional="sinusoidal", attn_only=True, n_layers=3
    ),
    "RMSPre-learned-attn_only-bias": tiny_cfg(
        normalization="RMSPre", attn_only=True, embed_bias=True, n_heads=3
    ),
    "LN-rotary-1L-bias": tiny_cfg(positional="rotary", n_layers=1, embed_bias=True),
}
NORM_CFGS = {
    str(norm): tiny_cfg(normalization=norm, embed_bias=True, n_layers=3)
    for norm in ["LN", "LNPre", "RMS", "RMSPre", None]
}


def run(cfg, batch=2, n_pos=5, names_filter=None, seed=0):
    model = random_model(cfg, seed=seed)
    x = random_input(cfg, batch=batch, n_pos=n_pos, seed=seed)
    y, cache = model.run_with_cache(x, names_filter=names_filter)
    return model, x, y, cache


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).detach().abs().max())


def expected_shapes(cfg, b: int, p: int) -> dict[str, tuple[int, ...]]:
    d, h, dh = cfg.d_model, cfg.n_heads, cfg.d_head
    resid = (b, p, d)
    shapes = {"hook_embed": resid}
    if cfg.positional in ("learned", "sinusoidal"):
        shapes["hook_pos_embed"] = resid
    norms = ["ln1"] if cfg.attn_only else ["ln1", "ln2"]
    for ell in range(cfg.n_layers):
        blk = f"blocks.{ell}"
        names = ["hook_resid_pre", "hook_attn_out", "hook_resid_post"]
        if not cfg.attn_only:
            names += ["hook_resid_mid", "hook_mlp_out"]
            shapes[f"{blk}.mlp.hook_pre"] = (b, p, cfg.d_mlp)
            shapes[f"{blk}.mlp.hook_post"] = (b, p, cfg.d_mlp)
        shapes.update({f"{blk}.{n}": resid for n in names})
        heads = ["hook_q", "hook_k", "hook_v", "hook_z"]
        if cfg.positional == "rotary":
            heads += ["hook_rot_q", "hook_rot_k"]
        shapes.update({f"{blk}.attn.{n}": (b, p, h, dh) for n in heads})
        shapes[f"{blk}.attn.hook_attn_scores"] = (b, h, p, p)
        shapes[f"{blk}.attn.hook_pattern"] = (b, h, p, p)
        shapes[f"{blk}.attn.hook_result"] = (b, p, h, d)
        if cfg.normalization is not None:
            for ln in norms:
                shapes[f"{blk}.{ln}.hook_scale"] = (b, p, 1)
                shapes[f"{blk}.{ln}.hook_normalized"] = resid
    if cfg.normalization is not None:
        shapes["ln_final.hook_scale"] = (b, p, 1)
        shapes["ln_final.hook_normalized"] = resid
    shapes["unembed.hook_out"] = (b, p, cfg.d_out)
    return shapes


# ---------------------------------------------------------------- names and shapes


def is_result(name: str) -> bool:
    return name.endswith(".attn.hook_result")


def is_recomputed(cfg, name: str) -> bool:
    """Not stored by run_with_cache(names_filter=None) but recomputed bit for bit: a relu
    MLP's hook_post (relu(hook_pre))."""
    return cfg.act_fn == "relu" and name.endswith(".mlp.hook_post")


@pytest.mark.parametrize("cfg", CFGS.values(), ids=CFGS.keys())
def test_every_hook_cached_with_documented_shape(cfg):
    model, _, y, cache = run(cfg, batch=2, n_pos=5)
    expected = expected_shapes(cfg, 2, 5)
    assert set(expected) == set(model.hook_dict)
    # every hook is listed; a relu MLP's hook_post is recomputed on demand
    assert set(cache) == set(expected)
    assert set(cache.cache_dict) == {n for n in expected if not is_recomputed(cfg, n)}
    for name, shape in expected.items():
        assert name in cache
        assert tuple(cache[name].shape) == shape, name
        assert cache[name].dtype == torch.float64
        assert not cache[name].requires_grad
    assert torch.equal(cache["unembed.hook_out"], y)


@pytest.mark.parametrize("cfg", CFGS.values(), ids=CFGS.keys())
def test_every_hook_cached_when_asked_for_all(cfg):
    model, _, y, cache = run(cfg, batch=2, n_pos=5, names_filter=lambda name: True)
    expected = expected_shapes(cfg, 2, 5)
    assert set(cache) == set(expected)
    assert len(cache) == len(model.hook_dict)
    for name, shape in expected.items():
        assert tuple(cache[name].shape) == shape, name
    _, _, y_default, _ = run(cfg, batch=2, n_pos=5)
    assert torch.equal(y, y_default)  # reading hook_result changes no bit of the output


@pytest.mark.parametrize("cfg", CFGS.values(), ids=CFGS.keys())
def test_cached_activations_are_consistent(cfg):
    model, x, _, cache = run(cfg)
    n = cfg.n_layers
    for ell in range(n):
        pattern = cache["pattern", ell]
        torch.testing.assert_close(
            pattern.sum(-1), torch.ones(pattern.shape[:-1], dtype=pattern.dtype)
        )
        if cfg.causal:
            above = torch.ones(5, 5, dtype=torch.bool).triu(1)
            assert bool((pattern[..., above] == 0).all())
        heads = cache["result", ell].sum(-2) + model.blocks[ell].attn.b_O
        assert max_diff(heads, cache["attn_out", ell]) <= EXACT
        if ell < n - 1:
            assert torch.equal(cache["resid_post", ell], cache["resid_pre", ell + 1])
    first = cache["embed"] + (cache["pos_embed"] if "pos_embed" in cache else 0)
    assert torch.equal(cache["resid_pre", 0], first)
    assert torch.equal(cache["embed"], model.embed(x))


# ---------------------------------------------------------------- short keys


@pytest.fixture
def ln_cache():
    return run(tiny_cfg(n_layers=3))


def test_short_keys_resolve_to_the_same_tensor(ln_cache):
    _, _, y, cache = ln_cache
    same = {
        ("pattern", 0): "blocks.0.attn.hook_pattern",
        ("attn", 1): "blocks.1.attn.hook_pattern",
        ("attn_scores", 2): "blocks.2.attn.hook_attn_scores",
        ("scores", 0): "blocks.0.attn.hook_attn_scores",
        ("q", 0): "blocks.0.attn.hook_q",
        ("k", 1): "blocks.1.attn.hook_k",
        ("v", 2): "blocks.2.attn.hook_v",
        ("z", 0): "blocks.0.attn.hook_z",
        ("result", 1): "blocks.1.attn.hook_result",
        ("resid_pre", 0): "blocks.0.hook_resid_pre",
        ("resid_mid", 1): "blocks.1.hook_resid_mid",
        ("resid_post", 2): "blocks.2.hook_resid_post",
        ("attn_out", 0): "blocks.0.hook_attn_out",
        ("mlp_out", 1): "blocks.1.hook_mlp_out",
        ("pre", 2): "blocks.2.mlp.hook_pre",
        ("post", 0): "blocks.0.mlp.hook_post",
        ("resid_post", -1): "blocks.2.hook_resid_post",
        ("pattern", -3): "blocks.0.attn.hook_pattern",
        ("z", -2): "blocks.1.attn.hook_z",
        ("scale", 1): "blocks.1.ln1.hook_scale",
        ("scale", 1, "ln2"): "blocks.1.ln2.hook_scale",
        ("scale", -1, "ln2"): "blocks.2.ln2.hook_scale",
        ("normalized", 0, "ln2"): "blocks.0.ln2.hook_normalized",
        ("normalized", 2): "blocks.2.ln1.hook_normalized",
        "embed": "hook_embed",
        "pos_embed": "hook_pos_embed",
        "scale": "ln_final.hook_scale",
        ("scale",): "ln_final.hook_scale",
        "normalized": "ln_final.hook_normalized",
        "out": "unembed.hook_out",
    }
    for short, full in same.items():
        assert cache[short] is cache[full], short
        assert short in cache and full in cache
    assert cache["out"] is cache["unembed.hook_out"]
    assert torch.equal(cache["out"], y)


@pytest.mark.parametrize(
    ("args", "full"),
    [
        (("pattern", 0), "blocks.0.attn.hook_pattern"),
        (("attn_scores", 3), "blocks.3.attn.hook_attn_scores"),
        (("resid_pre", 2), "blocks.2.hook_resid_pre"),
        (("mlp_out", 0), "blocks.0.hook_mlp_out"),
        (("post", 1), "blocks.1.mlp.hook_post"),
        (("q", 4), "blocks.4.attn.hook_q"),
        (("rot_k", 0), "blocks.0.attn.hook_rot_k"),
        (("scale", 1, "ln2"), "blocks.1.ln2.hook_scale"),
        (("scale", 1), "blocks.1.ln1.hook_scale"),
        (("normalized", 0, "ln1"), "blocks.0.ln1.hook_normalized"),
        (("embed",), "hook_embed"),
        (("pos_embed",), "hook_pos_embed"),
        (("scale",), "ln_final.hook_scale"),
        (("normalized",), "ln_final.hook_normalized"),
        (("blocks.0.hook_resid_pre",), "blocks.0.hook_resid_pre"),
        (("hook_embed",), "hook_embed"),
    ],
)
def test_act_name(args, full):
    assert vi.act_name(*args) == full


def test_act_name_errors():
    with pytest.raises(KeyError, match="needs a layer"):
        vi.act_name("pattern")
    with pytest.raises(KeyError, match="unknown short activation name 'patern'"):
        vi.act_name("patern", 0)


def test_mapping_protocol(ln_cache):
    model, _, _, cache = ln_cache
    assert len(cache) == len(model.hook_dict) == len(list(cache))
    assert list(iter(cache)) == list(cache.keys()) == list(model.hook_dict)  # hook order
    assert ("result", 0) in cache
    assert ("post", 0) in cache  # recomputed from hook_pre on first access
    for name, value in cache.items():
        assert cache[name] is value
    assert cache.get("blocks.0.attn.hook_patern") is None
    assert ("pattern", 0) in cache
    assert ("pattern", -1) in cache
    assert ("pattern", 3) not in cache  # no block 3
    assert ("pattern", -4) not in cache
    assert ("rot_q", 0) not in cache  # not a rotary model
    assert "blocks.0.attn.hook_patern" not in cache
    assert 0 not in cache
    assert ("nonsense", 0) not in cache


def test_missing_key_lists_close_matches(ln_cache):
    _, _, _, cache = ln_cache
    with pytest.raises(KeyError, match=r"close matches.*blocks\.0\.attn\.hook_pattern"):
        cache["blocks.0.attn.hook_patern"]
    with pytest.raises(KeyError, match=r"blocks\.1\.attn\.hook_rot_q"):
        cache["rot_q", 1]
    with pytest.raises(KeyError):
        cache[0]
    with pytest.raises(ValueError, match="layer"):
        cache["pattern", 3]


def test_key_excluded_by_names_filter():
    cfg = tiny_cfg()
    model, _, _, cache = run(cfg, names_filter=lambda n: n.endswith("hook_pattern"))
    assert set(cache) == {"blocks.0.attn.hook_pattern", "blocks.1.attn.hook_pattern"}
    assert len(cache) == 2
    with pytest.raises(KeyError, match=r"blocks\.1\.attn\.hook_z.*names_filter"):
        cache["z", 1]
    assert ("z", 1) not in cache


# ---------------------------------------------------------------- decompose_resid


def component_labels(cfg, n: int, incl_embeds: bool = True) -> list[str]:
    labels = []
    if incl_embeds:
        labels.append("embed")
        if cfg.positional in ("learned", "sinusoidal"):
            labels.append("pos_embed")
    for ell in range(n):
        labels.append(f"{ell}_attn_out")
        if not cfg.attn_only:
            labels.append(f"{ell}_mlp_out")
    return labels


def stream_entering(cache, cfg, ell: int) -> torch.Tensor:
    return cache["resid_post", -1] if ell == cfg.n_layers else cache["resid_pre", ell]


@pytest.mark.parametrize("cfg", CFGS.values(), ids=CFGS.keys())
def test_decompose_resid_sums_to_the_stream(cfg):
    _, _, _, cache = run(cfg)
    stack, labels = cache.decompose_resid(return_labels=True)
    assert labels == component_labels(cfg, cfg.n_layers)
    assert stack.shape == (len(labels), 2, 5, cfg.d_model)
    assert max_diff(stack.sum(0), cache["resid_post", -1]) <= EXACT
    assert torch.equal(cache.decompose_resid(layer=-1), stack)
    for ell in range(cfg.n_layers + 1):
        part, part_labels = cache.decompose_resid(layer=ell, return_labels=True)
        assert part_labels == component_labels(cfg, ell)
        assert torch.equal(part, stack[: len(part_labels)])
        assert max_diff(part.sum(0), stream_entering(cache, cfg, ell)) <= EXACT
    for i, label in enumerate(labels):
        if label in ("embed", "pos_embed"):
            assert torch.equal(stack[i], cache[label])
        else:
            layer, name = label.split("_", 1)
            assert torch.equal(stack[i], cache[name, int(layer)])


@pytest.mark.parametrize("cfg", CFGS.values(), ids=CFGS.keys())
def test_decompose_resid_without_embeds(cfg):
    _, _, _, cache = run(cfg)
    stack, labels = cache.decompose_resid(incl_embeds=False, return_labels=True)
    assert labels == component_labels(cfg, cfg.n_layers, incl_embeds=False)
    outputs = cache["resid_post", -1] - cache["resid_pre", 0]
    assert max_diff(stack.sum(0), outputs) <= EXACT
    empty, empty_labels = cache.decompose_resid(layer=0, incl_embeds=False, return_labels=True)
    assert empty.shape == (0, 2, 5, cfg.d_model) and empty_labels == []


def test_decompose_resid_layer_out_of_range():
    cfg = tiny_cfg()
    _, _, _, cache = run(cfg)
    for bad in (3, -4, 7):
        with pytest.raises(ValueError, match="layer must be"):
            cache.decompose_resid(layer=bad)


# ---------------------------------------------------------------- accumulated_resid


@pytest.mark.parametrize("incl_mid", [False, True])
@pytest.mark.parametrize("cfg", CFGS.values(), ids=CFGS.keys())
def test_accumulated_resid(cfg, incl_mid):
    model, _, _, cache = run(cfg)
    mid = incl_mid and not cfg.attn_only
    for layer in [*range(cfg.n_layers + 1), None]:
        n = cfg.n_layers if layer is None else layer
        stack, labels = cache.accumulated_resid(layer=layer, incl_mid=incl_mid, return_labels=True)
        expected, expected_labels = [], []
        for ell in range(n):
            expected.append(cache["resid_pre", ell])
            expected_labels.append(f"{ell}_pre")
            if mid:
                expected.append(cache["resid_mid", ell])
                expected_labels.append(f"{ell}_mid")
        if n == cfg.n_layers:
            expected.append(cache["resid_post", -1])
            expected_labels.append("final_post")
        else:
            expected.append(cache["resid_pre", n])
            expected_labels.append(f"{n}_pre")
        assert labels == expected_labels
        assert torch.equal(stack, torch.stack(expected))
    if cfg.normalization is not None:
        # the final stream: a logit lens, ln_final recomputed on each entry
        full = cache.accumulated_resid(incl_mid=incl_mid)
        normed = cache.accumulated_resid(incl_mid=incl_mid, apply_ln=True)
        with torch.no_grad():
            assert max_diff(normed, torch.stack([model.ln_final(r) for r in full])) <= EXACT
        # a block's input: linearised at the run's scale, as the decompositions
        last = cfg.n_layers - 1
        full = cache.accumulated_resid(layer=last, incl_mid=incl_mid)
        normed = cache.accumulated_resid(layer=last, incl_mid=incl_mid, apply_ln=True)
        assert torch.equal(normed, cache.apply_ln_to_stack(full, layer=last))


def test_accumulated_resid_labels_hand_written():
    _, _, _, cache = run(tiny_cfg())
    _, labels = cache.accumulated_resid(incl_mid=True, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "final_post"]
    _, labels = cache.accumulated_resid(layer=1, return_labels=True)
    assert labels == ["0_pre", "1_pre"]


# ---------------------------------------------------------------- stack_head_results


@pytest.mark.parametrize("cfg", CFGS.values(), ids=CFGS.keys())
def test_stack_head_results(cfg):
    model, x, _, cache = run(cfg, names_filter=lambda name: True)
    assert all(f"blocks.{ell}.attn.hook_result" in cache.cache_dict for ell in range(cfg.n_layers))
    h = cfg.n_heads
    stack, labels = cache.stack_head_results(return_labels=True)
    assert labels == [f"L{ell}H{i}" for ell in range(cfg.n_layers) for i in range(h)]
    assert stack.shape == (cfg.n_layers * h, 2, 5, cfg.d_model)
    for ell in range(cfg.n_layers):
        heads = stack[ell * h : (ell + 1) * h]
        attn_out = heads.sum(0) + model.blocks[ell].attn.b_O.detach()
        assert max_diff(attn_out, cache["attn_out", ell]) <= EXACT
        for i in range(h):
            by_hand = cache["z", ell][:, :, i] @ model.blocks[ell].attn.W_O[i].detach()
            assert max_diff(heads[i], by_hand) <= EXACT
    for layer in range(1, cfg.n_layers + 1):
        part, part_labels = cache.stack_head_results(layer=layer, return_labels=True)
        assert part_labels == labels[: layer * h]
        assert torch.equal(part, stack[: layer * h])
    # no head before block 0: an empty stack, as in TransformerLens
    empty, empty_labels = cache.stack_head_results(layer=0, return_labels=True)
    assert empty.shape == (0, 2, 5, cfg.d_model) and empty_labels == []

    # by default hook_result is stored, as it flowed
    _, default = model.run_with_cache(x)
    results = [f"blocks.{ell}.attn.hook_result" for ell in range(cfg.n_layers)]
    assert all(name in default.cache_dict for name in results)
    assert torch.equal(default.stack_head_results(), stack)
    # left out by names_filter: never recomputed from hook_z (it would not see hook edits)
    _, z_only = model.run_with_cache(x, names_filter=lambda n: not is_result(n))
    with pytest.raises(KeyError, match=r"blocks\.0\.attn\.hook_result.*names_filter"):
        z_only.stack_head_results()


# ---------------------------------------------------------------- apply_ln_to_stack


def ln_bias(ln) -> torch.Tensor | float:
    b = getattr(ln, "b", None)
    return 0.0 if b is None else b.detach()


@pytest.mark.parametrize("cfg", NORM_CFGS.values(), ids=NORM_CFGS.keys())
def test_apply_ln_to_stack_final(cfg):
    model, _, y, cache = run(cfg)
    stack = cache.decompose_resid()
    ln_stack = cache.apply_ln_to_stack(stack)
    assert ln_stack.shape == stack.shape
    normed = ln_stack.sum(0) + ln_bias(model.ln_final)
    with torch.no_grad():
        assert max_diff(normed, model.ln_final(cache["resid_post", -1])) <= EXACT
        W_U, b_U = model.unembed.W_U, model.unembed.b_U
        assert max_diff(normed @ W_U + b_U, y) <= EXACT
        assert max_diff((y - b_U), normed @ W_U) <= EXACT
    assert torch.equal(cache.decompose_resid(apply_ln=True), ln_stack)
    assert torch.equal(cache.apply_ln_to_stack(stack, layer=cfg.n_layers), ln_stack)
    if cfg.normalization is None:
        assert torch.equal(ln_stack, stack)
    if cfg.normalization in ("LN", "LNPre"):  # each component is centred before w
        w = 1.0 if model.ln_final.w is None else model.ln_final.w.detach()
        assert float((ln_stack / w).mean(-1).abs().max()) <= EXACT


@pytest.mark.parametrize("cfg", NORM_CFGS.values(), ids=NORM_CFGS.keys())
def test_apply_ln_to_stack_block_norms(cfg):
    model, _, _, cache = run(cfg)
    for ell in range(cfg.n_layers):
        block = model.blocks[ell]
        stack = cache.decompose_resid(layer=ell)
        ln1_in = cache.apply_ln_to_stack(stack, layer=ell).sum(0) + ln_bias(block.ln1)
        with torch.no_grad():
            assert max_diff(ln1_in, block.ln1(cache["resid_pre", ell])) <= EXACT
        if cfg.normalization is not None:
            w = 1.0 if block.ln1.w is None else block.ln1.w.detach()
            assert max_diff(ln1_in, cache["normalized", ell] * w + ln_bias(block.ln1)) <= EXACT
        mid_stack = torch.cat([stack, cache["attn_out", ell][None]])
        assert max_diff(mid_stack.sum(0), cache["resid_mid", ell]) <= EXACT
        ln2_in = cache.apply_ln_to_stack(mid_stack, layer=ell, mlp_input=True).sum(0)
        ln2_in = ln2_in + ln_bias(block.ln2)
        with torch.no_grad():
            assert max_diff(ln2_in, block.ln2(cache["resid_mid", ell])) <= EXACT


@pytest.mark.parametrize("norm", ["LN", "RMS"])
def test_apply_ln_to_stack_needs_the_scale(norm):
    cfg = tiny_cfg(normalization=norm)
    model, _, _, cache = run(cfg, names_filter=lambda n: "scale" not in n)
    stack = cache.decompose_resid()
    with pytest.raises(KeyError, match=r"ln_final\.hook_scale"):
        cache.apply_ln_to_stack(stack)
    with pytest.raises(KeyError, match=r"blocks\.1\.ln1\.hook_scale"):
        cache.apply_ln_to_stack(cache.decompose_resid(layer=1), layer=1)
    with pytest.raises(KeyError, match=r"blocks\.0\.ln2\.hook_scale"):
        cache.apply_ln_to_stack(stack, layer=0, mlp_input=True)
    with pytest.raises(KeyError, match=r"ln_final\.hook_scale"):
        cache.decompose_resid(apply_ln=True)


def test_apply_ln_to_stack_rejects_another_batch():
    cfg = tiny_cfg()
    _, _, _, cache = run(cfg, batch=2, n_pos=5)
    with pytest.raises(ValueError, match="does not match the cached scale"):
        cache.apply_ln_to_stack(torch.zeros(4, 3, 5, cfg.d_model, dtype=torch.float64))
    with pytest.raises(ValueError, match="does not match the cached scale"):
        cache.apply_ln_to_stack(torch.zeros(4, 2, 4, cfg.d_model, dtype=torch.float64))


@pytest.mark.parametrize("cfg", NORM_CFGS.values(), ids=NORM_CFGS.keys())
def test_direct_attribution_identity(cfg):
    """Σ_components ⟨LN_lin(c) W_U, t⟩ + ⟨b_ln W_U, t⟩ = ⟨y − b_U, t⟩, per head and MLP."""
    model, _, y, cache = run(cfg)
    n, h = cfg.n_layers, cfg.n_heads
    heads = cache.stack_head_results()
    parts = [cache["embed"]]
    if "pos_embed" in cache:
        parts.append(cache["pos_embed"])
    for ell in range(n):
        parts.extend(heads[ell * h : (ell + 1) * h])
        parts.append(model.blocks[ell].attn.b_O.detach().expand_as(cache["embed"]))
        if not cfg.attn_only:
            parts.append(cache["mlp_out", ell])
    components = torch.stack(parts)
    assert max_diff(components.sum(0), cache["resid_post", -1]) <= EXACT
    W_U, b_U = model.unembed.W_U.detach(), model.unembed.b_U.detach()
    direct = cache.apply_ln_to_stack(components) @ W_U  # [component, batch, pos, d_out]
    bias = ln_bias(model.ln_final)
    bias_term = (
        bias @ W_U
        if isinstance(bias, torch.Tensor)
        else torch.zeros(cfg.d_out, dtype=torch.float64)
    )
    assert max_diff(direct.sum(0) + bias_term + b_U, y) <= EXACT
    targets = random_input(cfg.replace(d_in=cfg.d_out), batch=2, n_pos=5, seed=9)
    scores = einsum(direct, targets, "c batch pos d_out, batch pos d_out -> c batch pos")
    bias_score = einsum(
        bias_term.expand_as(targets), targets, "batch pos d, batch pos d -> batch pos"
    )
    total = einsum(y - b_U, targets, "batch pos d, batch pos d -> batch pos")
    assert max_diff(scores.sum(0) + bias_score, total) <= EXACT


def test_decompose_resid_refuses_a_cache_without_pos_embed():
    """A model with a positional embedding whose cache lacks hook_pos_embed cannot be
    decomposed: silently dropping the component would break the exact sum."""
    cfg = tiny_cfg()
    _, _, _, cache = run(cfg, names_filter=lambda n: n != "hook_pos_embed")
    with pytest.raises(KeyError, match="hook_pos_embed"):
        cache.decompose_resid()


def test_apply_ln_to_stack_mlp_input_on_attn_only_model():
    cfg = tiny_cfg(attn_only=True)
    _, _, _, cache = run(cfg)
    with pytest.raises(ValueError, match="attn_only|mlp_input|ln2"):
        cache.apply_ln_to_stack(cache.decompose_resid(layer=0), layer=0, mlp_input=True)
