# mypy: ignore-errors
# (the catalogue passes wrong types on purpose: that is what it measures)
"""The catalogue of bad inputs run by ``bad_inputs.py``.

Each :class:`Case` calls the public API once with one mistake in it and says what a good
answer looks like: ``names`` are the words that identify the offending argument (a message
naming one is clear), ``expect`` the words of the expected value (clear when vecinterp
itself raised), ``ok_if_accepted`` whether returning a finite result is a legitimate
answer, and ``check`` a test of a returned result (a wrong one is a silent failure).
Everything else about the models is tiny: ``d_in=4, d_model=16, d_head=8, n_heads=2,
n_layers=2, n_ctx=6, d_mlp=32``, inputs ``[2, 5, 4]``.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import multiprocessing
import shutil
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

import vecinterp as vi
from vecinterp.tasks import affine_recurrence, induction, linear_regression, retrieval

HERE = Path(__file__).resolve().parent
TINY = dict(d_in=4, d_model=16, d_head=8, n_heads=2, n_layers=2, n_ctx=6, d_mlp=32)
NAN, INF = float("nan"), float("inf")

CLEAR_TYPES: tuple[type[BaseException], ...] = (
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    RuntimeError,
    FileNotFoundError,
    NotADirectoryError,
    IsADirectoryError,
    FileExistsError,
    vi.TrainingDivergedError,  # vecinterp's own, documented; a FloatingPointError
)
CACHE = "cache"
SAVELOAD = "save/load/checkpoints"
HOOKS = "hooks/threads"
INPUTS = "config/inputs/messages"
AREAS = {
    "cache": CACHE,
    "save/load": SAVELOAD,
    "checkpoints": SAVELOAD,
    "hooks": HOOKS,
    "threads": HOOKS,
}


@dataclasses.dataclass
class Problem:
    """Returned by a case that found the library's answer wrong."""

    what: str


@dataclasses.dataclass
class Case:
    id: str
    category: str
    run: Callable[[Fx], Any]
    names: tuple[str, ...] = ()
    expect: tuple[str, ...] = ()
    ok_if_accepted: bool = False
    check: Callable[[Any, Fx], str | None] | None = None
    scan: Callable[[Any], Any] | None = None
    types: tuple[type[BaseException], ...] | None = None
    warn_ok: bool = False
    timeout: float | None = None
    area: str = ""

    def __post_init__(self) -> None:
        self.area = self.area or AREAS.get(self.category, INPUTS)


# ------------------------------------------------------------------------------ fixtures


def make_batch(step: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """The training data of the checkpoint cases (importable by a child process)."""
    x = torch.randn(4, 5, 4, generator=gen)
    return x, x.flip(1)


CHILD_STEPS = 400
BIG = dict(d_model=64, d_head=32, d_mlp=2048)
"""The concurrent-run cases train a wider model, so that a checkpoint takes a while to
write and the second run starts while the first one's is being written."""


def child_train(checkpoint_dir: str, steps: int, report: str) -> None:
    """A slow training run for the concurrent-run cases, in its own process; writes its
    exception (if any) to ``report``."""
    torch.set_num_threads(1)
    model = vi.HookedVectorTransformer(vi.VectorTransformerConfig(**{**TINY, **BIG}), seed=0)
    try:
        vi.train(
            model,
            make_batch,
            steps=steps,
            lr=1e-2,
            checkpoint_dir=checkpoint_dir,
            checkpoint_every=1,
            keep_last=2,
            progress=False,
            device="cpu",
            callback=lambda step, metrics: time.sleep(0.005),
        )
    except BaseException as err:
        Path(report).write_text(f"{type(err).__name__}: {err}"[:300])
        raise


def _read(path: Path) -> str:
    return path.read_text() if path.is_file() else "(no report)"


class Fx:
    """Fresh tiny models, inputs, caches, saves and checkpoints for the cases."""

    def __init__(self, root: Path):
        self.root = root
        self._count = 0
        self.children: list[Any] = []

    def cfg(self, **kw: Any) -> vi.VectorTransformerConfig:
        return vi.VectorTransformerConfig(**{**TINY, **kw})

    def model(self, dtype: torch.dtype = torch.float32, **kw: Any) -> vi.HookedVectorTransformer:
        return vi.HookedVectorTransformer(self.cfg(**kw), seed=0, dtype=dtype)

    def x(
        self, batch: int = 2, pos: int = 5, d: int = 4, dtype: Any = torch.float32, seed: int = 1
    ) -> torch.Tensor:
        gen = torch.Generator().manual_seed(seed)
        return torch.randn(batch, pos, d, generator=gen, dtype=torch.float64).to(dtype)

    def t(self, **kw: Any) -> torch.Tensor:
        return self.x(seed=2, **kw)

    def nan_x(
        self, where: tuple[int, ...] = (0, 1, 2), value: float = NAN, **kw: Any
    ) -> torch.Tensor:
        x = self.x(**kw)
        x[where] = value
        return x

    def cache(self, model: vi.HookedVectorTransformer | None = None, **kw: Any) -> Any:
        return (model or self.model()).run_with_cache(self.x(), **kw)[1]

    def tmp(self, name: str = "case") -> Path:
        self._count += 1
        path = self.root / f"{self._count:04d}-{name}"
        path.mkdir()
        return path

    def saved(self, model: vi.HookedVectorTransformer | None = None) -> Path:
        path = self.tmp("saved") / "model"
        vi.save(model if model is not None else self.model(), path)
        return path

    def file(self, text: str = "not a directory") -> Path:
        path = self.tmp("file") / "a_file.txt"
        path.write_text(text)
        return path

    def train(self, model: Any = None, data: Any = make_batch, **kw: Any) -> Any:
        args = dict(steps=3, lr=1e-2, progress=False, device="cpu")
        args.update(kw)
        return vi.train(self.model() if model is None else model, data, **args)

    def checkpoints(self) -> Path:
        """A checkpoint_dir holding steps 1..3 of a tiny run."""
        directory = self.tmp("ckpt") / "run"
        self.train(checkpoint_dir=directory, checkpoint_every=1, keep_last=None)
        return directory

    def resume(self, directory: Path, **kw: Any) -> Any:
        return self.train(
            steps=4, checkpoint_dir=directory, checkpoint_every=1, keep_last=None, resume=True, **kw
        )

    def close(self) -> None:
        for child in self.children:
            if child.is_alive():
                child.kill()
                child.join()


def nan_weight_model(fx: Fx, value: float = NAN) -> vi.HookedVectorTransformer:
    model = fx.model()
    with torch.no_grad():
        model.blocks[0].attn.W_Q[0, 0, 0] = value
    return model


def flip_tensor_byte(path: Path, which: str | None = None) -> None:
    """Flip one mantissa bit of a float32 in the middle of a safetensors file's largest
    tensor (or ``which``): the file still parses and the value stays finite."""
    data = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", bytes(data[:8]))
    header = json.loads(bytes(data[8 : 8 + n]))
    entries = {k: v for k, v in header.items() if k != "__metadata__"}
    name = which or max(
        entries, key=lambda k: entries[k]["data_offsets"][1] - entries[k]["data_offsets"][0]
    )
    begin, end = entries[name]["data_offsets"]
    offset = 8 + n + begin + 4 * ((end - begin) // 8)
    data[offset + 2] ^= 0x40  # a high mantissa bit: the value changes by a quarter or so
    path.write_bytes(bytes(data))


def truncate(path: Path, keep: float = 0.6) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def edit_json(path: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))


def VALID_PAIRS(scores: Any) -> Any:
    """The entries of composition scores that are defined (earlier layer -> later layer);
    the rest are NaN by design."""
    if not isinstance(scores, torch.Tensor) or scores.ndim != 4:
        return scores
    n = scores.shape[0]
    return [scores[a, :, b, :] for a in range(n) for b in range(a + 1, n)]


def same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)


# ------------------------------------------------------------------------------ the cases


class Catalogue:
    def __init__(self) -> None:
        self.cases: list[Case] = []

    def add(
        self,
        id: str,
        category: str,
        run: Callable[[Fx], Any],
        names: Any = (),
        expect: Any = (),
        **kw: Any,
    ) -> None:
        names = tuple(n for n in ((names,) if isinstance(names, str) else names) if n)
        expect = tuple(e for e in ((expect,) if isinstance(expect, str) else expect) if e)
        self.cases.append(Case(f"{category}: {id}", category, run, names, expect, **kw))


def config_cases(c: Catalogue) -> None:
    def cfg_forward(fx: Fx, **kw: Any) -> Any:
        cfg = fx.cfg(**kw)
        model = vi.HookedVectorTransformer(cfg, seed=0)
        return cfg, model(fx.x(pos=3))

    ints = [
        ("0", 0, False),
        ("-3", -3, False),
        ("2.5", 2.5, False),
        ("True", True, False),
        ("'4'", "4", False),
        ("nan", NAN, False),
        ("4.0", 4.0, True),
        ("np.int64(4)", np.int64(4), True),
    ]
    for field in ("d_in", "d_model", "d_head", "n_heads", "n_layers", "n_ctx", "d_out", "d_mlp"):
        for label, value, ok in ints:
            c.add(
                f"{field}={label}",
                "config",
                lambda fx, f=field, v=value: cfg_forward(fx, **{f: v}),
                names=field,
                expect=("int", "positive"),
                ok_if_accepted=ok,
            )
        if field not in ("d_out", "d_mlp"):
            c.add(
                f"{field}=None",
                "config",
                lambda fx, f=field: cfg_forward(fx, **{f: None}),
                names=field,
                expect="int",
            )
    floats = [
        ("nan", NAN, False),
        ("inf", INF, False),
        ("-inf", -INF, False),
        ("-1", -1.0, False),
        ("'1e-5'", "1e-5", False),
        ("None", None, False),
        ("True", True, False),
    ]
    for field in ("eps", "rotary_base", "init_range"):
        extra = {"positional": "rotary"} if field == "rotary_base" else {}
        for label, value, ok in [*floats, ("0", 0.0, field != "rotary_base")]:
            # init_range=None is valid: the default of the config's init
            ok = ok or (field == "init_range" and value is None)
            c.add(
                f"{field}={label}",
                "config",
                lambda fx, f=field, v=value, e=extra: cfg_forward(fx, **{f: v}, **e),
                names=field,
                expect=("finite", "positive"),
                ok_if_accepted=ok,
            )
    enums = {
        "act_fn": [
            ("RELU", True),
            ("relu6", False),
            ("", False),
            (None, False),
            (1, False),
            ("gelu_new", True),
            ("swish", True),
            ("solu_ln", False),
        ],
        "normalization": [
            ("layernorm", False),
            ("ln", True),
            ("RMSNorm", False),
            (1, False),
            ("", False),
            ("none", True),
            ("LayerNorm", True),
        ],
        "positional": [
            ("rope", False),
            ("absolute", False),
            (None, False),
            ("", False),
            ("Rotary", True),
            ("standard", True),
            (1, False),
        ],
    }
    allowed = {"act_fn": "relu", "normalization": "LN", "positional": "learned"}
    for field, values in enums.items():
        for value, ok in values:
            c.add(
                f"{field}={value!r}",
                "config",
                lambda fx, f=field, v=value: cfg_forward(fx, **{f: v}),
                names=field,
                expect=allowed[field],
                ok_if_accepted=ok,
            )
    for field, value, ok in [
        ("attn_only", "yes", False),
        ("attn_only", "False", False),
        ("causal", "false", False),
        ("causal", None, False),
        ("embed_bias", "no", False),
        ("causal", 0, True),
        ("attn_only", 1, True),
    ]:
        c.add(
            f"{field}={value!r}",
            "config",
            lambda fx, f=field, v=value: cfg_forward(fx, **{f: v}),
            names=field,
            expect=("bool", "True", "False"),
            ok_if_accepted=ok,
        )
    c.add(
        "rotary with odd d_head=7",
        "config",
        lambda fx: cfg_forward(fx, positional="rotary", d_head=7),
        names="d_head",
        expect=("even", "rotary"),
    )
    c.add(
        "sinusoidal with odd d_model=15",
        "config",
        lambda fx: cfg_forward(fx, positional="sinusoidal", d_model=15),
        names="d_model",
        expect="even",
        ok_if_accepted=True,
    )
    # TransformerLens's config names
    base = {k: v for k, v in TINY.items() if k != "d_in"}
    c.add(
        "d_vocab=4 (TransformerLens) instead of d_in",
        "tl-habits",
        lambda fx: vi.VectorTransformerConfig(d_vocab=4, **base),
        names="d_in",
    )
    c.add(
        "d_vocab_out=4 (TransformerLens)",
        "tl-habits",
        lambda fx: vi.VectorTransformerConfig(d_vocab_out=4, **TINY),
        names="d_out",
    )
    c.add(
        "normalization_type='LN' (TransformerLens)",
        "tl-habits",
        lambda fx: vi.VectorTransformerConfig(normalization_type="LN", **TINY),
        names="normalization",
    )
    c.add(
        "positional_embedding_type='rotary' (TransformerLens)",
        "tl-habits",
        lambda fx: vi.VectorTransformerConfig(positional_embedding_type="rotary", **TINY),
        names="positional",
    )
    c.add(
        "attention_dir='bidirectional' (TransformerLens)",
        "tl-habits",
        lambda fx: vi.VectorTransformerConfig(attention_dir="bidirectional", **TINY),
        names="causal",
    )
    c.add(
        "initializer_range=0.02 (TransformerLens)",
        "tl-habits",
        lambda fx: vi.VectorTransformerConfig(initializer_range=0.02, **TINY),
        names="init_range",
    )
    no_ctx = {k: v for k, v in TINY.items() if k != "n_ctx"}
    c.add("n_ctx missing", "config", lambda fx: vi.VectorTransformerConfig(**no_ctx), names="n_ctx")
    c.add(
        "from_dict with an unknown field",
        "config",
        lambda fx: vi.VectorTransformerConfig.from_dict({**TINY, "d_hidden": 8}),
        names="d_hidden",
    )
    c.add(
        "from_dict with eps=inf",
        "config",
        lambda fx: vi.VectorTransformerConfig.from_dict({**TINY, "eps": INF}),
        names="eps",
    )
    c.add(
        "from_dict of a string",
        "config",
        lambda fx: vi.VectorTransformerConfig.from_dict("d_in=4"),
        names=("from_dict", "dict"),
    )
    c.add(
        "from_dict without d_in",
        "config",
        lambda fx: vi.VectorTransformerConfig.from_dict(base),
        names="d_in",
    )


def model_cases(c: Catalogue) -> None:
    new = vi.HookedVectorTransformer
    c.add(
        "cfg as a dict (TransformerLens)",
        "tl-habits",
        lambda fx: new(dict(TINY)),
        names="cfg",
        expect="VectorTransformerConfig",
    )
    c.add("cfg=None", "model", lambda fx: new(None), names="cfg")
    for label, seed, ok in [
        ("'0'", "0", False),
        ("1.5", 1.5, False),
        ("True", True, False),
        ("-1", -1, True),
    ]:
        c.add(
            f"seed={label}",
            "model",
            lambda fx, s=seed: new(fx.cfg(), seed=s),
            names="seed",
            ok_if_accepted=ok,
        )
    for label, dtype, ok in [
        ("torch.int64", torch.int64, False),
        ("'float32'", "float32", True),
        ("torch.complex64", torch.complex64, False),
        ("np.float32", np.float32, True),
        ("torch.float16", torch.float16, True),
        ("None", None, True),
    ]:
        c.add(
            f"dtype={label}",
            "model",
            lambda fx, d=dtype: new(fx.cfg(), dtype=d)(
                fx.x().to(d if isinstance(d, torch.dtype) else torch.float32)
            ),
            names="dtype",
            expect="float",
            ok_if_accepted=ok,
        )
    for device in ("nope", "cuda:99", "cpu:x"):
        c.add(
            f"device={device!r}",
            "model",
            lambda fx, d=device: new(fx.cfg(), device=d),
            names=("device", device),
            expect="cpu",
        )
    c.add(
        "init_weights(seed='x')",
        "model",
        lambda fx: fx.model().init_weights(seed="x"),
        names="seed",
    )
    for layer in (5, -5, "0", 1.5, True, None):
        c.add(
            f"layer_index({layer!r})",
            "model",
            lambda fx, v=layer: fx.model().layer_index(v),
            names="layer",
            expect="n_layers",
        )
    # TransformerLens's model-level stacked parameters
    tl_shapes = {
        "W_pos": ((6, 16), "pos_embed.W_pos"),
        "W_in": ((2, 16, 32), "mlp.W_in"),
        "W_out": ((2, 32, 16), "mlp.W_out"),
        "b_Q": ((2, 2, 8), "attn.b_Q"),
        "b_K": ((2, 2, 8), "attn.b_K"),
        "b_V": ((2, 2, 8), "attn.b_V"),
        "b_O": ((2, 16), "attn.b_O"),
        "b_in": ((2, 32), "mlp.b_in"),
        "b_out": ((2, 16), "mlp.b_out"),
        "b_U": ((4,), "unembed.b_U"),
    }
    for attr, (shape, where) in tl_shapes.items():
        c.add(
            f"model.{attr} (TransformerLens stacked parameter)",
            "tl-habits",
            lambda fx, a=attr: getattr(fx.model(), a),
            expect=(where, where.split(".")[-1] + "]", "blocks"),
            ok_if_accepted=True,
            types=(AttributeError, *CLEAR_TYPES),
            check=lambda r, fx, s=shape: (
                None if tuple(r.shape) == s else f"shape {tuple(r.shape)}, TransformerLens's is {s}"
            ),
        )
    c.add(
        "model.W_pos of a rotary model",
        "tl-habits",
        lambda fx: fx.model(positional="rotary").W_pos,
        names=("positional", "rotary"),
        types=(AttributeError, *CLEAR_TYPES),
    )
    c.add(
        "model.cfg.d_vocab (TransformerLens)",
        "tl-habits",
        lambda fx: fx.model().cfg.d_vocab,
        expect="d_in",
        types=(AttributeError, *CLEAR_TYPES),
    )
    c.add(
        "HookedVectorTransformer.from_pretrained (TransformerLens)",
        "tl-habits",
        lambda fx: new.from_pretrained("gpt2"),
        expect=("load", "vecinterp.load"),
        types=(AttributeError, *CLEAR_TYPES),
    )
    c.add(
        "model.set_use_attn_result(True) (TransformerLens)",
        "tl-habits",
        lambda fx: fx.model().set_use_attn_result(True),
        expect=("hook_result",),
        types=(AttributeError, *CLEAR_TYPES),
        ok_if_accepted=True,
    )


def forward_cases(c: Catalogue) -> None:
    xs: list[tuple[str, Callable[[Fx], Any], tuple[str, ...], bool]] = [
        ("rank 2 [pos, d_in]", lambda fx: fx.x()[0], ("rank", "batch"), False),
        ("rank 4", lambda fx: fx.x()[None], ("rank",), False),
        ("rank 1", lambda fx: fx.x()[0, 0], ("rank",), False),
        ("0-d tensor", lambda fx: torch.tensor(1.0), ("rank",), False),
        ("last axis 3", lambda fx: fx.x(d=3), ("d_in",), False),
        ("last axis 5", lambda fx: fx.x(d=5), ("d_in",), False),
        ("7 positions > n_ctx=6", lambda fx: fx.x(pos=7), ("n_ctx",), False),
        ("batch 0", lambda fx: fx.x(batch=0), ("batch",), False),
        ("0 positions", lambda fx: fx.x(pos=0), ("position", "pos"), False),
        (
            "int64 token ids (TransformerLens)",
            lambda fx: torch.randint(0, 4, (2, 5)),
            ("float", "d_in"),
            False,
        ),
        ("int64 [batch, pos, d_in]", lambda fx: fx.x().round().long(), ("float", "float32"), False),
        ("bool", lambda fx: fx.x() > 0, ("float", "float32"), False),
        ("float64 into a float32 model", lambda fx: fx.x(dtype=torch.float64), ("float32",), False),
        ("float16 into a float32 model", lambda fx: fx.x(dtype=torch.float16), ("float32",), False),
        (
            "bfloat16 into a float32 model",
            lambda fx: fx.x(dtype=torch.bfloat16),
            ("float32",),
            False,
        ),
        ("complex64", lambda fx: fx.x().to(torch.complex64), ("float", "float32"), False),
        ("a nested list", lambda fx: fx.x().tolist(), ("Tensor",), False),
        ("a numpy array", lambda fx: fx.x().numpy(), ("Tensor",), False),
        ("a tuple of tensors", lambda fx: tuple(fx.x()), ("Tensor",), False),
        ("None", lambda fx: None, ("Tensor",), False),
        ("NaN", lambda fx: fx.nan_x(), ("NaN",), False),
        ("+inf", lambda fx: fx.nan_x(value=INF), ("inf",), False),
        ("-inf", lambda fx: fx.nan_x(value=-INF), ("inf",), False),
        ("NaN in the last item's last position", lambda fx: fx.nan_x((1, 4, 3)), ("NaN",), False),
        ("on the meta device", lambda fx: fx.x().to("meta"), ("cpu", "device"), False),
        ("non-contiguous", lambda fx: fx.x(batch=5, pos=2).transpose(0, 1), (), True),
        ("requires_grad", lambda fx: fx.x().requires_grad_(), (), True),
    ]
    for label, make, expect, ok in xs:
        c.add(
            f"model(x): x {label}",
            "forward",
            lambda fx, m=make: fx.model()(m(fx)),
            names="x",
            expect=expect,
            ok_if_accepted=ok,
        )
    subset = {
        "rank 2 [pos, d_in]",
        "last axis 3",
        "7 positions > n_ctx=6",
        "NaN",
        "float64 into a float32 model",
        "a nested list",
        "int64 token ids (TransformerLens)",
        "+inf",
    }
    for label, make, expect, ok in xs:
        if label in subset:
            c.add(
                f"run_with_cache(x): x {label}",
                "forward",
                lambda fx, m=make: fx.model().run_with_cache(m(fx)),
                names="x",
                expect=expect,
                ok_if_accepted=ok,
            )
            c.add(
                f"run_with_hooks(x): x {label}",
                "forward",
                lambda fx, m=make: fx.model().run_with_hooks(m(fx), fwd_hooks=[]),
                names="x",
                expect=expect,
                ok_if_accepted=ok,
            )
    c.add(
        "start_at_layer=1 with a d_in-wide x (not the residual stream)",
        "forward",
        lambda fx: fx.model()(fx.x(), start_at_layer=1),
        names="x",
        expect="d_model",
    )
    c.add(
        "start_at_layer=1 with a NaN residual stream",
        "forward",
        lambda fx: fx.model()(fx.nan_x(d=16), start_at_layer=1),
        names="x",
        expect="NaN",
    )

    def loss(fx: Fx, **kw: Any) -> Any:
        return fx.model()(fx.x(), return_type="loss", **kw)

    ts: list[tuple[str, Callable[[Fx], Any], tuple[str, ...], bool]] = [
        ("last axis 3", lambda fx: fx.t(d=3), ("d_out",), False),
        ("4 positions for 5", lambda fx: fx.t(pos=4), ("shape",), False),
        ("batch 3 for 2", lambda fx: fx.t(batch=3), ("shape",), False),
        ("rank 2 [pos, d_out] (would broadcast)", lambda fx: fx.t()[0], ("shape", "rank"), False),
        ("[1, pos, d_out] (would broadcast)", lambda fx: fx.t()[:1], ("shape",), False),
        ("NaN", lambda fx: fx.nan_x((1, 2, 0), seed=2), ("NaN",), False),
        ("+inf", lambda fx: fx.nan_x((1, 2, 0), INF, seed=2), ("inf",), False),
        ("a nested list", lambda fx: fx.t().tolist(), ("Tensor",), False),
        ("int64", lambda fx: fx.t().round().long(), ("float",), True),
        ("float64 into a float32 model", lambda fx: fx.t(dtype=torch.float64), ("float32",), True),
        ("on the meta device", lambda fx: fx.t().to("meta"), ("cpu", "device"), False),
    ]
    for label, make, expect, ok in ts:
        c.add(
            f"return_type='loss': targets {label}",
            "forward",
            lambda fx, m=make: loss(fx, targets=m(fx)),
            names="targets",
            expect=expect,
            ok_if_accepted=ok,
        )
    c.add("return_type='loss' without targets", "forward", lambda fx: loss(fx), names="targets")
    c.add(
        "return_type='both' without targets",
        "forward",
        lambda fx: fx.model()(fx.x(), return_type="both"),
        names="targets",
    )
    c.add(
        "targets with return_type='output'",
        "forward",
        lambda fx: fx.model()(fx.x(), targets=fx.t()),
        names="targets",
    )
    masks: list[tuple[str, Callable[[Fx], Any], bool]] = [
        ("a list of bools", lambda fx: [[True] * 5] * 2, False),
        ("float 0/1", lambda fx: torch.ones(2, 5), True),
        ("int 0/1", lambda fx: torch.ones(2, 5, dtype=torch.long), True),
        ("shape [2, 4] for 5 positions", lambda fx: torch.ones(2, 4, dtype=torch.bool), False),
        ("shape [6] for 5 positions", lambda fx: torch.ones(6, dtype=torch.bool), False),
        ("rank 3", lambda fx: torch.ones(2, 5, 1, dtype=torch.bool), False),
        ("all False (empty selection)", lambda fx: torch.zeros(2, 5, dtype=torch.bool), False),
        ("float with NaN", lambda fx: torch.full((2, 5), NAN), False),
        ("on the meta device", lambda fx: torch.ones(2, 5, dtype=torch.bool, device="meta"), False),
    ]
    for label, make, ok in masks:
        c.add(
            f"return_type='loss': loss_mask {label}",
            "forward",
            lambda fx, m=make: loss(fx, targets=fx.t(), loss_mask=m(fx)),
            names="loss_mask",
            expect=("bool", "shape"),
            ok_if_accepted=ok,
        )
    for value, ok in [
        ("logits", True),
        ("bogus", False),
        (None, False),
        ("Loss", True),
        (1, False),
    ]:
        c.add(
            f"return_type={value!r}",
            "tl-habits" if value == "logits" else "forward",
            lambda fx, v=value: fx.model()(fx.x(), targets=fx.t(), return_type=v),
            names="return_type",
            expect="output",
            ok_if_accepted=ok,
        )
    for arg in ("start_at_layer", "stop_at_layer"):
        for value in (5, -5, "1", 1.5, True):
            c.add(
                f"{arg}={value!r}",
                "forward",
                lambda fx, a=arg, v=value: fx.model()(
                    fx.x(d=16) if a == "start_at_layer" else fx.x(), **{a: v}
                ),
                names=arg,
                expect="n_layers",
            )
    c.add(
        "start_at_layer=2 > stop_at_layer=1",
        "forward",
        lambda fx: fx.model()(fx.x(d=16), start_at_layer=2, stop_at_layer=1),
        names=("start_at_layer", "stop_at_layer"),
    )
    c.add(
        "a NaN weight (blocks.0.attn.W_Q)",
        "forward",
        lambda fx: nan_weight_model(fx)(fx.x()),
        names=("W_Q", "blocks.0.attn.W_Q"),
        expect=("NaN", "finite"),
    )
    c.add(
        "token ids [batch, pos] (int64), as TransformerLens takes",
        "forward",
        lambda fx: fx.model()(torch.zeros(2, 5, dtype=torch.long)),
        names=("x", "torch.int64"),
        expect=("token ids", "float vectors", "HookedTransformer"),
    )

    def float16_big_residual(fx: Fx) -> Any:
        # a float16 model whose residual stream reaches |x| ~ 500: x² overflows float16
        model = fx.model()
        with torch.no_grad():
            model.embed.W_E.mul_(500.0 / float(model.embed(fx.x()).abs().max()))
        return model(fx.x()), model.to(torch.float16)(fx.x(dtype=torch.float16))

    def _close_to_float32(r: Any, fx: Fx) -> str | None:
        want, got = r[0].double(), r[1].double()
        err = float((got - want).abs().max() / want.abs().max())
        return None if err < 5e-3 else f"float16 output {err:.2g} off the float32 model's"

    c.add(
        "float16 model whose residual reaches ~500 (norm statistics)",
        "forward",
        float16_big_residual,
        ok_if_accepted=True,
        check=_close_to_float32,
        scan=lambda r: r[1],
    )


def hook_cases(c: Catalogue) -> None:
    name = "blocks.0.hook_resid_pre"

    def with_hook(fx: Fx, hook: Any, hook_name: str = name) -> Any:
        return fx.model().run_with_hooks(fx.x(), fwd_hooks=[(hook_name, hook)])

    def ident(act: torch.Tensor, hook: Any) -> None:
        return None

    for label, bad in [
        ("typo blocks.0.attn.hook_patern", "blocks.0.attn.hook_patern"),
        ("unknown 'nope'", "nope"),
        ("layer 9", "blocks.9.hook_resid_pre"),
        ("short name 'pattern' (no layer)", "pattern"),
        ("empty string", ""),
    ]:
        c.add(
            f"run_with_hooks: hook name {label}",
            "hooks",
            lambda fx, b=bad: with_hook(fx, ident, b),
            names=(repr(bad)[1:-1], "fwd_hooks", "hook name")
            if bad
            else ("fwd_hooks", "hook name"),
            expect="blocks.0.attn.hook_pattern",
        )
    c.add(
        "fwd_hooks is one pair, not a list of pairs",
        "hooks",
        lambda fx: fx.model().run_with_hooks(fx.x(), fwd_hooks=(name, ident)),
        names="fwd_hooks",
        expect="pair",
    )
    c.add(
        "fwd_hooks pair without a function",
        "hooks",
        lambda fx: fx.model().run_with_hooks(fx.x(), fwd_hooks=[(name,)]),
        names="fwd_hooks",
        expect="pair",
    )
    c.add(
        "hook function is not callable",
        "hooks",
        lambda fx: with_hook(fx, 3),
        names=("fwd_hooks", "callable"),
    )
    c.add(
        "hook function takes one argument",
        "hooks",
        lambda fx: with_hook(fx, lambda act: act),
        names=("hook", "fwd_hooks"),
    )
    returns: list[tuple[str, Callable[[torch.Tensor], Any], bool]] = [
        ("one position fewer", lambda a: a[:, :-1], False),
        ("float64", lambda a: a.double(), False),
        ("int64", lambda a: a.long(), False),
        ("a list", lambda a: a.tolist(), False),
        ("a 1-tuple (act,)", lambda a: (a,), False),
        ("the meta device", lambda a: a.to("meta"), False),
        ("a 0-d tensor (would broadcast)", lambda a: a.sum(), False),
        ("[1, pos, d_model] (would broadcast)", lambda a: a[:1], False),
        ("an expanded view of the right shape", lambda a: a[:1].expand_as(a), True),
        ("a string", lambda a: "x", False),
    ]
    for label, ret, ok in returns:
        c.add(
            f"forward hook returns {label}",
            "hooks",
            lambda fx, r=ret: with_hook(fx, lambda act, hook: r(act)),
            names=(name, "hook"),
            expect=("shape", "dtype", "float32"),
            ok_if_accepted=ok,
        )

    def backward(fx: Fx, ret: Callable[[torch.Tensor], Any]) -> Any:
        model = fx.model()
        x = fx.x().requires_grad_()
        out = model.run_with_hooks(x, bwd_hooks=[(name, lambda g, hook: ret(g))])
        out.sum().backward()
        return x.grad

    c.add(
        "backward hook returns (grad,) (TransformerLens)",
        "tl-habits",
        lambda fx: backward(fx, lambda g: (g,)),
        names=(name, "hook"),
        ok_if_accepted=True,
    )
    c.add(
        "backward hook returns a wrong-shaped grad",
        "hooks",
        lambda fx: backward(fx, lambda g: g[:, :-1]),
        names=(name, "hook"),
        expect="shape",
    )
    c.add(
        "backward hook returns float64",
        "hooks",
        lambda fx: backward(fx, lambda g: g.double()),
        names=(name, "hook"),
        expect="dtype",
    )
    c.add(
        "add_hook(dir='forward')",
        "hooks",
        lambda fx: fx.model().add_hook(name, ident, dir="forward"),
        names="dir",
        expect="fwd",
    )
    c.add("add_hook('nope')", "hooks", lambda fx: fx.model().add_hook("nope", ident), names="nope")
    c.add(
        "add_hook with a predicate matching nothing",
        "hooks",
        lambda fx: fx.model().add_hook(lambda n: False, ident),
        names="name",
        ok_if_accepted=True,
    )
    c.add(
        "add_hook(is_permanent='yes')",
        "hooks",
        lambda fx: fx.model().add_hook(name, ident, is_permanent="yes"),
        names="is_permanent",
    )
    c.add(
        "add_hook with a non-callable fn",
        "hooks",
        lambda fx: fx.model().add_hook(name, None),
        names=("fn", "callable"),
    )
    c.add(
        "hooks() context with an unknown name",
        "hooks",
        lambda fx: fx.model().hooks(fwd_hooks=[("nope", ident)]).__enter__(),
        names="nope",
    )
    c.add("hook_point('nope')", "hooks", lambda fx: fx.model().hook_point("nope"), names="nope")
    c.add(
        "hook_names(names_filter=5)",
        "hooks",
        lambda fx: fx.model().hook_names(5),
        names="names_filter",
    )
    c.add(
        "reset_hooks(including_permanent='no')",
        "hooks",
        lambda fx: fx.model().reset_hooks(including_permanent="no"),
        names="including_permanent",
    )
    c.add(
        "run_with_hooks(reset_hooks_end=False) (TransformerLens)",
        "tl-habits",
        lambda fx: fx.model().run_with_hooks(fx.x(), fwd_hooks=[], reset_hooks_end=False),
        names=("reset_hooks_end",),
        ok_if_accepted=True,
    )

    def hook_left_behind(fx: Fx) -> Any:
        model, x = fx.model(), fx.x()
        clean = model(x)

        def boom(act: torch.Tensor, hook: Any) -> torch.Tensor:
            raise ZeroDivisionError("the user's hook failed")

        try:
            model.run_with_hooks(
                x, fwd_hooks=[(name, lambda a, hook: a * 0), ("blocks.1.hook_resid_pre", boom)]
            )
        except ZeroDivisionError:
            pass
        return (
            Problem("a hook stayed attached after the forward raised")
            if not torch.equal(model(x), clean)
            else clean
        )

    c.add(
        "a hook that raises leaves no hook behind", "hooks", hook_left_behind, ok_if_accepted=True
    )

    def torch_hook_after_compiled_call(fx: Fx) -> Any:
        import warnings

        model, x = fx.model(), fx.x()
        compiled = torch.compile(model, backend="eager")
        compiled(x)
        point = model.hook_dict[name]
        handle = point.register_forward_hook(lambda m, args, out: torch.zeros_like(out))
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", vi.CompiledHooksWarning)
                return compiled(x), model(x)
        finally:
            handle.remove()
            torch._dynamo.reset()

    c.add(
        "register_forward_hook on a hook point after a compiled call",
        "hooks",
        torch_hook_after_compiled_call,
        ok_if_accepted=True,
        check=lambda r, fx: (
            None if torch.equal(r[0], r[1]) else "the compiled call ignored the PyTorch hook"
        ),
        scan=lambda r: r[0],
    )

    def fullgraph_with_a_hook(fx: Fx) -> Any:
        model, x = fx.model(), fx.x()
        strict = torch.compile(model, backend="eager", fullgraph=True)
        try:
            strict(x)
            model.add_hook(name, ident)
            return strict(x)
        finally:
            model.reset_hooks()
            torch._dynamo.reset()

    c.add(
        "torch.compile(fullgraph=True) called with a hook attached",
        "hooks",
        fullgraph_with_a_hook,
        names=("fullgraph=True", "hooks attached"),
        expect=("run_with_hooks", "without fullgraph"),
    )


def thread_cases(c: Catalogue) -> None:
    zero = ("blocks.0.hook_resid_pre", lambda act, hook: act * 0)

    def other_thread_holds_hooks(fx: Fx, then: Callable[[Any, torch.Tensor], Any]) -> Any:
        model, x = fx.model(), fx.x()
        entered, done = threading.Event(), threading.Event()

        def worker() -> None:
            with model.hooks(fwd_hooks=[zero]):
                entered.set()
                done.wait(10)

        thread = threading.Thread(target=worker)
        thread.start()
        entered.wait(10)
        try:
            return then(model, x)
        finally:
            done.set()
            thread.join()

    def plain(model: Any, x: torch.Tensor) -> Any:
        clean = vi.HookedVectorTransformer(model.cfg, seed=0)(x)
        out = model(x)
        return (
            Problem("a plain forward ran another thread's hooks() hook")
            if not torch.equal(out, clean)
            else out
        )

    def cached(model: Any, x: torch.Tensor) -> Any:
        clean = vi.HookedVectorTransformer(model.cfg, seed=0).run_with_cache(x)[1]["resid_pre", 0]
        got = model.run_with_cache(x)[1]["resid_pre", 0]
        return (
            Problem("run_with_cache cached another thread's hook edit")
            if not torch.equal(got, clean)
            else got
        )

    c.add(
        "forward while another thread is inside model.hooks()",
        "threads",
        lambda fx: other_thread_holds_hooks(fx, plain),
        names=("thread", "threads", "hooks"),
        ok_if_accepted=True,
    )
    c.add(
        "run_with_cache while another thread is inside model.hooks()",
        "threads",
        lambda fx: other_thread_holds_hooks(fx, cached),
        names=("thread", "threads", "hooks"),
        ok_if_accepted=True,
    )

    def two_caches(fx: Fx) -> Any:
        model = fx.model()
        xs = [fx.x(seed=10), fx.x(seed=11)]
        want = [model.run_with_cache(x)[1]["resid_pre", 1] for x in xs]
        wrong: list[str] = []
        errors: list[BaseException] = []

        def worker(i: int) -> None:
            try:
                for _ in range(15):
                    got = model.run_with_cache(xs[i])[1]["resid_pre", 1]
                    if not torch.equal(got, want[i]):
                        wrong.append(f"thread {i}")
            except BaseException as err:  # noqa: BLE001
                errors.append(err)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return (
            Problem(f"caches held the other thread's activations ({len(wrong)} times)")
            if wrong
            else want
        )

    c.add(
        "run_with_cache from two threads at once",
        "threads",
        two_caches,
        names=("thread", "threads"),
        ok_if_accepted=True,
    )

    def deepcopy_inside(fx: Fx) -> Any:
        model, x = fx.model(), fx.x()
        clean = model(x)
        with model.hooks(fwd_hooks=[zero]):
            twin = copy.deepcopy(model)
        out = twin(x)
        return (
            Problem("a deepcopy taken inside hooks() kept the temporary hook")
            if not torch.equal(out, clean)
            else out
        )

    c.add(
        "copy.deepcopy(model) inside model.hooks()",
        "hooks",
        deepcopy_inside,
        names=("deepcopy", "hooks"),
        ok_if_accepted=True,
    )

    def context_raises(fx: Fx) -> Any:
        model, x = fx.model(), fx.x()
        clean = model(x)
        try:
            with model.hooks(fwd_hooks=[zero]):
                raise ZeroDivisionError("user code failed")
        except ZeroDivisionError:
            pass
        return (
            Problem("the hooks() context left its hook on an exception")
            if not torch.equal(model(x), clean)
            else clean
        )

    c.add(
        "an exception inside model.hooks() removes its hooks",
        "hooks",
        context_raises,
        ok_if_accepted=True,
    )


def cache_cases(c: Catalogue) -> None:
    def get(fx: Fx, key: Any) -> Any:
        return fx.cache()[key]

    c.add("cache['pattern'] without a layer", "cache", lambda fx: get(fx, "pattern"), names="layer")
    for key in [
        ("pattern", 5),
        ("pattern", -5),
        ("pattern", 1.5),
        ("pattern", "0"),
        ("pattern", True),
        ("resid_pre", 0, "bogus"),
    ]:
        c.add(
            f"cache[{key!r}]",
            "cache",
            lambda fx, k=key: get(fx, k),
            names=("key", repr(key)[1:-1], f"cache[{repr(key)[1:-1]}]"),
            expect="n_layers",
        )
    for key in [
        "nope",
        "blocks.9.hook_resid_pre",
        "blocks.0.attn.hook_patern",
        0,
        None,
        ("nope", 0),
    ]:
        c.add(
            f"cache[{key!r}]",
            "cache",
            lambda fx, k=key: get(fx, k),
            names=(str(key), "key"),
            expect="blocks.0.attn.hook_pattern",
        )
    c.add(
        "cache['attn', 0] (TransformerLens's short name for the pattern)",
        "tl-habits",
        lambda fx: get(fx, ("attn", 0)),
        names=("attn",),
        expect="pattern",
        ok_if_accepted=True,
        area=CACHE,
    )
    c.add("cache['pattern', -1]", "cache", lambda fx: get(fx, ("pattern", -1)), ok_if_accepted=True)
    for args in [("bogus",), ("pattern", "0"), (5,), ("pattern", 1.5)]:
        c.add(
            f"act_name{args!r}",
            "cache",
            lambda fx, a=args: vi.act_name(*a),
            names=("name", "layer", repr(args[0])[1:-1]),
            expect="pattern",
            ok_if_accepted=args == ("pattern", "0"),
        )
    for method in ("accumulated_resid", "decompose_resid", "stack_head_results"):
        for layer in (5, -5, "1", 1.5):
            c.add(
                f"{method}(layer={layer!r})",
                "cache",
                lambda fx, m=method, v=layer: getattr(fx.cache(), m)(layer=v),
                names="layer",
                expect="n_layers",
            )
    c.add(
        "stack_head_results(layer=0)",
        "cache",
        lambda fx: fx.cache().stack_head_results(layer=0),
        names="layer",
        ok_if_accepted=True,
    )
    c.add(
        "apply_ln_to_stack: stack with last axis d_in",
        "cache",
        lambda fx: fx.cache().apply_ln_to_stack(fx.x()[None]),
        names="residual_stack",
        expect="d_model",
    )
    c.add(
        "apply_ln_to_stack: NaN stack",
        "cache",
        lambda fx: fx.cache().apply_ln_to_stack(fx.nan_x(d=16)[None]),
        names="residual_stack",
        expect="NaN",
    )
    c.add(
        "apply_ln_to_stack: rank-1 stack",
        "cache",
        lambda fx: fx.cache().apply_ln_to_stack(torch.randn(16)),
        names="residual_stack",
        expect=("batch", "pos"),
    )
    c.add(
        "apply_ln_to_stack(layer=5)",
        "cache",
        lambda fx: fx.cache().apply_ln_to_stack(fx.x(d=16)[None], layer=5),
        names="layer",
    )
    c.add("cache.to('nope')", "cache", lambda fx: fx.cache().to("nope"), names=("device", "nope"))
    c.add(
        "accumulated_resid on a names_filter cache",
        "cache",
        lambda fx: fx.cache(names_filter=["blocks.0.hook_resid_pre"]).accumulated_resid(),
        names="names_filter",
        expect="hook_resid_post",
    )
    c.add(
        "cache['result', 0] on a names_filter cache",
        "cache",
        lambda fx: fx.cache(names_filter=["blocks.0.hook_resid_pre"])["result", 0],
        names=("names_filter",),
    )
    # run_with_cache's own arguments
    for label, kw, names, ok in [
        ("names_filter='nope'", dict(names_filter="nope"), ("names_filter", "nope"), False),
        (
            "names_filter with one unknown name",
            dict(names_filter=["blocks.0.hook_resid_pre", "nope"]),
            ("names_filter", "nope"),
            False,
        ),
        ("names_filter=5", dict(names_filter=5), ("names_filter",), False),
        (
            "names_filter matching nothing",
            dict(names_filter=lambda n: False),
            ("names_filter",),
            True,
        ),
        ("device='nope'", dict(device="nope"), ("device", "nope"), False),
        ("incl_bwd=True without loss_fn", dict(incl_bwd=True), ("loss_fn",), False),
        (
            "loss_fn returning a vector",
            dict(incl_bwd=True, loss_fn=lambda y: y.sum(-1)),
            ("loss_fn",),
            False,
        ),
        ("loss_fn not callable", dict(incl_bwd=True, loss_fn=3), ("loss_fn",), False),
        ("incl_bwd='yes'", dict(incl_bwd="yes", loss_fn=lambda y: y.sum()), ("incl_bwd",), False),
        (
            "fwd_hooks with an unknown name",
            dict(fwd_hooks=[("nope", lambda a, hook: None)]),
            ("nope",),
            False,
        ),
    ]:
        c.add(
            f"run_with_cache({label})",
            "cache",
            lambda fx, k=kw: fx.model().run_with_cache(fx.x(), **k),
            names=names,
            ok_if_accepted=ok,
        )
    c.add(
        "run_with_cache(remove_batch_dim=True) (TransformerLens)",
        "tl-habits",
        lambda fx: fx.model().run_with_cache(fx.x(), remove_batch_dim=True),
        names="run_with_cache",
        area=CACHE,
    )
    c.add(
        "run_with_cache(return_cache_object=False) (TransformerLens)",
        "tl-habits",
        lambda fx: fx.model().run_with_cache(fx.x(), return_cache_object=False),
        names="run_with_cache",
        area=CACHE,
    )

    # what the cache returns must be what flowed through the hook point in that run
    def zero_head0(act: torch.Tensor, hook: Any) -> torch.Tensor:
        act = act.clone()
        act[:, :, 0] = 0
        return act

    def edited_result(fx: Fx) -> Any:
        _, cache = fx.model().run_with_cache(
            fx.x(), fwd_hooks=[("blocks.0.attn.hook_result", zero_head0)]
        )
        got = cache["result", 0][:, :, 0]
        return (
            Problem(
                f"cache['result', 0][:, :, 0] is not the zeroed head (max {got.abs().max():.1e})"
            )
            if bool(got.abs().max() > 0)
            else cache
        )

    def edited_post(fx: Fx) -> Any:
        _, cache = fx.model().run_with_cache(
            fx.x(), fwd_hooks=[("blocks.1.mlp.hook_post", lambda a, hook: a * 0)]
        )
        got = cache["post", 1]
        return (
            Problem(f"cache['post', 1] is not the zeroed activation (max {got.abs().max():.1e})")
            if bool(got.abs().max() > 0)
            else cache
        )

    def keys_agree(fx: Fx) -> Any:
        model = fx.model()
        cache = fx.cache(model)
        keys, iterated = set(cache.keys()), set(iter(cache))
        inside = {n for n in model.hook_names() if n in cache}
        problems = []
        if inside != keys:
            problems.append(
                f"`in` says {len(inside)} names, keys() lists {len(keys)}: "
                f"{sorted(inside ^ keys)[:3]}"
            )
        if keys != iterated or len(cache) != len(keys):
            problems.append("keys(), iteration and len() disagree")
        return Problem("; ".join(problems)) if problems else cache

    def stale_after_weights(fx: Fx) -> Any:
        model, x = fx.model(), fx.x()
        _, cache = model.run_with_cache(x)
        want = model.run_with_cache(x, names_filter=lambda n: True)[1]["blocks.0.attn.hook_result"]
        with torch.no_grad():
            model.blocks[0].attn.W_O.add_(1.0)
        got = cache["result", 0]
        return (
            Problem("cache['result', 0] read after a weight change is not the run's")
            if not torch.equal(got, want)
            else cache
        )

    def identity_with_hook(fx: Fx) -> Any:
        model = fx.model(dtype=torch.float64)
        x, t = fx.x(dtype=torch.float64), fx.t(dtype=torch.float64)
        y, cache = model.run_with_cache(x, fwd_hooks=[("blocks.0.attn.hook_result", zero_head0)])
        att = vi.direct_attribution(model, cache, t)
        lhs = att.values.sum(0)
        rhs = ((y - model.unembed.b_U) * t).sum(-1)
        err = float((lhs - rhs).detach().abs().max())
        return (
            Problem(f"sum of attributions misses <y - b_U, t> by {err:.1e} (fp64)")
            if err > 1e-9
            else att
        )

    c.add(
        "zero head 0 at hook_result: cache['result', 0] shows it",
        "cache",
        edited_result,
        ok_if_accepted=True,
    )
    c.add(
        "zero blocks.1.mlp.hook_post: cache['post', 1] shows it",
        "cache",
        edited_post,
        ok_if_accepted=True,
    )
    c.add("keys(), len(), `in` and iteration agree", "cache", keys_agree, ok_if_accepted=True)
    c.add(
        "a derived entry read after a weight change",
        "cache",
        stale_after_weights,
        ok_if_accepted=True,
    )
    c.add(
        "direct_attribution identity with a hook_result edit (fp64)",
        "cache",
        identity_with_hook,
        ok_if_accepted=True,
    )


def processing_cases(c: Catalogue) -> None:
    c.add(
        "process_weights('model')",
        "processing",
        lambda fx: vi.process_weights("model"),
        names="model",
        expect="HookedVectorTransformer",
    )
    c.add(
        "process_weights(model, fold_ln='yes')",
        "processing",
        lambda fx: vi.process_weights(fx.model(), fold_ln="yes"),
        names="fold_ln",
    )
    c.add(
        "process_weights of a state dict",
        "processing",
        lambda fx: vi.process_weights(fx.model().state_dict()),
        names="model",
        expect="HookedVectorTransformer",
    )
    for norm in ("RMS", "RMSPre", None):
        c.add(
            f"center_writing_weights with normalization={norm!r}",
            "processing",
            lambda fx, n=norm: vi.center_writing_weights(fx.model(normalization=n)),
            names="normalization",
            expect=("LN", "LayerNorm"),
        )
    c.add(
        "fold_layer_norm on an LNPre model",
        "processing",
        lambda fx: vi.fold_layer_norm(fx.model(normalization="LNPre")),
        ok_if_accepted=True,
    )
    c.add(
        "fold_layer_norm(center_weights='no')",
        "processing",
        lambda fx: vi.fold_layer_norm(fx.model(), center_weights="no"),
        names="center_weights",
    )
    c.add(
        "fold_value_biases(cfg)",
        "processing",
        lambda fx: vi.fold_value_biases(fx.cfg()),
        names="model",
        expect="HookedVectorTransformer",
    )
    c.add(
        "process_weights of a model with a NaN weight",
        "processing",
        lambda fx: vi.process_weights(nan_weight_model(fx)),
        names=("W_Q", "blocks.0.attn.W_Q"),
        expect=("NaN", "finite"),
    )
    c.add(
        "process_weights of a model with an inf weight",
        "processing",
        lambda fx: vi.process_weights(nan_weight_model(fx, INF)),
        names=("W_Q", "blocks.0.attn.W_Q"),
        expect=("inf", "finite"),
    )

    def rms_processed(fx: Fx) -> Any:
        model = fx.model(dtype=torch.float64, normalization="RMS")
        x = fx.x(dtype=torch.float64)
        return model(x), vi.process_weights(model)(x)

    c.add(
        "process_weights of an RMS model with the defaults (center_writing_weights=True)",
        "processing",
        rms_processed,
        ok_if_accepted=True,
        check=lambda r, fx: (
            None
            if float((r[0] - r[1]).abs().max()) < 1e-12
            else "process_weights changed the RMS model's output"
        ),
        scan=lambda r: r[1],
    )
    for attr, write in (
        ("W_V", lambda t: t.copy_(torch.zeros_like(t))),
        ("b_V", lambda t: t.normal_()),
        ("W_K", lambda t: t.__setitem__(0, 0.0)),
        ("b_K", lambda t: t.zero_()),
    ):

        def gqa_write(fx: Fx, a: str = attr, w: Any = write) -> Any:
            model = fx.model(n_heads=4, d_head=4, n_key_value_heads=2)
            with torch.no_grad():
                return w(getattr(model.blocks[0].attn, a))

        c.add(
            f"write into a grouped-query model's attn.{attr} (an expanded copy)",
            "processing",
            gqa_write,
            names=(attr, "_" + attr),
            expect=("kv_parameters", "expanded"),
        )


def save_load_cases(c: Catalogue) -> None:
    c.add(
        "save(model, path of an existing file)",
        "save/load",
        lambda fx: vi.save(fx.model(), fx.file()),
        names="path",
        expect="directory",
    )
    c.add(
        "save(model, path under a file)",
        "save/load",
        lambda fx: vi.save(fx.model(), fx.file() / "run"),
        names="path",
        expect="directory",
    )
    c.add(
        "save('model', path)",
        "save/load",
        lambda fx: vi.save("model", fx.tmp() / "m"),
        names="model",
        expect="HookedVectorTransformer",
    )
    c.add("save(model, 123)", "save/load", lambda fx: vi.save(fx.model(), 123), names="path")
    c.add("save(model, None)", "save/load", lambda fx: vi.save(fx.model(), None), names="path")
    c.add(
        "save(metadata={'x': object()}) (not JSON)",
        "save/load",
        lambda fx: vi.save(fx.model(), fx.tmp() / "m", metadata={"x": object()}),
        names="metadata",
        expect="JSON",
    )
    c.add(
        "save(metadata=[1, 2])",
        "save/load",
        lambda fx: vi.save(fx.model(), fx.tmp() / "m", metadata=[1, 2]),
        names="metadata",
        expect="dict",
    )
    c.add(
        "save(metadata={'x': nan})",
        "save/load",
        lambda fx: vi.save(fx.model(), fx.tmp() / "m", metadata={"x": NAN}),
        names="metadata",
        expect=("NaN", "finite"),
    )

    def failed_save_debris(fx: Fx) -> Any:
        directory = fx.tmp() / "m"
        vi.save(fx.model(), directory)
        try:
            vi.save(fx.model(), directory, metadata={"x": object()})
        except Exception:  # noqa: BLE001 - the failure is expected; the debris is the test
            pass
        extra = sorted(
            p.name
            for p in directory.iterdir()
            if p.name not in ("model.safetensors", "config.json")
        )
        return Problem(f"a failed save left {extra}") if extra else vi.load(directory)

    c.add(
        "a save that fails leaves no staged files",
        "save/load",
        failed_save_debris,
        ok_if_accepted=True,
    )
    c.add(
        "save a model with a NaN weight",
        "save/load",
        lambda fx: vi.save(nan_weight_model(fx), fx.tmp() / "m"),
        names=("W_Q", "blocks.0.attn.W_Q"),
        expect=("NaN", "finite"),
    )
    c.add(
        "save a model with an inf weight",
        "save/load",
        lambda fx: vi.save(nan_weight_model(fx, INF), fx.tmp() / "m"),
        names=("W_Q", "blocks.0.attn.W_Q"),
        expect=("inf", "finite"),
    )

    def load_after(edit: Callable[[Fx, Path], Any]) -> Callable[[Fx], Any]:
        def run(fx: Fx) -> Any:
            path = fx.saved()
            edit(fx, path)
            return vi.load(path)

        return run

    c.add(
        "load a missing path",
        "save/load",
        lambda fx: vi.load(fx.tmp() / "missing"),
        names=("missing",),
        expect="directory",
    )
    c.add(
        "load a file",
        "save/load",
        lambda fx: vi.load(fx.file()),
        names=("a_file.txt",),
        expect="directory",
    )
    c.add(
        "load an empty directory",
        "save/load",
        lambda fx: vi.load(fx.tmp("empty")),
        names=("config.json", "model.safetensors"),
    )
    c.add("load(None)", "save/load", lambda fx: vi.load(None), names="path")
    c.add("load(123)", "save/load", lambda fx: vi.load(123), names="path")
    c.add(
        "load(path, device='nope')",
        "save/load",
        lambda fx: vi.load(fx.saved(), device="nope"),
        names=("device", "nope"),
    )
    c.add(
        "load: config.json is not JSON",
        "save/load",
        load_after(lambda fx, p: (p / "config.json").write_text("{not json")),
        names="config.json",
    )
    c.add(
        "load: model.safetensors missing",
        "save/load",
        load_after(lambda fx, p: (p / "model.safetensors").unlink()),
        names="model.safetensors",
    )
    c.add(
        "load: model.safetensors truncated",
        "save/load",
        load_after(lambda fx, p: truncate(p / "model.safetensors")),
        names="model.safetensors",
    )
    c.add(
        "load: model.safetensors is a pickle (torch.save)",
        "save/load",
        load_after(lambda fx, p: torch.save(fx.model().state_dict(), p / "model.safetensors")),
        names="model.safetensors",
    )
    c.add(
        "load: config eps=inf",
        "save/load",
        load_after(
            lambda fx, p: edit_json(p / "config.json", lambda r: r["config"].update(eps=INF))
        ),
        names="eps",
    )
    c.add(
        "load: config without d_in",
        "save/load",
        load_after(lambda fx, p: edit_json(p / "config.json", lambda r: r["config"].pop("d_in"))),
        names="d_in",
    )
    c.add(
        "load: config with an unknown field",
        "save/load",
        load_after(
            lambda fx, p: edit_json(p / "config.json", lambda r: r["config"].update(d_hidden=3))
        ),
        names="d_hidden",
    )
    c.add(
        "load: config without its 'config' record",
        "save/load",
        load_after(lambda fx, p: edit_json(p / "config.json", lambda r: r.pop("config"))),
        names=("config.json", "config"),
    )
    c.add(
        "load: config format_version=99",
        "save/load",
        load_after(
            lambda fx, p: edit_json(p / "config.json", lambda r: r.update(format_version=99))
        ),
        names=("format_version",),
    )

    def other_config(fx: Fx, p: Path) -> None:
        other = fx.saved(fx.model(d_model=32, d_head=16))
        shutil.copy(other / "config.json", p / "config.json")

    c.add(
        "load: config of another shape (35 tensors differ; message length)",
        "save/load",
        load_after(other_config),
        names=("config.json", "model.safetensors"),
        expect="d_model",
    )

    def same_shape_other_config(fx: Fx, p: Path) -> None:
        other = fx.saved(fx.model(eps=1e-3))
        shutil.copy(other / "config.json", p / "config.json")

    c.add(
        "load: config.json from another save of the same shapes",
        "save/load",
        load_after(same_shape_other_config),
        names=("config.json", "model.safetensors"),
    )

    def flipped(fx: Fx) -> Any:
        model = fx.model()
        path = fx.saved(model)
        flip_tensor_byte(path / "model.safetensors")
        loaded = vi.load(path)
        return (
            Problem("a flipped byte in model.safetensors loaded silently")
            if not same_weights(loaded, model)
            else loaded
        )

    c.add(
        "load: one flipped byte in model.safetensors",
        "save/load",
        flipped,
        names=("model.safetensors", "checksum"),
        ok_if_accepted=True,
    )

    def nan_in_file(fx: Fx) -> Any:
        from safetensors.torch import load_file, save_file

        path = fx.saved()
        tensors = load_file(str(path / "model.safetensors"))
        from safetensors import safe_open

        with safe_open(str(path / "model.safetensors"), framework="pt") as f:
            meta = f.metadata()
        tensors["blocks.0.attn.W_Q"][0, 0, 0] = NAN
        # the header an older vecinterp wrote (no checksum), so that the NaN is what is tested
        meta = {k: v for k, v in (meta or {}).items() if k in ("format", "config")}
        save_file(tensors, str(path / "model.safetensors"), metadata=meta)
        return vi.load(path)

    c.add(
        "load: a NaN weight in the file",
        "save/load",
        nan_in_file,
        names=("blocks.0.attn.W_Q", "model.safetensors"),
        expect=("NaN", "finite"),
    )


def checkpoint_cases(c: Catalogue) -> None:
    def latest(directory: Path) -> Path:
        found = vi.latest_checkpoint(directory)
        assert found is not None
        return found

    def resume_after(edit: Callable[[Fx, Path], Any]) -> Callable[[Fx], Any]:
        def run(fx: Fx) -> Any:
            directory = fx.checkpoints()
            edit(fx, latest(directory))
            return fx.resume(directory)

        return run

    def trainer(edit: Callable[[dict[str, Any]], None]) -> Callable[[Fx, Path], None]:
        return lambda fx, step: edit_json(step / "trainer.json", edit)

    c.add(
        "train(checkpoint_dir=a file)",
        "checkpoints",
        lambda fx: fx.train(checkpoint_dir=fx.file(), checkpoint_every=1),
        names="checkpoint_dir",
        expect="directory",
    )
    c.add(
        "train(checkpoint_dir under a file)",
        "checkpoints",
        lambda fx: fx.train(checkpoint_dir=fx.file() / "run", checkpoint_every=1),
        names="checkpoint_dir",
        expect="directory",
    )
    c.add(
        "train(checkpoint_dir=a new nested directory)",
        "checkpoints",
        lambda fx: fx.train(checkpoint_dir=fx.tmp() / "a" / "b", checkpoint_every=1),
        ok_if_accepted=True,
    )
    c.add(
        "resume: trainer.json step is the string '3'",
        "checkpoints",
        resume_after(trainer(lambda r: r.update(step="3"))),
        names=("step", "trainer.json"),
    )
    c.add(
        "resume: trainer.json without 'step'",
        "checkpoints",
        resume_after(trainer(lambda r: r.pop("step"))),
        names=("step", "trainer.json"),
    )
    c.add(
        "resume: trainer.json without 'optimizer'",
        "checkpoints",
        resume_after(trainer(lambda r: r.pop("optimizer"))),
        names=("optimizer", "trainer.json"),
    )
    c.add(
        "resume: trainer.json is not JSON",
        "checkpoints",
        resume_after(lambda fx, s: (s / "trainer.json").write_text("{")),
        names="trainer.json",
    )
    c.add(
        "resume: optimizer.safetensors truncated",
        "checkpoints",
        resume_after(lambda fx, s: truncate(s / "optimizer.safetensors")),
        names="optimizer.safetensors",
    )
    c.add(
        "resume: optimizer.safetensors missing",
        "checkpoints",
        resume_after(lambda fx, s: (s / "optimizer.safetensors").unlink()),
        names="optimizer.safetensors",
    )
    c.add(
        "resume: rng.safetensors missing",
        "checkpoints",
        resume_after(lambda fx, s: (s / "rng.safetensors").unlink()),
        names="rng.safetensors",
    )
    c.add(
        "resume: history.safetensors truncated",
        "checkpoints",
        resume_after(lambda fx, s: truncate(s / "history.safetensors")),
        names="history.safetensors",
    )
    c.add(
        "resume: model/model.safetensors truncated",
        "checkpoints",
        resume_after(lambda fx, s: truncate(s / "model" / "model.safetensors")),
        names="model.safetensors",
    )

    def flipped_resume(file: str) -> Callable[[Fx], Any]:
        def run(fx: Fx) -> Any:
            directory = fx.checkpoints()
            intact = directory.parent / "intact"
            shutil.copytree(directory, intact)
            flip_tensor_byte(latest(directory) / file)
            got = fx.resume(directory)
            want = fx.resume(intact)
            return (
                Problem(f"a flipped byte in {file} resumed silently")
                if not same_weights(got.model, want.model)
                else got
            )

        return run

    for file in ("optimizer.safetensors", "model/model.safetensors"):
        c.add(
            f"resume: one flipped byte in {file}",
            "checkpoints",
            flipped_resume(file),
            names=(file.split("/")[-1], "checksum"),
            ok_if_accepted=True,
        )
    c.add(
        "resume with another lr",
        "checkpoints",
        lambda fx: fx.resume(fx.checkpoints(), lr=5e-3),
        names="lr",
        ok_if_accepted=True,
    )
    c.add(
        "resume with another model shape",
        "checkpoints",
        lambda fx: fx.resume(fx.checkpoints(), model=fx.model(d_model=32, d_head=16)),
        names=("d_model", "config", "model"),
    )
    c.add(
        "train(resume=True) on an empty directory",
        "checkpoints",
        lambda fx: fx.train(checkpoint_dir=fx.tmp(), checkpoint_every=1, resume=True),
        ok_if_accepted=True,
    )
    c.add(
        "latest_checkpoint(a file)",
        "checkpoints",
        lambda fx: vi.latest_checkpoint(fx.file()),
        names=("checkpoint_dir", "a_file.txt"),
        expect="directory",
    )
    c.add(
        "latest_checkpoint(123)",
        "checkpoints",
        lambda fx: vi.latest_checkpoint(123),
        names="checkpoint_dir",
    )

    class StopSecondRun(Exception):
        """Ends the second run after a few steps taken beside the first."""

    def concurrent(resume: bool) -> Callable[[Fx], Any]:
        def run(fx: Fx) -> Any:
            directory = fx.tmp("shared") / "run"
            report = directory.parent / "first_run_error.txt"
            # a fork shares the imported library: no second start-up of torch
            child = multiprocessing.get_context("fork").Process(
                target=child_train, args=(str(directory), CHILD_STEPS, str(report))
            )
            child.start()
            fx.children.append(child)
            deadline = time.monotonic() + 60

            def writing() -> bool:  # a checkpoint done, and the next one being staged
                return vi.latest_checkpoint(directory) is not None and any(
                    p.name.startswith(".step_") for p in directory.iterdir()
                )

            def stop(step: int, metrics: Any) -> None:
                if step >= 8:
                    raise StopSecondRun

            # a refused second run is tried 10 times, each while the first one is writing
            error: BaseException | None = None
            for _ in range(1 if resume else 10):
                while not writing() and child.is_alive():
                    if time.monotonic() > deadline:
                        raise TimeoutError("the first run wrote no checkpoint in 60 s")
                    time.sleep(0.002)
                if not child.is_alive():
                    break
                try:
                    fx.train(
                        fx.model(**BIG),
                        steps=CHILD_STEPS,
                        checkpoint_dir=directory,
                        checkpoint_every=1,
                        keep_last=2,
                        resume=resume,
                        callback=stop,
                    )
                    error = None
                except Exception as err:  # noqa: BLE001 - the first run's fate decides first
                    error = err
                if error is None or isinstance(error, StopSecondRun):
                    break
            child.join(timeout=3)  # a run whose files were deleted fails at its next checkpoint
            if child.is_alive():
                child.kill()
                child.join()
                if error is None or isinstance(error, StopSecondRun):
                    return Problem("a second run trained in a directory a live run owns")
                raise error
            if child.exitcode != 0:
                return Problem(f"the first run crashed: {_read(report)}")
            raise RuntimeError("the first run ended before the second was done")

        return run

    c.add(
        "a second train() on a live run's checkpoint_dir (resume=True)",
        "checkpoints",
        concurrent(True),
        names=("checkpoint_dir", "lock", "locked", "pid"),
        ok_if_accepted=True,
        timeout=120,
    )
    c.add(
        "a second train() on a live run's checkpoint_dir (resume=False)",
        "checkpoints",
        concurrent(False),
        names=("checkpoint_dir", "lock", "locked", "pid"),
        ok_if_accepted=True,
        timeout=120,
    )

    # issue 33: an ensemble's directories (items 6, 7 and 10)
    def ensemble_dir(fx: Fx) -> Path:
        """An ensemble of two tiny members, checkpointed at steps 1 and 2."""
        directory = fx.tmp("ensemble") / "run"
        vi.train_ensemble([fx.model(), fx.model()], make_batch, steps=2, lr=1e-2, seed=[0, 1],
                          checkpoint_dir=directory, checkpoint_every=1, keep_last=None,
                          progress=False, device="cpu")  # fmt: skip
        return directory

    def resume_ensemble(directory: Path) -> Any:
        return vi.train_ensemble([fx_models[0], fx_models[1]], make_batch, steps=3, lr=1e-2,
                                 seed=[0, 1], checkpoint_dir=directory, checkpoint_every=1,
                                 keep_last=None, resume=True, progress=False,
                                 device="cpu")  # fmt: skip

    fx_models: list[Any] = []

    def member_run(how: str) -> Callable[[Fx], Any]:
        def run(fx: Fx) -> Any:
            import os

            from vecinterp.training.checkpoint import own_directory

            directory = ensemble_dir(fx)
            before = sorted(p.name for p in (directory / "member_000").iterdir())
            held = own_directory(directory)  # as a live ensemble holds it
            here = Path.cwd()
            try:
                if how == "cwd":
                    os.chdir(directory / "member_000")
                    target: Path | str = "."
                else:
                    target = directory.parent / "link"
                    target.symlink_to(directory / "member_000")
                fx.train(steps=4, checkpoint_dir=target, checkpoint_every=1, keep_last=1,
                         resume=True)  # fmt: skip
            finally:
                os.chdir(here)
                held.release()
            after = sorted(p.name for p in (directory / "member_000").iterdir())
            return Problem(f"vi.train ran in a live ensemble's member_000 ({before} -> {after})")

        return run

    for how in ("cwd", "symlink"):
        c.add(
            f"train() in a live ensemble's member_000 via {'.' if how == 'cwd' else 'a symlink'}",
            "checkpoints",
            member_run(how),
            names=("checkpoint_dir", "member_000", "ensemble"),
        )

    def with_models(edit: Callable[[Path], None]) -> Callable[[Fx], Any]:
        def run(fx: Fx) -> Any:
            directory = ensemble_dir(fx)
            fx_models[:] = [fx.model(), fx.model()]
            edit(directory)
            return resume_ensemble(directory)

        return run

    def fifo_marker(directory: Path) -> None:
        import os

        (directory / "ensemble.json").unlink()
        os.mkfifo(directory / "ensemble.json")

    def swap_members(directory: Path) -> None:
        (directory / "member_000").rename(directory / "swap")
        (directory / "member_001").rename(directory / "member_000")
        (directory / "swap").rename(directory / "member_001")

    for label, edit, names in [
        ("ensemble.json a FIFO", fifo_marker, ("ensemble.json", "FIFO")),
        ("member directories swapped", swap_members, ("member_000", "trainer.json")),
        (
            "ensemble.json lost, every member holding checkpoints",
            lambda d: (d / "ensemble.json").unlink(),
            ("ensemble.json",),
        ),
    ]:
        c.add(f"resume an ensemble: {label}", "checkpoints", with_models(edit), names=names,
              timeout=30)  # fmt: skip


def training_cases(c: Catalogue) -> None:
    args: list[tuple[str, Any, bool]] = [
        ("steps", 0, False),
        ("steps", -1, False),
        ("steps", 2.5, False),
        ("steps", "3", False),
        ("steps", True, False),
        ("steps", NAN, False),
        ("steps", None, False),
        ("lr", NAN, False),
        ("lr", INF, False),
        ("lr", -1e-3, False),
        ("lr", 0.0, True),
        ("lr", "1e-3", False),
        ("lr", None, False),
        ("weight_decay", NAN, False),
        ("weight_decay", -1.0, False),
        ("weight_decay", INF, False),
        ("betas", (1.5, 0.9), False),
        ("betas", (0.9,), False),
        ("betas", (NAN, 0.9), False),
        ("betas", 0.9, False),
        ("eps", NAN, False),
        ("eps", -1.0, False),
        ("eps", INF, False),
        ("eps", 0.0, True),
        ("warmup_steps", -1, False),
        ("warmup_steps", 2.5, False),
        ("warmup_steps", 100, True),
        ("schedule", "bogus", False),
        ("schedule", "Cosine", True),
        ("schedule", None, False),
        ("min_lr", NAN, False),
        ("min_lr", -1.0, False),
        ("min_lr", 1.0, False),
        ("grad_clip", 0.0, False),
        ("grad_clip", -1.0, False),
        ("grad_clip", NAN, False),
        ("grad_clip", INF, True),
        ("ema_decay", 1.5, False),
        ("ema_decay", NAN, False),
        ("ema_decay", 0.0, False),
        ("ema_decay", 1.0, False),
        ("ema_start", -1, False),
        ("eval_every", 0, False),
        ("eval_every", -1, False),
        ("checkpoint_every", 0, False),
        ("checkpoint_every", -1, False),
        ("checkpoint_every", 2.5, False),
        ("keep_last", 0, False),
        ("keep_last", -1, False),
        ("keep_last", 2.5, False),
        ("resume", "yes", False),
        ("seed", -1, False),
        ("seed", "0", False),
        ("seed", 1.5, False),
        ("device", "nope", False),
        ("device", "cuda:99", False),
        ("log_every", 0, False),
        ("log_every", -1, False),
        ("callback", 5, False),
        ("progress", "no", False),
    ]
    needs = {
        "eval_every": dict(eval_data=[make_batch(0, torch.Generator())]),
        "checkpoint_every": dict(checkpoint_dir=None),
        "keep_last": dict(checkpoint_every=1),
        "ema_start": dict(ema_decay=0.9),
    }
    for arg, value, ok in args:

        def run(fx: Fx, a: str = arg, v: Any = value) -> Any:
            extra = dict(needs.get(a, {}))
            if a in ("checkpoint_every", "keep_last", "resume"):
                extra["checkpoint_dir"] = fx.tmp() / "run"
                extra.setdefault("checkpoint_every", 1)
            return fx.train(**{**extra, a: v})

        c.add(f"train({arg}={value!r})", "training", run, names=arg, ok_if_accepted=ok)
    c.add(
        "train(ema_start=10 >= steps=3)",
        "training",
        lambda fx: fx.train(ema_decay=0.9, ema_start=10),
        names="ema_start",
        ok_if_accepted=True,
    )
    c.add(
        "train(ema_start=1) without ema_decay",
        "training",
        lambda fx: fx.train(ema_start=1),
        names="ema_start",
    )
    c.add(
        "train(eval_every=1) without eval_data",
        "training",
        lambda fx: fx.train(eval_every=1),
        names="eval_data",
    )
    c.add(
        "train(checkpoint_every=1) without checkpoint_dir",
        "training",
        lambda fx: fx.train(checkpoint_every=1),
        names="checkpoint_dir",
    )
    c.add(
        "train(resume=True) without checkpoint_dir",
        "training",
        lambda fx: fx.train(resume=True),
        names="checkpoint_dir",
    )
    c.add(
        "train(cfg) (not a model)",
        "training",
        lambda fx: vi.train(fx.cfg(), make_batch, steps=2, lr=1e-2, progress=False),
        names="model",
        expect="HookedVectorTransformer",
    )
    c.add(
        "train a model with a NaN weight",
        "training",
        lambda fx: fx.train(nan_weight_model(fx)),
        names=("W_Q", "blocks.0.attn.W_Q"),
        expect=("NaN", "finite"),
    )

    def gen(make: Callable[[torch.Generator], Any]) -> Callable[[int, torch.Generator], Any]:
        return lambda step, g: make(g)

    def x(g: torch.Generator, pos: int = 5, d: int = 4) -> torch.Tensor:
        return torch.randn(4, pos, d, generator=g)

    def nan(t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        t[0, 1, 2] = NAN
        return t

    datas: list[tuple[str, Any, tuple[str, ...], tuple[str, ...], bool]] = [
        ("None", None, ("data",), (), False),
        ("[] (no batches)", [], ("data",), (), False),
        ("5", 5, ("data",), (), False),
        ("a string", "data", ("data",), (), False),
        ("one tensor x (no targets)", torch.randn(4, 5, 4), ("data", "targets"), (), False),
        (
            "make_batch(step) with one argument",
            lambda step: (torch.randn(4, 5, 4),) * 2,
            ("data", "make_batch"),
            (),
            False,
        ),
        ("make_batch returning None", gen(lambda g: None), ("make_batch", "data"), (), False),
        (
            "batches of a 4-tuple",
            gen(lambda g: (x(g), x(g), None, None)),
            ("make_batch", "batch"),
            (),
            False,
        ),
        (
            "batches of a dict",
            gen(lambda g: {"inputs": x(g), "targets": x(g)}),
            ("make_batch", "batch"),
            (),
            True,
        ),
        (
            "inputs with last axis 3",
            gen(lambda g: (x(g, d=3), x(g))),
            ("inputs", "x"),
            ("d_in",),
            False,
        ),
        (
            "inputs with 7 positions > n_ctx",
            gen(lambda g: (x(g, 7), x(g, 7))),
            ("inputs", "x"),
            ("n_ctx",),
            False,
        ),
        (
            "targets with last axis 3",
            gen(lambda g: (x(g), x(g, d=3))),
            ("targets",),
            ("d_out",),
            False,
        ),
        ("NaN inputs", gen(lambda g: (nan(x(g)), x(g))), ("inputs", "make_batch"), (), False),
        ("NaN targets", gen(lambda g: (x(g), nan(x(g)))), ("targets",), (), False),
        ("int64 inputs", gen(lambda g: (x(g).long(), x(g))), ("inputs",), ("float",), False),
        ("float64 inputs", gen(lambda g: (x(g).double(), x(g).double())), ("inputs",), (), True),
        (
            "loss_mask a list",
            gen(lambda g: (x(g), x(g), [[True] * 5] * 4)),
            ("loss_mask",),
            (),
            False,
        ),
        (
            "loss_mask all False",
            gen(lambda g: (x(g), x(g), torch.zeros(4, 5, dtype=torch.bool))),
            ("loss_mask",),
            (),
            False,
        ),
    ]
    for label, data, names, expect, ok in datas:
        c.add(
            f"train(data={label})",
            "training",
            lambda fx, d=data: fx.train(data=d),
            names=names,
            expect=expect,
            ok_if_accepted=ok,
        )
    c.add(
        "train(eval_data='x')",
        "training",
        lambda fx: fx.train(eval_data="x", eval_every=1),
        names="eval_data",
    )
    c.add(
        "train(eval_data=[])",
        "training",
        lambda fx: fx.train(eval_data=[], eval_every=1),
        names="eval_data",
    )
    c.add(
        "train(eval_data=[NaN batch])",
        "training",
        lambda fx: fx.train(eval_data=[(fx.nan_x(), fx.t())], eval_every=1),
        names=("eval_data",),
    )
    for label, kw, names in [
        ("step=-1", dict(step=-1, lr=1e-3, steps=10), ("step",)),
        ("lr=nan", dict(step=1, lr=NAN, steps=10), ("lr",)),
        ("steps=0", dict(step=1, lr=1e-3, steps=0), ("steps",)),
        ("schedule='bogus'", dict(step=1, lr=1e-3, steps=10, schedule="bogus"), ("schedule",)),
        ("warmup_steps=-1", dict(step=1, lr=1e-3, steps=10, warmup_steps=-1), ("warmup_steps",)),
        ("step=11 > steps=10", dict(step=11, lr=1e-3, steps=10), ("step",)),
    ]:
        c.add(f"lr_at({label})", "training", lambda fx, k=kw: vi.lr_at(**k), names=names)
    c.add(
        "evaluate(model, None)", "training", lambda fx: vi.evaluate(fx.model(), None), names="data"
    )
    c.add("evaluate(model, [])", "training", lambda fx: vi.evaluate(fx.model(), []), names="data")
    c.add(
        "evaluate(model, batches, n_batches=0)",
        "training",
        lambda fx: vi.evaluate(fx.model(), [(fx.x(), fx.t())], n_batches=0),
        names="n_batches",
    )
    c.add(
        "evaluate(model, [NaN batch])",
        "training",
        lambda fx: vi.evaluate(fx.model(), [(fx.nan_x(), fx.t())]),
        names=("inputs", "data"),
    )
    c.add(
        "evaluate('model', batches)",
        "training",
        lambda fx: vi.evaluate("model", [(fx.x(), fx.t())]),
        names="model",
    )

    # issue 34: threads="auto" is the default; a bad count names the argument
    for bad in ("all", 0, -2, 1.5):
        c.add(
            f"train(threads={bad!r})",
            "training",
            lambda fx, b=bad: fx.train(threads=b),
            names="threads",
        )


def loss_cases(c: Catalogue) -> None:
    def mse(fx: Fx, **kw: Any) -> Any:
        args = dict(pred=fx.x(), target=fx.t())
        args.update(kw)
        return vi.masked_mse(**args)

    for label, kw, names, ok in [
        ("target of another shape", lambda fx: dict(target=fx.t(d=3)), ("target",), False),
        ("target rank 2 (would broadcast)", lambda fx: dict(target=fx.t()[0]), ("target",), False),
        ("NaN target", lambda fx: dict(target=fx.nan_x(seed=2)), ("target",), False),
        ("pred a list", lambda fx: dict(pred=fx.x().tolist()), ("pred",), False),
        ("loss_mask a list", lambda fx: dict(loss_mask=[[True] * 5] * 2), ("loss_mask",), False),
        ("loss_mask float 0/1", lambda fx: dict(loss_mask=torch.ones(2, 5)), ("loss_mask",), True),
        (
            "loss_mask [2, 4]",
            lambda fx: dict(loss_mask=torch.ones(2, 4, dtype=torch.bool)),
            ("loss_mask",),
            False,
        ),
        (
            "loss_mask all False",
            lambda fx: dict(loss_mask=torch.zeros(2, 5, dtype=torch.bool)),
            ("loss_mask",),
            False,
        ),
        ("reduction='bogus'", lambda fx: dict(reduction="bogus"), ("reduction",), False),
        (
            "float64 pred, float32 target",
            lambda fx: dict(pred=fx.x(dtype=torch.float64)),
            ("pred", "target"),
            True,
        ),
    ]:
        c.add(
            f"masked_mse: {label}",
            "loss",
            lambda fx, k=kw: mse(fx, **k(fx)),
            names=names,
            ok_if_accepted=ok,
        )


def factored_cases(c: Catalogue) -> None:
    FM = vi.FactoredMatrix

    def r(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.randn(*shape, generator=torch.Generator().manual_seed(3)).to(dtype)

    for label, make, names, ok in [
        ("inner dimensions 4 and 5", lambda fx: FM(r(3, 4), r(5, 3)), ("A", "B"), False),
        ("A of rank 1", lambda fx: FM(r(4), r(4, 3)), ("A",), False),
        ("A a list", lambda fx: FM(r(3, 4).tolist(), r(4, 3)), ("A",), False),
        ("int64 factors", lambda fx: FM(r(3, 4).long(), r(4, 3).long()), ("A", "B"), False),
        (
            "float32 A, float64 B",
            lambda fx: FM(r(3, 4), r(4, 3, dtype=torch.float64)),
            ("A", "B"),
            True,
        ),
        ("NaN in A", lambda fx: FM(torch.full((3, 4), NAN), r(4, 3)), ("A",), False),
        ("A on meta, B on cpu", lambda fx: FM(r(3, 4).to("meta"), r(4, 3)), ("A", "B"), False),
        ("batch axes 2 and 3", lambda fx: FM(r(2, 3, 4), r(3, 4, 3)), ("A", "B"), False),
    ]:
        c.add(f"FactoredMatrix: {label}", "factored", make, names=names, ok_if_accepted=ok)
    for half in (torch.bfloat16, torch.float16):
        for what, op in [
            ("eigenvalues", lambda m: m.eigenvalues),
            ("svd()", lambda m: m.svd()),
            ("norm()", lambda m: m.norm()),
            ("eigenvalue_scores", vi.eigenvalue_scores),
        ]:
            c.add(
                f"{str(half)[6:]} factors: {what}",
                "tl-habits",
                lambda fx, h=half, o=op: o(FM(r(4, 3, dtype=h), r(3, 4, dtype=h))),
                names=("dtype", str(half)[6:]),
                ok_if_accepted=True,
            )
    c.add(
        "bfloat16 model: composition_scores",
        "tl-habits",
        lambda fx: vi.composition_scores(fx.model(dtype=torch.bfloat16), kind="K"),
        names=("dtype", "bfloat16"),
        ok_if_accepted=True,
        scan=VALID_PAIRS,
    )
    c.add(
        "eigenvalues of a non-square product",
        "factored",
        lambda fx: FM(r(3, 4), r(4, 5)).eigenvalues,
        names=("square",),
        expect=("ldim", "rdim"),
    )
    c.add(
        "fm @ a tensor of the wrong size",
        "factored",
        lambda fx: FM(r(3, 4), r(4, 3)) @ r(5, 2),
        names=("other", "operand"),
        expect="rdim",
    )
    c.add(
        "fm[99] on a batch of 2",
        "factored",
        lambda fx: FM(r(2, 3, 4), r(2, 4, 3))[99],
        names=("index", "99"),
    )
    c.add(
        "fm.get_corner(k=0)", "factored", lambda fx: FM(r(3, 4), r(4, 3)).get_corner(0), names="k"
    )
    c.add(
        "fm.get_corner(k=-1)", "factored", lambda fx: FM(r(3, 4), r(4, 3)).get_corner(-1), names="k"
    )


def analysis_cases(c: Catalogue) -> None:
    circuits = {
        "ov_circuit": vi.ov_circuit,
        "qk_circuit": vi.qk_circuit,
        "full_ov_circuit": vi.full_ov_circuit,
        "full_qk_circuit": vi.full_qk_circuit,
        "pos_qk_circuit": vi.pos_qk_circuit,
    }
    for name, fn in circuits.items():
        for layer in (5, -5, "0", 1.5, True):
            c.add(
                f"{name}(layer={layer!r})",
                "analysis.circuits",
                lambda fx, f=fn, v=layer: f(fx.model(), layer=v),
                names="layer",
                expect="n_layers",
            )
        c.add(
            f"{name}(cfg) (not a model)",
            "analysis.circuits",
            lambda fx, f=fn: f(fx.cfg()),
            names="model",
            expect="HookedVectorTransformer",
        )
    for positional in ("rotary", "none"):
        c.add(
            f"pos_qk_circuit of a positional={positional!r} model",
            "analysis.circuits",
            lambda fx, p=positional: vi.pos_qk_circuit(fx.model(positional=p)),
            names=("positional", positional),
        )
    c.add(
        "full_ov_circuit(include_embed_bias='yes')",
        "analysis.circuits",
        lambda fx: vi.full_ov_circuit(fx.model(), include_embed_bias="yes"),
        names="include_embed_bias",
    )
    # scores
    c.add(
        "eigenvalue_scores('x')",
        "analysis.scores",
        lambda fx: vi.eigenvalue_scores("x"),
        names="circuit",
        expect="FactoredMatrix",
    )
    c.add(
        "eigenvalue_scores(model, kind='X')",
        "analysis.scores",
        lambda fx: vi.eigenvalue_scores(fx.model(), kind="X"),
        names="kind",
        expect="OV",
    )
    c.add(
        "eigenvalue_scores of a non-square FactoredMatrix",
        "analysis.scores",
        lambda fx: vi.eigenvalue_scores(vi.FactoredMatrix(torch.randn(3, 4), torch.randn(4, 5))),
        names=("circuit", "square"),
    )
    c.add(
        "eigenvalue_scores of a FactoredMatrix with NaN",
        "analysis.scores",
        lambda fx: vi.eigenvalue_scores(
            vi.FactoredMatrix(torch.full((3, 2), NAN), torch.randn(2, 3))
        ),
        names=("circuit", "A"),
        expect="NaN",
    )
    c.add(
        "eigenvalue_scores of a model whose norms are not folded",
        "tl-habits",
        lambda fx: vi.eigenvalue_scores(fx.model(), kind="ov"),
        names=("fold_layer_norm", "fold_ln"),
        expect=("folded",),
        ok_if_accepted=True,
        warn_ok=True,
    )
    for kind in ("X", "q", None):
        c.add(
            f"composition_scores(kind={kind!r})",
            "analysis.scores",
            lambda fx, k=kind: vi.composition_scores(fx.model(), kind=k),
            names="kind",
            expect="K",
            ok_if_accepted=kind == "q",
            scan=VALID_PAIRS,
        )
    c.add(
        "composition_scores(baseline='yes')",
        "analysis.scores",
        lambda fx: vi.composition_scores(fx.model(), kind="K", baseline="yes"),
        names="baseline",
        scan=VALID_PAIRS,
    )
    c.add(
        "composition_scores of a 1-layer model",
        "analysis.scores",
        lambda fx: vi.composition_scores(fx.model(n_layers=1), kind="K"),
        names="n_layers",
        ok_if_accepted=True,
        scan=VALID_PAIRS,
    )
    for n in (0, 1, -1, 2.5):
        c.add(
            f"composition_baseline(n_samples={n})",
            "analysis.scores",
            lambda fx, v=n: vi.composition_baseline(fx.model(), kind="K", n_samples=v),
            names="n_samples",
        )
    c.add(
        "composition_baseline(kind='X')",
        "analysis.scores",
        lambda fx: vi.composition_baseline(fx.model(), kind="X"),
        names="kind",
    )
    c.add(
        "composition_scores without kind",
        "analysis.scores",
        lambda fx: vi.composition_scores(fx.model()),
        names="kind",
        scan=VALID_PAIRS,
    )
    ablation_cases(c)
    patching_cases(c)
    circuit_discovery_cases(c)
    attribution_cases(c)
    geometry_cases(c)
    detector_cases(c)
    emergence_cases(c)

    # issue 33 (items 9, 11, 14) and 34 (threads=, kind): probes, subspaces, ablation
    cat = "analysis.probes"

    def probes(fx: Fx, kw: Any) -> Any:
        x = fx.x(batch=40)
        args: dict[str, Any] = dict(model=fx.model(), x=x, targets=x[:, 0, 0],
                                    hook_names="blocks.0.hook_resid_pre", n_bootstrap=2,
                                    progress=False)  # fmt: skip
        args.update(kw(fx) if callable(kw) else kw)
        return vi.fit_probes(**args)

    for label, kw, names, ok in [
        ("targets [batch, pos]", lambda fx: dict(targets=fx.x(batch=40)[..., 0]),
         ("targets",), False),
        ("seed=2**64-1", dict(seed=2**64 - 1), ("seed",), True),
        ("threads=0", dict(threads=0), ("threads",), False),
        ("threads='auto'", dict(threads="auto"), ("threads",), True),
        ("a gated MLP's hook_pre_linear",
         lambda fx: dict(model=fx.model(gated_mlp=True), hook_names="blocks.0.mlp.hook_pre_linear"),
         ("hook_names",), True),
    ]:  # fmt: skip
        c.add(f"fit_probes({label})", cat, lambda fx, k=kw: probes(fx, k), names=names,
              ok_if_accepted=ok)  # fmt: skip
    c.add(
        "orthonormal_basis(0-d tensor)",
        cat,
        lambda fx: vi.orthonormal_basis(torch.tensor(1.0)),
        names="subspace",
    )
    c.add(
        "subspace_patch_hook(index=(7,)) out of range",
        cat,
        lambda fx: vi.subspace_patch_hook(fx.x(), torch.ones(4), (7,)),
        names="index",
    )
    c.add(
        "ablate_heads without kind",
        "analysis.ablation",
        lambda fx: vi.ablate_heads(fx.model(), fx.x(), (0, 0)),
        names="kind",
        warn_ok=True,
    )
    c.add(
        "error_curves([model], batch)",
        "tasks",
        lambda fx: linear_regression.error_curves([fx.model()], linear_regression.generate(4)),
        names="model",
    )


def ablation_cases(c: Catalogue) -> None:
    cat = "analysis.ablation"

    def heads(fx: Fx, **kw: Any) -> Any:
        args: dict[str, Any] = dict(model=fx.model(), x=fx.x(), heads=(0, 0), kind="zero")
        args.update(kw)
        return vi.ablate_heads(**args)

    for spec in (
        {5: [0]},
        (0, 5),
        (-5, 0),
        [],
        "none",
        1.0,
        [(0, 0, 0)],
        {0: [9]},
        {"0": [0]},
        [(0, 1.0)],
        None,
    ):
        c.add(
            f"ablate_heads(heads={spec!r})",
            cat,
            lambda fx, s=spec: heads(fx, heads=s),
            names="heads",
            expect=("n_layers", "n_heads", "(layer, head)"),
        )
    pop_cases: list[tuple[str, Callable[[Fx], Any], tuple[str, ...], bool]] = [
        ("NaN", lambda fx: fx.nan_x(batch=8), ("NaN",), False),
        ("inf", lambda fx: fx.nan_x(batch=8, value=INF), ("inf",), False),
        ("last axis 3", lambda fx: fx.x(batch=8, d=3), ("d_in",), False),
        ("rank 2", lambda fx: fx.x(batch=8)[0], ("rank",), False),
        ("3 positions for 5", lambda fx: fx.x(batch=8, pos=3), ("positions",), False),
        ("7 positions > n_ctx", lambda fx: fx.x(batch=8, pos=7), ("n_ctx",), False),
        ("float64", lambda fx: fx.x(batch=8, dtype=torch.float64), ("float32",), True),
        ("a list", lambda fx: fx.x(batch=8).tolist(), ("Tensor",), False),
        ("int64", lambda fx: fx.x(batch=8).long(), ("float",), False),
        ("batch 0", lambda fx: fx.x(batch=0), ("batch",), False),
    ]
    for label, make, expect, ok in pop_cases:
        c.add(
            f"ablate_heads(kind='mean'): population {label}",
            cat,
            lambda fx, m=make: heads(fx, kind="mean", population=m(fx)),
            names="population",
            expect=expect,
            ok_if_accepted=ok,
        )
    for label, make, expect, ok in pop_cases[:6]:
        c.add(
            f"head_ablation_sweep: population {label}",
            cat,
            lambda fx, m=make: vi.head_ablation_sweep(
                fx.model(), fx.x(), fx.t(), "mean", population=m(fx), progress=False
            ),
            names="population",
            expect=expect,
            ok_if_accepted=ok,
        )
    c.add(
        "ablate_heads(kind='mean') without population",
        cat,
        lambda fx: heads(fx, kind="mean"),
        names="population",
    )
    c.add(
        "ablate_heads(kind='bogus')",
        cat,
        lambda fx: heads(fx, kind="bogus"),
        names="kind",
        expect="zero",
    )
    c.add(
        "ablate_heads(hook='bogus')",
        cat,
        lambda fx: heads(fx, hook="bogus"),
        names="hook",
        expect="z",
    )
    for pos in (99, -99, [], [0, 99], 1.5):
        c.add(
            f"ablate_heads(positions={pos!r})",
            cat,
            lambda fx, p=pos: heads(fx, positions=p),
            names="positions",
            expect="pos",
        )
    c.add("ablate_heads: x with NaN", cat, lambda fx: heads(fx, x=fx.nan_x()), names="x")
    c.add(
        "ablate_heads(kind='resample'): resample_source of the wrong shape",
        cat,
        lambda fx: heads(fx, kind="resample", resample_source=fx.x(batch=3, pos=2)),
        names="resample_source",
    )
    c.add(
        "ablate_heads(kind='resample'): resample_source with NaN",
        cat,
        lambda fx: heads(fx, kind="resample", resample_source=fx.nan_x()),
        names="resample_source",
        expect="NaN",
    )
    c.add(
        "ablate_heads(kind='resample') without resample_source",
        cat,
        lambda fx: heads(fx, kind="resample"),
        names="resample_source",
        ok_if_accepted=True,
    )
    c.add(
        "ablate_heads(kind='resample', seed='x')",
        cat,
        lambda fx: heads(fx, kind="resample", population=fx.x(batch=8), seed="x"),
        names="seed",
    )

    def abl(fx: Fx, **kw: Any) -> Any:
        args: dict[str, Any] = dict(model=fx.model(), x=fx.x(), components=("mlp_out", 0))
        args.update(kw)
        return vi.ablate(**args)

    for comp in ("bogus", ("mlp_out", 5), [], ("mlp_out",), 5):
        c.add(
            f"ablate(components={comp!r})",
            cat,
            lambda fx, v=comp: abl(fx, components=v),
            names=("components", repr(comp)),
            expect=("hook", "n_layers"),
        )
    c.add("ablate(kind='bogus')", cat, lambda fx: abl(fx, kind="bogus"), names="kind")
    c.add("ablate(positions=99)", cat, lambda fx: abl(fx, positions=99), names="positions")
    c.add(
        "ablate(kind='mean'): population NaN",
        cat,
        lambda fx: abl(fx, kind="mean", population=fx.nan_x(batch=8)),
        names="population",
    )
    c.add(
        "ablate(kind='mean'): population 7 positions",
        cat,
        lambda fx: abl(fx, kind="mean", population=fx.x(batch=8, pos=7)),
        names="population",
    )

    def pats(fx: Fx, spec: Any) -> Any:
        return vi.ablate_patterns(fx.model(), fx.x(), spec)

    for label, spec, ok in [
        ("{(0, 5): 'uniform'}", lambda: {(0, 5): "uniform"}, False),
        ("{(5, 0): 'identity'}", lambda: {(5, 0): "identity"}, False),
        ("{(0, 0): 'bogus'}", lambda: {(0, 0): "bogus"}, False),
        ("{(0, 0): a [3, 3] map for 5 positions}", lambda: {(0, 0): torch.eye(3)}, False),
        ("{(0, 0): a map with NaN}", lambda: {(0, 0): torch.full((5, 5), NAN)}, False),
        ("{(0, 0): a map with rows not summing to 1}", lambda: {(0, 0): torch.ones(5, 5)}, False),
        ("{} (nothing)", lambda: {}, True),
        ("{0: 'uniform'} (key not a pair)", lambda: {0: "uniform"}, False),
        ("[(0, 0)] (not a dict)", lambda: [(0, 0)], False),
    ]:
        c.add(
            f"ablate_patterns({label})",
            cat,
            lambda fx, s=spec: pats(fx, s()),
            names=("patterns", "(0, 0)", "(0, 5)", "(5, 0)"),
            expect=("uniform", "[5, 5]", "finite", "sum to 1", "(layer, head)"),
            ok_if_accepted=ok,
        )

    def sweep(fx: Fx, **kw: Any) -> Any:
        args: dict[str, Any] = dict(
            model=fx.model(), x=fx.x(), targets=fx.t(), kind="zero", progress=False
        )
        args.update(kw)
        return vi.head_ablation_sweep(**args)

    for label, kw, names, ok in [
        ("targets NaN", lambda fx: dict(targets=fx.nan_x(seed=2)), ("targets",), False),
        ("targets inf", lambda fx: dict(targets=fx.nan_x(seed=2, value=INF)), ("targets",), False),
        ("targets last axis 3", lambda fx: dict(targets=fx.t(d=3)), ("targets",), False),
        ("targets 4 positions", lambda fx: dict(targets=fx.t(pos=4)), ("targets",), False),
        ("targets a list", lambda fx: dict(targets=fx.t().tolist()), ("targets",), False),
        ("loss_mask a list", lambda fx: dict(loss_mask=[[True] * 5] * 2), ("loss_mask",), False),
        (
            "loss_mask all False",
            lambda fx: dict(loss_mask=torch.zeros(2, 5, dtype=torch.bool)),
            ("loss_mask",),
            False,
        ),
        (
            "loss_mask [2, 4]",
            lambda fx: dict(loss_mask=torch.ones(2, 4, dtype=torch.bool)),
            ("loss_mask",),
            False,
        ),
        ("kind='bogus'", lambda fx: dict(kind="bogus"), ("kind",), False),
        ("heads='bogus'", lambda fx: dict(heads="bogus"), ("heads",), False),
        ("heads=[] ", lambda fx: dict(heads=[]), ("heads",), False),
        ("chunk_size=0", lambda fx: dict(chunk_size=0), ("chunk_size",), False),
        ("chunk_size=-1", lambda fx: dict(chunk_size=-1), ("chunk_size",), False),
        ("chunk_size=1.5", lambda fx: dict(chunk_size=1.5), ("chunk_size",), False),
        (
            "metric returning a vector",
            lambda fx: dict(metric=lambda y, t: (y - t).sum(-1)),
            ("metric",),
            False,
        ),
        ("metric not callable", lambda fx: dict(metric="mse"), ("metric",), False),
        ("x with 7 positions", lambda fx: dict(x=fx.x(pos=7), targets=fx.t(pos=7)), ("x",), False),
        ("x NaN", lambda fx: dict(x=fx.nan_x()), ("x",), False),
        ("hook='bogus'", lambda fx: dict(hook="bogus"), ("hook",), False),
        ("kind='mean' without population", lambda fx: dict(kind="mean"), ("population",), False),
    ]:
        c.add(
            f"head_ablation_sweep: {label}",
            cat,
            lambda fx, k=kw: sweep(fx, **k(fx)),
            names=names,
            ok_if_accepted=ok,
        )
    # mean activations and the hook factories
    c.add(
        "mean_activations(names='nope')",
        cat,
        lambda fx: vi.mean_activations(fx.model(), fx.x(batch=8), "nope"),
        names=("names", "nope"),
    )
    c.add(
        "mean_activations(names=[])",
        cat,
        lambda fx: vi.mean_activations(fx.model(), fx.x(batch=8), []),
        names="names",
    )
    c.add(
        "mean_activations: population NaN",
        cat,
        lambda fx: vi.mean_activations(fx.model(), fx.nan_x(batch=8), "blocks.0.attn.hook_z"),
        names="population",
        expect="NaN",
    )
    c.add(
        "mean_activations: population rank 2",
        cat,
        lambda fx: vi.mean_activations(fx.model(), fx.x(batch=8)[0], "blocks.0.attn.hook_z"),
        names="population",
    )

    def hooked(fx: Fx, hook: Any, name: str = "blocks.0.attn.hook_z") -> Any:
        return fx.model().run_with_hooks(fx.x(), fwd_hooks=[(name, hook)])

    c.add(
        "zero_ablation_hook(heads=9) on hook_z",
        cat,
        lambda fx: hooked(fx, vi.zero_ablation_hook(heads=9)),
        names="heads",
        expect="n_heads",
    )
    c.add(
        "zero_ablation_hook(positions=9) on hook_z",
        cat,
        lambda fx: hooked(fx, vi.zero_ablation_hook(positions=9)),
        names="positions",
    )
    c.add(
        "zero_ablation_hook(heads=0) on hook_resid_pre (no head axis)",
        cat,
        lambda fx: hooked(fx, vi.zero_ablation_hook(heads=0), "blocks.0.hook_resid_pre"),
        names=("heads", "head axis"),
    )
    c.add("mean_ablation_hook('x')", cat, lambda fx: vi.mean_ablation_hook("x"), names="mean")
    c.add(
        "mean_ablation_hook(mean of the wrong shape) on hook_z",
        cat,
        lambda fx: hooked(fx, vi.mean_ablation_hook(torch.zeros(6, 3, 8))),
        names="mean",
    )
    c.add(
        "mean_ablation_hook(mean with 3 positions for 5) on hook_z",
        cat,
        lambda fx: hooked(fx, vi.mean_ablation_hook(torch.zeros(3, 2, 8))),
        names="mean",
    )
    c.add(
        "resample_ablation_hook(source of the wrong shape) on hook_z",
        cat,
        lambda fx: hooked(fx, vi.resample_ablation_hook(torch.zeros(3, 5, 2, 8))),
        names="source",
        expect="shape",
    )
    c.add(
        "pattern_ablation_hook('bogus', 0)",
        cat,
        lambda fx: vi.pattern_ablation_hook("bogus", 0),
        names="kind",
        expect="uniform",
    )
    c.add(
        "pattern_ablation_hook('uniform', heads=9) on hook_pattern",
        cat,
        lambda fx: hooked(fx, vi.pattern_ablation_hook("uniform", 9), "blocks.0.attn.hook_pattern"),
        names="heads",
    )
    c.add(
        "pattern_ablation_hook(NaN map, 0) on hook_pattern",
        cat,
        lambda fx: hooked(
            fx, vi.pattern_ablation_hook(torch.full((5, 5), NAN), 0), "blocks.0.attn.hook_pattern"
        ),
        names=("kind", "pattern"),
        expect=("NaN", "finite"),
    )


def patching_cases(c: Catalogue) -> None:
    cat = "analysis.patching"

    def metric(y: torch.Tensor) -> torch.Tensor:
        return y.pow(2).mean()

    def patch(fx: Fx, **kw: Any) -> Any:
        args: dict[str, Any] = dict(
            model=fx.model(),
            clean_x=fx.x(),
            corrupted_x=fx.x(seed=5),
            metric=metric,
            hook_name="resid_pre",
            progress=False,
        )
        args.update(kw)
        return vi.activation_patching(**args)

    for label, kw, names in [
        ("corrupted_x NaN", lambda fx: dict(corrupted_x=fx.nan_x()), ("corrupted_x",)),
        ("corrupted_x last axis 3", lambda fx: dict(corrupted_x=fx.x(d=3)), ("corrupted_x",)),
        ("corrupted_x 4 positions", lambda fx: dict(corrupted_x=fx.x(pos=4)), ("corrupted_x",)),
        ("corrupted_x batch 3", lambda fx: dict(corrupted_x=fx.x(batch=3)), ("corrupted_x",)),
        ("corrupted_x 7 positions", lambda fx: dict(corrupted_x=fx.x(pos=7)), ("corrupted_x",)),
        (
            "corrupted_x float64",
            lambda fx: dict(corrupted_x=fx.x(dtype=torch.float64)),
            ("corrupted_x",),
        ),
        ("clean_x NaN", lambda fx: dict(clean_x=fx.nan_x()), ("clean_x",)),
        ("clean_x a list", lambda fx: dict(clean_x=fx.x().tolist()), ("clean_x",)),
        ("hook_name='nope'", lambda fx: dict(hook_name="nope"), ("hook_name", "nope")),
        (
            "hook_name='blocks.9.hook_resid_pre'",
            lambda fx: dict(hook_name="blocks.9.hook_resid_pre"),
            ("hook_name", "blocks.9.hook_resid_pre"),
        ),
        ("by='bogus'", lambda fx: dict(by="bogus"), ("by",)),
        ("by='head' on resid_pre (no head axis)", lambda fx: dict(by="head"), ("by", "hook_name")),
        ("metric returning a vector", lambda fx: dict(metric=lambda y: y.sum(-1)), ("metric",)),
        ("metric returning a string", lambda fx: dict(metric=lambda y: "x"), ("metric",)),
        ("metric not callable", lambda fx: dict(metric="mse"), ("metric",)),
        ("chunk_size=0", lambda fx: dict(chunk_size=0), ("chunk_size",)),
        ("chunk_size=-2", lambda fx: dict(chunk_size=-2), ("chunk_size",)),
        ("clean_cache='x'", lambda fx: dict(clean_cache="x"), ("clean_cache",)),
        (
            "clean_cache of another model's shape",
            lambda fx: dict(clean_cache=fx.cache(fx.model(d_model=32, d_head=16))),
            ("clean_cache",),
        ),
        (
            "clean_cache of another input length",
            lambda fx: dict(clean_cache=fx.model().run_with_cache(fx.x(pos=3))[1]),
            ("clean_cache",),
        ),
        (
            "clean_cache made from corrupted_x",
            lambda fx: dict(clean_cache=fx.model().run_with_cache(fx.x(seed=5))[1]),
            ("clean_cache", "clean_x"),
        ),
    ]:
        c.add(
            f"activation_patching: {label}",
            cat,
            lambda fx, k=kw: patch(fx, **k(fx)),
            names=names,
            expect=("clean activation",) if "clean_cache of" in label else (),
        )
    index_cases = [
        (
            "index=(99,) on hook_resid_pre",
            (99,),
            "blocks.0.hook_resid_pre",
            lambda cache: cache["resid_pre", 0],
        ),
        (
            "index=(-99,) on hook_resid_pre",
            (-99,),
            "blocks.0.hook_resid_pre",
            lambda cache: cache["resid_pre", 0],
        ),
        (
            "index=(slice(None), 9) on hook_z",
            (slice(None), 9),
            "blocks.0.attn.hook_z",
            lambda cache: cache["z", 0],
        ),
        (
            "index=5 (not a tuple)",
            5,
            "blocks.0.hook_resid_pre",
            lambda cache: cache["resid_pre", 0],
        ),
    ]
    for label, index, name, get in index_cases:
        c.add(
            f"patch_hook({label})",
            cat,
            lambda fx, i=index, n=name, g=get: fx.model().run_with_hooks(
                fx.x(), fwd_hooks=[(n, vi.patch_hook(g(fx.cache()), i))]
            ),
            names=("index", "pos", "n_heads"),
        )
    c.add(
        "patch_hook(clean_activation of another shape)",
        cat,
        lambda fx: fx.model().run_with_hooks(
            fx.x(),
            fwd_hooks=[("blocks.0.hook_resid_pre", vi.patch_hook(torch.zeros(2, 3, 16), (1,)))],
        ),
        names=("clean_activation", "blocks.0.hook_resid_pre"),
    )
    c.add("patch_hook('x')", cat, lambda fx: vi.patch_hook("x"), names="clean_activation")

    def qk(fx: Fx, **kw: Any) -> Any:
        args: dict[str, Any] = dict(model=fx.model(), layer=0, heads=[0])
        args.update(kw)
        return vi.patch_qk_identity(**args)

    for label, kw, names, ok in [
        ("layer=5", dict(layer=5), ("layer",), False),
        ("layer='0'", dict(layer="0"), ("layer",), False),
        ("heads=1.0", dict(heads=1.0), ("heads",), False),
        ("heads='bogus'", dict(heads="bogus"), ("heads",), False),
        ("heads=[5]", dict(heads=[5]), ("heads",), False),
        ("heads=[]", dict(heads=[]), ("heads",), False),
        ("heads=[0, 0] (repeated)", dict(heads=[0, 0]), ("heads",), True),
        ("scale=nan", dict(scale=NAN), ("scale",), False),
        ("scale=inf", dict(scale=INF), ("scale",), False),
        ("scale=0", dict(scale=0.0), ("scale",), True),
        ("seed='x'", dict(seed="x"), ("seed",), False),
        ("zero_biases='yes'", dict(zero_biases="yes"), ("zero_biases",), False),
    ]:
        c.add(
            f"patch_qk_identity({label})",
            cat,
            lambda fx, k=kw: qk(fx, **k),
            names=names,
            ok_if_accepted=ok,
        )

    # issue 33 (items 11, 15)
    def nan_cache(fx: Fx) -> Any:
        model = fx.model()
        cache = dict(model.run_with_cache(fx.x())[1].items())
        cache["blocks.1.hook_resid_pre"] = cache["blocks.1.hook_resid_pre"].clone()
        cache["blocks.1.hook_resid_pre"][0, 1, 2] = NAN
        return patch(fx, model=model, clean_cache=cache)

    c.add("activation_patching(clean_cache with NaN)", cat, nan_cache, names="clean_cache")
    c.add(
        "patch_subspace(base_x of another shape)",
        cat,
        lambda fx: vi.patch_subspace(
            fx.model(), fx.x(), fx.x(pos=4), metric, "resid_pre", torch.ones(16), progress=False
        ),  # fmt: skip
        names=("base_x", "source_x"),
    )


def circuit_discovery_cases(c: Catalogue) -> None:
    cat = "analysis.acdc"

    def acdc(fx: Fx, model: Any = None, **kw: Any) -> Any:
        args: dict[str, Any] = dict(threshold=1e-3, progress=False)
        args.update(kw)
        return vi.discover_circuit(model or fx.model(), fx.x(), fx.x(seed=5), **args)

    def log_mse(fx: Fx) -> Any:
        model = fx.model()
        with torch.no_grad():
            y = model(fx.x())
        return acdc(fx, model, metric=lambda out: (out - y).pow(2).mean().log())

    def nan_on_a_few_trials(fx: Fx) -> Any:
        model, calls = fx.model(), []
        with torch.no_grad():
            y = model(fx.x())

        def metric(out: torch.Tensor) -> torch.Tensor:
            calls.append(None)
            value = (out - y).pow(2).mean()
            return value * NAN if len(calls) in (4, 7) else value

        return acdc(fx, model, metric=metric, chunk_size=1)

    def module_hook(fx: Fx) -> Any:
        model = fx.model()
        model.blocks[0].attn.register_forward_hook(lambda m, args, out: out * 0)
        return acdc(fx, model)

    for label, run, names in [
        ("log-MSE metric (-inf on the full model)", log_mse, ("metric",)),
        ("metric NaN on two trials", nan_on_a_few_trials, ("metric",)),
        (
            "a NaN weight",
            lambda fx: acdc(fx, nan_weight_model(fx)),
            ("blocks.0.attn.W_Q",),
        ),
        ("a PyTorch forward hook on blocks.0.attn", module_hook, ("blocks.0.attn",)),
        ("no threshold", lambda fx: acdc(fx, threshold=None), ("threshold",)),
        (
            "threshold and relative_threshold",
            lambda fx: acdc(fx, relative_threshold=0.1),
            ("threshold", "relative_threshold"),
        ),
    ]:
        c.add(f"discover_circuit: {label}", cat, run, names=names)


def attribution_cases(c: Catalogue) -> None:
    cat = "analysis.attribution"

    def da(fx: Fx, kw: Callable[[Fx, Any], dict[str, Any]]) -> Any:
        model = fx.model()
        args: dict[str, Any] = dict(model=model, cache=fx.cache(model), targets=fx.t())
        args.update(kw(fx, model))
        return vi.direct_attribution(**args)

    for label, kw, names in [
        ("targets NaN", lambda fx, m: dict(targets=fx.nan_x(seed=2)), ("targets",)),
        ("targets last axis 3", lambda fx, m: dict(targets=fx.t(d=3)), ("targets",)),
        ("targets 6 positions for 5", lambda fx, m: dict(targets=fx.t(pos=6)), ("targets",)),
        ("targets batch 3", lambda fx, m: dict(targets=fx.t(batch=3)), ("targets",)),
        ("targets a list", lambda fx, m: dict(targets=fx.t().tolist()), ("targets",)),
        ("targets rank 2", lambda fx, m: dict(targets=fx.t()[0]), ("targets",)),
        (
            "cache of another model",
            lambda fx, m: dict(cache=fx.cache(fx.model(d_model=32, d_head=16))),
            ("cache", "model"),
        ),
        ("cache='x'", lambda fx, m: dict(cache="x"), ("cache",)),
        (
            "cache without ln_final.hook_scale",
            lambda fx, m: dict(cache=fx.cache(m, names_filter=lambda n: "scale" not in n)),
            ("ln_final.hook_scale", "cache"),
        ),
        ("components='bogus'", lambda fx, m: dict(components="bogus"), ("components",)),
        ("loss_mask a list", lambda fx, m: dict(loss_mask=[[True] * 5] * 2), ("loss_mask",)),
        (
            "loss_mask [2, 3]",
            lambda fx, m: dict(loss_mask=torch.ones(2, 3, dtype=torch.bool)),
            ("loss_mask",),
        ),
        ("model='x'", lambda fx, m: dict(model="x"), ("model", "HookedVectorTransformer")),
    ]:
        c.add(f"direct_attribution: {label}", cat, lambda fx, k=kw: da(fx, k), names=names)

    def nvt(fx: Fx, **kw: Any) -> Any:
        args: dict[str, Any] = dict(model=fx.model(), x=fx.x())
        args.update(kw)
        return vi.next_vector_targets(**args)

    for label, kw, names in [
        ("final of the wrong shape", lambda fx: dict(final=torch.zeros(2, 3)), ("final",)),
        ("final NaN", lambda fx: dict(final=torch.full((2, 4), NAN)), ("final",)),
        ("x NaN", lambda fx: dict(x=fx.nan_x()), ("x",)),
        ("a model with d_out != d_in", lambda fx: dict(model=fx.model(d_out=3)), ("d_out", "d_in")),
        ("minus_current='yes'", lambda fx: dict(minus_current="yes"), ("minus_current",)),
    ]:
        c.add(f"next_vector_targets: {label}", cat, lambda fx, k=kw: nvt(fx, **k(fx)), names=names)

    def labels_agree(fx: Fx) -> Any:
        model = fx.model()
        cache = fx.cache(model)
        _, resid_labels = cache.decompose_resid(return_labels=True)
        att_labels = vi.direct_attribution(model, cache, fx.t(), components="layers").labels
        mlp_resid = [lab for lab in resid_labels if "mlp" in lab]
        mlp_att = [lab for lab in att_labels if "mlp" in lab]
        return (
            Problem(f"decompose_resid says {mlp_resid[0]!r}, direct_attribution {mlp_att[0]!r}")
            if mlp_resid != mlp_att
            else resid_labels
        )

    c.add(
        "one label scheme: decompose_resid vs direct_attribution",
        "tl-habits",
        labels_agree,
        ok_if_accepted=True,
    )

    def ln_of_layer(method: str) -> Callable[[Fx], Any]:
        def run(fx: Fx) -> Any:
            model = fx.model(dtype=torch.float64)
            x = fx.x(dtype=torch.float64)
            _, cache = model.run_with_cache(x)
            raw = getattr(cache, method)(layer=1, apply_ln=False)
            got = getattr(cache, method)(layer=1, apply_ln=True)
            scale = cache["blocks.1.ln1.hook_scale"]
            centred = raw - raw.mean(-1, keepdim=True)
            want = centred / scale
            err = float((got - want).abs().max())
            return (
                Problem(
                    f"{method}(layer=1, apply_ln=True) is not scaled by block 1's ln1 "
                    f"as in TransformerLens (max diff {err:.2g})"
                )
                if err > 1e-9
                else got
            )

        return run

    for method in ("accumulated_resid", "decompose_resid", "stack_head_results"):
        c.add(
            f"{method}(layer=1, apply_ln=True) uses ln1 of block 1 (TransformerLens)",
            "tl-habits",
            ln_of_layer(method),
            ok_if_accepted=True,
            area=CACHE,
        )


def geometry_cases(c: Catalogue) -> None:
    cat = "analysis.geometry"
    for label, kw, names, ok in [
        ("layer=5", dict(layer=5), ("layer",), False),
        ("layer='0'", dict(layer="0"), ("layer",), False),
        (
            "vectors last axis 4 (d_in, not d_model)",
            dict(vectors=torch.randn(10, 4)),
            ("vectors",),
            False,
        ),
        ("vectors NaN", dict(vectors=torch.full((10, 16), NAN)), ("vectors",), False),
        ("vectors a list", dict(vectors=[[0.0] * 16] * 3), ("vectors",), False),
        ("n_random=0", dict(n_random=0), ("n_random",), False),
        ("n_random=-1", dict(n_random=-1), ("n_random",), False),
        ("n_random=1 (one point)", dict(n_random=1), ("n_random",), False),
        ("n_random=2.5", dict(n_random=2.5), ("n_random",), False),
        (
            "vectors float64 on a float32 model",
            dict(vectors=torch.randn(10, 16, dtype=torch.float64)),
            ("vectors",),
            True,
        ),
    ]:
        c.add(
            f"ov_linearity({label})",
            cat,
            lambda fx, k=kw: vi.ov_linearity(fx.model(), **{"layer": 0, **k}),
            names=names,
            ok_if_accepted=ok,
        )
    for label, kw, names in [
        ("vectors last axis 4", dict(vectors=torch.randn(3, 4)), ("vectors",)),
        ("vectors NaN", dict(vectors=torch.full((3, 16), NAN)), ("vectors",)),
        ("vectors a list", dict(vectors=[[1.0] * 16]), ("vectors",)),
        ("rtol=-1", dict(vectors=torch.randn(3, 16), rtol=-1.0), ("rtol",)),
        ("rtol=nan", dict(vectors=torch.randn(3, 16), rtol=NAN), ("rtol",)),
        ("a zero vector", dict(vectors=torch.zeros(3, 16)), ("vectors",)),
    ]:
        c.add(
            f"fraction_outside_embedding({label})",
            cat,
            lambda fx, k=kw: vi.fraction_outside_embedding(model=fx.model(), **k),
            names=names,
        )
    for label, kw, names in [
        ("layer=5", lambda fx, m: dict(layer=5), ("layer",)),
        ("layer=1.5", lambda fx, m: dict(layer=1.5), ("layer",)),
        (
            "cache of another model",
            lambda fx, m: dict(cache=fx.cache(fx.model(d_model=32, d_head=16))),
            ("cache",),
        ),
        ("cache='x'", lambda fx, m: dict(cache="x"), ("cache",)),
        (
            "cache without resid_post",
            lambda fx, m: dict(
                cache=fx.cache(m, names_filter=["blocks.0.hook_resid_pre"]), layer=0
            ),
            ("cache", "hook_resid_post", "blocks.0.hook_resid_post"),
        ),
    ]:

        def run(fx: Fx, k: Any = kw) -> Any:
            model = fx.model()
            args: dict[str, Any] = dict(model=model, cache=fx.cache(model))
            args.update(k(fx, model))
            return vi.logit_lens(**args)

        c.add(f"logit_lens({label})", cat, run, names=names)
    for label, make, names in [
        ("x and y of different lengths", lambda: (torch.randn(5), torch.randn(6)), ("x", "y")),
        ("one point", lambda: (torch.randn(1), torch.randn(1)), ("n", "points", "x")),
        ("NaN in y", lambda: (torch.randn(5), torch.tensor([1.0, NAN, 2, 3, 4])), ("y",)),
        ("constant x", lambda: (torch.ones(5), torch.randn(5)), ("x",)),
        ("x a list", lambda: ([1.0, 2, 3], torch.randn(3)), ("x",)),
        ("int64 x", lambda: (torch.arange(5), torch.randn(5)), ("x",)),
    ]:
        c.add(f"fit_line({label})", cat, lambda fx, m=make: vi.fit_line(*m()), names=names)


def detector_cases(c: Catalogue) -> None:
    cat = "analysis.detectors"
    for label, fn, names in [
        ("induction_target(n_pos=0, m=2)", lambda: vi.induction_target(0, 2), ("n_pos",)),
        ("induction_target(8, m=0)", lambda: vi.induction_target(8, 0), ("m",)),
        ("induction_target(8, m=9)", lambda: vi.induction_target(8, 9), ("m", "n_pos")),
        ("induction_target(2.5, m=1)", lambda: vi.induction_target(2.5, 1), ("n_pos",)),
        ("previous_position_target(0)", lambda: vi.previous_position_target(0), ("n_pos",)),
        ("previous_position_target(-1)", lambda: vi.previous_position_target(-1), ("n_pos",)),
        ("position_k_target(5, k=-1)", lambda: vi.position_k_target(5, -1), ("k",)),
        ("position_k_target(5, k=5)", lambda: vi.position_k_target(5, 5), ("k", "n_pos")),
        ("position_k_target('5', k=1)", lambda: vi.position_k_target("5", 1), ("n_pos",)),
    ]:
        c.add(label, cat, lambda fx, f=fn: f(), names=names)

    def pats(fx: Fx) -> torch.Tensor:
        return fx.cache()["pattern", 0]

    for label, fn, names in [
        (
            "induction_score(rank-3 patterns)",
            lambda fx: vi.induction_score(pats(fx)[0]),
            ("patterns",),
        ),
        ("induction_score(m=0)", lambda fx: vi.induction_score(pats(fx), m=0), ("m",)),
        (
            "induction_score(5 positions, m=None)",
            lambda fx: vi.induction_score(pats(fx)),
            ("m", "positions"),
        ),
        (
            "induction_score(NaN patterns)",
            lambda fx: vi.induction_score(torch.full((2, 2, 4, 4), NAN)),
            ("patterns",),
        ),
        (
            "pattern_score(target [3, 3] for 5 positions)",
            lambda fx: vi.pattern_score(pats(fx), torch.eye(3)),
            ("target",),
        ),
        (
            "pattern_score(NaN target)",
            lambda fx: vi.pattern_score(pats(fx), torch.full((5, 5), NAN)),
            ("target",),
        ),
        ("position_k_score(k=99)", lambda fx: vi.position_k_score(pats(fx), 99), ("k",)),
        ("position_k_score(k=-1)", lambda fx: vi.position_k_score(pats(fx), -1), ("k",)),
        (
            "previous_position_score(rank-2)",
            lambda fx: vi.previous_position_score(pats(fx)[0, 0]),
            ("patterns",),
        ),
        ("previous_position_score('x')", lambda fx: vi.previous_position_score("x"), ("patterns",)),
    ]:
        c.add(label, cat, fn, names=names)

    def detect(fx: Fx, **kw: Any) -> Any:
        args: dict[str, Any] = dict(model=fx.model(), x=fx.x(pos=6), kind="previous_position")
        args.update(kw)
        return vi.detect_heads(**args)

    for label, kw, names in [
        ("kind='bogus'", dict(kind="bogus"), ("kind",)),
        ("kind='position_k' without k", dict(kind="position_k"), ("k",)),
        ("kind='pattern' without target", dict(kind="pattern"), ("target",)),
        ("kind='induction', m=0", dict(kind="induction", m=0), ("m",)),
        ("threshold=nan", dict(threshold=NAN), ("threshold",)),
        ("threshold='0.5'", dict(threshold="0.5"), ("threshold",)),
    ]:
        c.add(f"detect_heads({label})", cat, lambda fx, k=kw: detect(fx, **k), names=names)
    c.add("detect_heads: x NaN", cat, lambda fx: detect(fx, x=fx.nan_x()), names="x")
    c.add(
        "attention_patterns: x NaN",
        cat,
        lambda fx: vi.attention_patterns(fx.model(), fx.nan_x()),
        names="x",
    )
    for label, kw, names in [
        ("batch=0", dict(batch=0), ("batch",)),
        ("m=0", dict(m=0), ("m",)),
        ("d_in=0", dict(d_in=0), ("d_in",)),
        ("repeats=0", dict(repeats=0), ("repeats",)),
        ("dtype=torch.int64", dict(dtype=torch.int64), ("dtype",)),
        ("seed='x'", dict(seed="x"), ("seed",)),
        ("m=2.5", dict(m=2.5), ("m",)),
        ("device='nope'", dict(device="nope"), ("device",)),
    ]:
        c.add(
            f"repeated_random_vectors({label})",
            cat,
            lambda fx, k=kw: vi.repeated_random_vectors(**{"batch": 2, "m": 3, "d_in": 4, **k}),
            names=names,
        )


def LOSSES(model: Any) -> dict[str, float]:
    return {"loss": 0.0}


def emergence_cases(c: Catalogue) -> None:
    cat = "analysis.emergence"
    paths = {"a": (0, 0, 1, 0)}
    for label, fn, names in [
        (
            "emergence('no/such/dir')",
            lambda fx: vi.emergence(fx.tmp() / "no" / "such", losses=LOSSES, progress=False),
            ("checkpoints", "such"),
        ),
        (
            "emergence([])",
            lambda fx: vi.emergence([], losses=LOSSES, progress=False),
            ("checkpoints",),
        ),
        (
            "emergence(a file)",
            lambda fx: vi.emergence(fx.file(), losses=LOSSES, progress=False),
            ("checkpoints", "a_file.txt"),
        ),
        (
            "emergence([(0, 'not a model')])",
            lambda fx: vi.emergence([(0, "m")], losses=LOSSES, progress=False),
            ("checkpoints", "model"),
        ),
        (
            "emergence: two checkpoints with step 0",
            lambda fx: vi.emergence(
                [(0, fx.model()), (0, fx.model())], fx.x(), paths, progress=False
            ),
            ("step", "checkpoints"),
        ),
        (
            "emergence: path with layer 9",
            lambda fx: vi.emergence([(0, fx.model())], fx.x(), {"a": (9, 0, 1, 0)}, progress=False),
            ("layer", "a"),
        ),
        (
            "emergence: paths without data",
            lambda fx: vi.emergence([(0, fx.model())], None, paths, progress=False),
            ("data",),
        ),
        (
            "emergence: data NaN",
            lambda fx: vi.emergence([(0, fx.model())], fx.nan_x(), paths, progress=False),
            ("data", "x"),
        ),
        (
            "emergence: losses not callable",
            lambda fx: vi.emergence([(0, fx.model())], losses="mse", progress=False),
            ("losses",),
        ),
        (
            "emergence: a loss that is NaN",
            lambda fx: vi.emergence([(0, fx.model())], losses=lambda m: {"l": NAN}, progress=False),
            ("losses", "l"),
        ),
        (
            "emergence: a checkpoint with a truncated model",
            lambda fx: _truncated_emergence(fx),
            ("model.safetensors",),
        ),
        (
            "path_attention: layer 5",
            lambda fx: vi.path_attention(fx.model(), fx.x(), {"a": (5, 0, 1, 0)}),
            ("layer", "a"),
        ),
        (
            "path_attention: dest 9",
            lambda fx: vi.path_attention(fx.model(), fx.x(), {"a": (0, 0, 9, 0)}),
            ("dest", "a"),
        ),
        (
            "path_attention: paths a list",
            lambda fx: vi.path_attention(fx.model(), fx.x(), [(0, 0, 1, 0)]),
            ("paths",),
        ),
        (
            "path_attention: a path of 3 items",
            lambda fx: vi.path_attention(fx.model(), fx.x(), {"a": (0, 0, 1)}),
            ("a", "paths"),
        ),
    ]:
        c.add(label, cat, fn, names=names)

    c.add(
        "path_attention: src after dest (masked, attention 0)",
        cat,
        lambda fx: vi.path_attention(fx.model(), fx.x(), {"a": (0, 0, 1, 3)}),
        names=("src", "a"),
        ok_if_accepted=True,
    )


def _truncated_emergence(fx: Fx) -> Any:
    directory = fx.checkpoints()
    last = vi.latest_checkpoint(directory)
    assert last is not None
    truncate(last / "model" / "model.safetensors")
    return vi.emergence(directory, losses=LOSSES, progress=False)


def task_cases(c: Catalogue) -> None:
    cat = "tasks"

    def first(it: Any) -> Any:
        return next(iter(it))

    ar = affine_recurrence
    for label, kw, names, ok in [
        ("batch_size=0", dict(batch_size=0), ("batch_size",), False),
        ("batch_size=-1", dict(batch_size=-1), ("batch_size",), False),
        ("batch_size=2.5", dict(batch_size=2.5), ("batch_size",), False),
        ("batch_size=True", dict(batch_size=True), ("batch_size",), False),
        ("batch_size='4'", dict(batch_size="4"), ("batch_size",), False),
        ("dim=0", dict(dim=0), ("dim",), False),
        ("length=2", dict(length=2), ("length",), False),
        ("length=1", dict(length=1), ("length",), False),
        ("min_len=5, max_len=3", dict(min_len=5, max_len=3), ("min_len", "max_len"), False),
        ("min_len=0", dict(min_len=0), ("min_len",), False),
        ("dtype=torch.int64", dict(dtype=torch.int64), ("dtype",), False),
        ("dtype='float32'", dict(dtype="float32"), ("dtype",), True),
        ("device='nope'", dict(device="nope"), ("device",), False),
        ("seed='x'", dict(seed="x"), ("seed",), False),
        ("seed=-1", dict(seed=-1), ("seed",), True),
        ("generator='x'", dict(generator="x"), ("generator",), False),
        (
            "seed and generator",
            dict(seed=0, generator=torch.Generator()),
            ("seed", "generator"),
            False,
        ),
    ]:
        c.add(
            f"affine_recurrence.generate({label})",
            cat,
            lambda fx, k=kw: ar.generate(**{"batch_size": 4, "dim": 4, "seed": 0, **k}),
            names=names,
            ok_if_accepted=ok,
        )
    c.add(
        "affine_recurrence.batches(0, seed=0)",
        cat,
        lambda fx: first(ar.batches(0, seed=0)),
        names="batch_size",
    )
    c.add(
        "affine_recurrence.batches(4) without seed",
        cat,
        lambda fx: first(ar.batches(4)),
        names="seed",
    )
    c.add(
        "affine_recurrence.batches(4, seed=0, length=2)",
        cat,
        lambda fx: first(ar.batches(4, seed=0, length=2)),
        names="length",
    )
    c.add(
        "affine_recurrence.fixed_eval_set(0, 4, 0)",
        cat,
        lambda fx: ar.fixed_eval_set(0, 4, 0),
        names="n_batches",
    )
    c.add(
        "affine_recurrence.fixed_eval_set(2, 4, seed=None)",
        cat,
        lambda fx: ar.fixed_eval_set(2, 4, None),
        names="seed",
    )
    rt = retrieval
    for label, kw, names, ok in [
        ("depth=0", dict(depth=0), ("depth",), False),
        ("depth=-1", dict(depth=-1), ("depth",), False),
        ("depth=2.5", dict(depth=2.5), ("depth",), False),
        ("n_chains=0", dict(n_chains=0), ("n_chains",), False),
        ("dim=0", dict(dim=0), ("dim",), False),
        ("dim=3 (odd)", dict(dim=3), ("dim",), False),
        ("rotary_base=nan", dict(rotary_base=NAN), ("rotary_base",), False),
        ("rotary_base=inf", dict(rotary_base=INF), ("rotary_base",), False),
        ("rotary_base=0", dict(rotary_base=0.0), ("rotary_base",), False),
        ("rotary_base=-1", dict(rotary_base=-1.0), ("rotary_base",), False),
        (
            "implicit_curriculum='yes'",
            dict(implicit_curriculum="yes"),
            ("implicit_curriculum",),
            False,
        ),
        ("batch_size=0", dict(batch_size=0), ("batch_size",), False),
        ("dtype=torch.int64", dict(dtype=torch.int64), ("dtype",), False),
    ]:
        c.add(
            f"retrieval.generate({label})",
            cat,
            lambda fx, k=kw: rt.generate(**{"batch_size": 4, "depth": 2, "seed": 0, **k}),
            names=names,
            ok_if_accepted=ok,
        )
    for label, fn, names in [
        ("model_config(depth=2, n_layers=0)", lambda: rt.model_config(2, 0), ("n_layers",)),
        ("model_config(depth=0, n_layers=2)", lambda: rt.model_config(0, 2), ("depth",)),
        (
            "model_config(act_fn='bogus')",
            lambda: rt.model_config(2, 2, act_fn="bogus"),
            ("act_fn",),
        ),
        ("min_layers(0)", lambda: rt.min_layers(0), ("depth",)),
        ("min_layers(2.5)", lambda: rt.min_layers(2.5), ("depth",)),
        (
            "positional_code(float indices)",
            lambda: rt.positional_code(torch.tensor([0.5]), 4),
            ("indices",),
        ),
        ("positional_code(dim=3)", lambda: rt.positional_code(torch.arange(3), 3), ("dim",)),
        (
            "positional_code(base=nan)",
            lambda: rt.positional_code(torch.arange(3), 4, NAN),
            ("base",),
        ),
        ("role_names(0)", lambda: rt.role_names(0), ("depth",)),
        ("role_names(-1)", lambda: rt.role_names(-1), ("depth",)),
    ]:
        c.add(f"retrieval.{label}", cat, lambda fx, f=fn: f(), names=names)

    c.add(
        "retrieval.model_config(depth=3, n_layers=1) < min_layers(3)",
        cat,
        lambda fx: rt.model_config(3, 1),
        names=("n_layers", "min_layers"),
        ok_if_accepted=True,
    )

    def partial(
        fx: Fx, outputs: Callable[[Any], Any], batch: Callable[[Any], Any] | None = None
    ) -> Any:
        b = rt.generate(4, 2, seed=0)
        return rt.partial_losses(outputs(b), batch(b) if batch else b)

    c.add(
        "retrieval.partial_losses(outputs of the wrong shape)",
        cat,
        lambda fx: partial(fx, lambda b: b.targets[..., :-1]),
        names="outputs",
    )
    c.add(
        "retrieval.partial_losses(batch=an affine batch)",
        cat,
        lambda fx: partial(fx, lambda b: b.targets, lambda b: ar.generate(4, dim=4, seed=0)),
        names="batch",
    )
    ind = induction
    for label, kw, names in [
        ("m=1", dict(m=1), ("m",)),
        ("m=0", dict(m=0), ("m",)),
        ("m=2.5", dict(m=2.5), ("m",)),
        ("min_m=10, max_m=4", dict(min_m=10, max_m=4), ("min_m", "max_m")),
        ("dim=0", dict(dim=0), ("dim",)),
        ("batch_size=0", dict(batch_size=0), ("batch_size",)),
        ("dtype=torch.int64", dict(dtype=torch.int64), ("dtype",)),
        ("device='nope'", dict(device="nope"), ("device",)),
    ]:
        c.add(
            f"induction.generate({label})",
            cat,
            lambda fx, k=kw: ind.generate(**{"batch_size": 4, "seed": 0, **k}),
            names=names,
        )
    for label, fn, names in [
        ("model_config(dim=0)", lambda: ind.model_config(dim=0), ("dim",)),
        ("model_config(max_m=0)", lambda: ind.model_config(max_m=0), ("max_m",)),
        (
            "model_config(normalization='bogus')",
            lambda: ind.model_config(normalization="bogus"),
            ("normalization",),
        ),
        (
            "model_config(positional='bogus')",
            lambda: ind.model_config(positional="bogus"),
            ("positional",),
        ),
        ("fixed_eval_set(0, 4, 0)", lambda: ind.fixed_eval_set(0, 4, 0), ("n_batches",)),
        ("batches(4, seed=0, m=1)", lambda: first(ind.batches(4, seed=0, m=1)), ("m",)),
    ]:
        c.add(f"induction.{label}", cat, lambda fx, f=fn: f(), names=names)


def interop_cases(c: Catalogue) -> None:
    cat = "interop"
    c.add(
        "to_transformer_lens(cfg)",
        cat,
        lambda fx: vi.to_transformer_lens(fx.cfg()),
        names="model",
        expect="HookedVectorTransformer",
    )
    c.add(
        "to_transformer_lens(as_learned_positions='yes')",
        cat,
        lambda fx: vi.to_transformer_lens(fx.model(), as_learned_positions="yes"),
        names="as_learned_positions",
    )
    c.add(
        "from_transformer_lens(nn.Linear)",
        cat,
        lambda fx: vi.from_transformer_lens(torch.nn.Linear(2, 2)),
        names="tl_model",
        expect="HookedTransformer",
    )
    c.add(
        "tl_forward_vectors(nn.Linear, x)",
        cat,
        lambda fx: vi.tl_forward_vectors(torch.nn.Linear(2, 2), fx.x()),
        names="tl_model",
    )

    def tl(fx: Fx) -> Any:
        return vi.to_transformer_lens(fx.model())

    c.add(
        "tl_forward_vectors: x NaN",
        cat,
        lambda fx: vi.tl_forward_vectors(tl(fx), fx.nan_x()),
        names="x",
    )
    c.add(
        "tl_forward_vectors: x last axis 3",
        cat,
        lambda fx: vi.tl_forward_vectors(tl(fx), fx.x(d=3)),
        names="x",
    )
    c.add(
        "tl_forward_vectors: x float64",
        cat,
        lambda fx: vi.tl_forward_vectors(tl(fx), fx.x(dtype=torch.float64)),
        names="x",
    )
    c.add(
        "tl_run_with_cache_vectors: x rank 2",
        cat,
        lambda fx: vi.tl_run_with_cache_vectors(tl(fx), fx.x()[0]),
        names="x",
    )


def build_cases(interop: bool = False) -> list[Case]:
    c = Catalogue()
    for section in (
        config_cases,
        model_cases,
        forward_cases,
        hook_cases,
        thread_cases,
        cache_cases,
        processing_cases,
        save_load_cases,
        checkpoint_cases,
        training_cases,
        loss_cases,
        factored_cases,
        analysis_cases,
        task_cases,
    ):
        section(c)
    if interop:
        interop_cases(c)
        import_export_cases(c)
    return c.cases


def import_export_cases(c: Catalogue) -> None:
    """from_hf / to_hf / to_torch_encoder / from_garg_checkpoint (issue 33 items 1, 4, 11,
    12, 13): each refused with the argument named (``interop_cases`` holds the
    TransformerLens ones)."""
    cat = "import"
    import transformers  # the hf extra; --interop needs it

    def gpt2(**kw: Any) -> Any:
        config = transformers.GPT2Config(
            vocab_size=1, bos_token_id=0, eos_token_id=0, n_positions=6, n_embd=8,
            n_layer=2, n_head=2, use_cache=False, **kw,
        )  # fmt: skip
        with torch.random.fork_rng(devices=[]):
            return transformers.GPT2Model(config)

    def maps(d: int = 8) -> tuple[torch.nn.Linear, torch.nn.Linear]:
        with torch.random.fork_rng(devices=[]):
            return torch.nn.Linear(3, d), torch.nn.Linear(d, 1)

    gated = {"gated_mlp": True, "act_fn": "gelu_tanh"}
    c.add(
        "to_hf(gated_mlp=True, learned positions, LN)",
        cat,
        lambda fx: vi.to_hf(vi.HookedVectorTransformer(fx.cfg(**gated), seed=0)),
        names="gated_mlp",
    )
    c.add(
        "to_torch_encoder(gated_mlp=True)",
        cat,
        lambda fx: vi.to_torch_encoder(
            vi.HookedVectorTransformer(fx.cfg(gated_mlp=True, act_fn="relu"), seed=0)
        ),
        names="gated_mlp",
    )

    def swapped(fx: Fx, act: torch.nn.Module, layer: int) -> Any:
        backbone = gpt2().eval()
        backbone.h[layer].mlp.act = act
        return vi.from_hf(backbone, *maps())

    c.add(
        "from_hf(GPT-2 with h.1.mlp.act = nn.Tanh())",
        cat,
        lambda fx: swapped(fx, torch.nn.Tanh(), 1),
        names="h.1.mlp.act",
    )
    c.add(
        "from_hf(GPT-2 with h.0.mlp.act = nn.ReLU() only)",
        cat,
        lambda fx: swapped(fx, torch.nn.ReLU(), 0),
        names="different activations",
    )
    c.add(
        "from_hf(GPT-2 in training mode, dropout 0.1)",
        cat,
        lambda fx: vi.from_hf(gpt2().train(), *maps()),
        names=("training mode", ".eval()"),
    )

    def on_meta(fx: Fx) -> Any:
        with torch.device("meta"):
            backbone = gpt2()
        return vi.from_hf(backbone.eval(), *maps())

    c.add("from_hf(GPT-2 on the meta device)", cat, on_meta, names="meta device")
    c.add(
        "from_hf(GPT-2 sdpa, scale_attn_weights=False)",
        cat,
        lambda fx: vi.from_hf(
            gpt2(scale_attn_weights=False, attn_implementation="sdpa").eval(), *maps()
        ),
        names="scale_attn_weights",
        ok_if_accepted=hasattr(gpt2().h[0].attn, "scaling"),  # 5.x's SDPA applies it
    )

    def garg_file(fx: Fx, content: bytes) -> Any:
        path = fx.tmp("garg") / "state.pt"
        path.write_bytes(content)
        return vi.from_garg_checkpoint(path, n_head=2)

    c.add(
        "from_garg_checkpoint(a text file)",
        cat,
        lambda fx: garg_file(fx, b"hello world\n"),
        names=("checkpoint", "torch.save"),
    )
    c.add(
        "from_garg_checkpoint(an empty file)",
        cat,
        lambda fx: garg_file(fx, b""),
        names=("checkpoint", "torch.save"),
    )
    c.add(
        "from_garg_checkpoint(a directory)",
        cat,
        lambda fx: vi.from_garg_checkpoint(fx.tmp("garg_dir"), n_head=2),
        names=("checkpoint", "regular file"),
    )

    def whole_module(fx: Fx) -> Any:
        path = fx.tmp("garg_module") / "model.pt"
        torch.save(torch.nn.Linear(2, 2), path)
        return vi.from_garg_checkpoint(path, n_head=2)

    c.add(
        "from_garg_checkpoint(a torch.save(model) file)",
        cat,
        whole_module,
        names=("checkpoint", "state_dict()"),
    )

    def garg_state() -> dict[str, torch.Tensor]:
        read_in, read_out = maps()
        state = {f"_backbone.{k}": v for k, v in gpt2().state_dict().items()}
        state |= {f"_read_in.{k}": v for k, v in read_in.state_dict().items()}
        return state | {f"_read_out.{k}": v for k, v in read_out.state_dict().items()}

    c.add(
        "from_garg_checkpoint(activation_function='gelu_approx')",
        cat,
        lambda fx: vi.from_garg_checkpoint(
            garg_state(), n_head=2, activation_function="gelu_approx"
        ),
        names="activation_function",
    )


__all__ = ["CLEAR_TYPES", "Case", "Fx", "Problem", "build_cases", "child_train", "make_batch"]
