"""vecinterp's modules import one way, layer by layer, and form no import cycle.

The layers, lowest first (DESIGN.md, "Layers of the library"). A module may import the
modules of its own layer and of lower ranks: never a higher rank, nor another layer of its
own rank (those are independent of each other).

====  ===========================  =========================================================
rank  layer                        why there
====  ===========================  =========================================================
0     hooks, factored_matrix,      import no other vecinterp module: hook points, the
      loss, threads, memory        low-rank matrix, the masked MSE, the CPU thread count,
                                   glibc's malloc thresholds
1     model                        config, components, the transformer (uses all of rank 0),
                                   weight processing, save/load
2     cache                        ActivationCache: reads the model it is given
2     testing                      a plain reference transformer: reads only the config,
                                   written apart from the components on purpose
3     analysis                     circuits, attribution, ablation, patching: model + cache
3     interop                      TransformerLens conversion: the model and its config
4     training                     one train loop over the model (and its loss)
4     plot                         draws results it is handed (the optional matplotlib extra)
5     tasks                        data, recipes and the papers' claims: everything below
5     dictionary                   sparse autoencoders and transcoders: harvest activations
                                   from the model, train with training's checkpoints
6     vecinterp                    the package's ``__init__``: re-exports the public API
====  ===========================  =========================================================

Imports under ``if TYPE_CHECKING:`` name types only and are not checked. Imports inside a
function run when it is called: they cannot form an import cycle, but they are a
dependency all the same, so they must go down too, except the ones in ``UPWARD_ALLOWED``.

How package ``__init__`` modules count: ``from pkg import sub`` (``sub`` a module) depends on
``pkg.sub``; ``from pkg import name`` (``name`` defined in ``pkg/__init__.py``) depends on
``pkg`` itself. So a package ``__init__`` that re-exports its submodules is no cycle, but a
submodule that imports a name from the ``__init__`` that imports it is one (the name may not
exist yet when the submodule runs).
"""

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

LAYERS: dict[str, int] = {
    "vecinterp.hooks": 0,
    "vecinterp.factored_matrix": 0,
    "vecinterp.loss": 0,
    "vecinterp.threads": 0,
    "vecinterp.memory": 0,
    "vecinterp.model": 1,
    "vecinterp.cache": 2,
    "vecinterp.testing": 2,
    "vecinterp.analysis": 3,
    "vecinterp.interop": 3,
    "vecinterp.training": 4,
    "vecinterp.plot": 4,
    "vecinterp.tasks": 5,
    "vecinterp.dictionary": 5,
    "vecinterp": 6,
}
"""Layer (a module or a package, with everything in it) -> rank."""

UPWARD_ALLOWED: dict[tuple[str, str], str] = {
    ("vecinterp.model.transformer", "vecinterp.cache.recording"): (
        "HookedVectorTransformer.run_with_cache returns the cache layer's ActivationCache: "
        "it imports the module that builds one when it is called"
    ),
    ("vecinterp.analysis._points", "vecinterp.dictionary.splice"): (
        "the probes' random-model control of a spliced model splices the same dictionaries "
        "into the random twin (the control must read the same feature points); only when "
        "the model has spliced points"
    ),
    ("vecinterp.analysis.attribution", "vecinterp.dictionary.decompose"): (
        "direct_attribution(components='features') splits a component through its "
        "dictionary's decomposition, which the dictionary layer defines"
    ),
}
"""Call-time imports that go up on purpose: (importer, imported) -> why."""


@dataclass(frozen=True)
class Import:
    importer: str
    target: str
    line: int
    call_time: bool  # inside a function body: runs when the function is called


def find_modules(src: Path, package: str) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, whether it is a package ``__init__``)."""
    found = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        found[".".join(parts)] = (path, is_package)
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


class _Collector(ast.NodeVisitor):
    def __init__(self, module: str, is_package: bool, known: set[str]):
        self.module, self.known = module, known
        self.package = module if is_package else module.rpartition(".")[0]
        self.depth = 0
        self.found: list[Import] = []

    def _add(self, target: str, node: ast.stmt) -> None:
        if target in self.known and target != self.module:
            self.found.append(Import(self.module, target, node.lineno, self.depth > 0))

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_If(self, node: ast.If) -> None:
        if _is_type_checking(node.test):
            for statement in node.orelse:
                self.visit(statement)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            parts = self.package.split(".")
            base = ".".join(parts[: len(parts) - node.level + 1])
            base = f"{base}.{node.module}" if node.module else base
        else:
            base = node.module or ""
        for alias in node.names:
            sub = f"{base}.{alias.name}"
            self._add(sub if sub in self.known else base, node)


def find_imports(src: Path, package: str) -> list[Import]:
    """Every import of a ``package`` module by a ``package`` module, outside
    ``if TYPE_CHECKING:`` blocks."""
    modules = find_modules(src, package)
    found = []
    for name, (path, is_package) in modules.items():
        collector = _Collector(name, is_package, set(modules))
        collector.visit(ast.parse(path.read_text(), filename=str(path)))
        found += collector.found
    return found


def cycles(imports: list[Import]) -> list[list[str]]:
    """The import cycles among module-level imports: each strongly connected component of
    more than one module, sorted (Tarjan's algorithm, iterative)."""
    graph: dict[str, set[str]] = {}
    for imp in imports:
        if not imp.call_time:
            graph.setdefault(imp.importer, set()).add(imp.target)
            graph.setdefault(imp.target, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return sorted(found)


def layer_of(module: str, layers: dict[str, int]) -> str:
    """The layer ``module`` belongs to: the longest key of ``layers`` that is ``module``
    or a package holding it."""
    owners = [key for key in layers if module == key or module.startswith(key + ".")]
    if not owners:
        raise KeyError(f"{module} belongs to no layer: add it to LAYERS in {__file__}")
    return max(owners, key=len)


def upward(
    imports: list[Import], layers: dict[str, int], allowed: dict[tuple[str, str], str]
) -> list[str]:
    """The imports that do not go down: to a higher rank, or to another layer of the same
    rank, and not in ``allowed``; as ``"importer -> target (line n[, when called])"``."""
    bad = []
    for imp in imports:
        here, there = layer_of(imp.importer, layers), layer_of(imp.target, layers)
        if here == there or layers[there] < layers[here]:
            continue
        if imp.call_time and (imp.importer, imp.target) in allowed:
            continue
        when = ", when called" if imp.call_time else ""
        bad.append(
            f"{imp.importer} ({here}, rank {layers[here]}) -> {imp.target} "
            f"({there}, rank {layers[there]}) (line {imp.line}{when})"
        )
    return bad


# ----------------------------------------------------------------------- the package


@pytest.fixture(scope="module")
def imports() -> list[Import]:
    return find_imports(SRC, "vecinterp")


def test_no_module_level_import_cycle(imports):
    assert cycles(imports) == [], "module-level import cycles among vecinterp modules"


def test_every_module_has_a_layer():
    for module in find_modules(SRC, "vecinterp"):
        layer_of(module, LAYERS)


def test_every_import_goes_down_the_layers(imports):
    bad = upward(imports, LAYERS, UPWARD_ALLOWED)
    assert bad == [], "imports that go up the layers (see this file's docstring):\n" + "\n".join(
        bad
    )


def test_the_allowed_upward_imports_exist_and_run_only_when_called(imports):
    """An exception that no longer happens is removed from the list, and none may run at
    import time."""
    seen = {(imp.importer, imp.target): imp.call_time for imp in imports}
    for pair in UPWARD_ALLOWED:
        assert pair in seen, f"{pair} is allowed to go up but no longer imported: remove it"
        assert seen[pair], f"{pair} is imported at module level: only a call-time import may go up"


# ------------------------------------------------------- the checks on a made-up package


def _package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


TOY_LAYERS = {"pkg.low": 0, "pkg.mid": 1, "pkg.side": 1, "pkg.high": 2, "pkg": 3}


def _toy(tmp_path: Path, **files: str) -> list[Import]:
    base = {
        "__init__.py": "from . import high\n",
        "low/__init__.py": "from .a import f\n",
        "low/a.py": "def f():\n    return 1\n",
        "mid.py": "from .low import f\n",
        "side.py": "",
        "high.py": "from . import mid\nfrom .low.a import f\n",
    }
    base.update({name.replace("__", "/") + ".py": text for name, text in files.items()})
    return find_imports(_package(tmp_path, base), "pkg")


def test_the_toy_package_is_clean(tmp_path):
    imports = _toy(tmp_path)
    assert cycles(imports) == [] and upward(imports, TOY_LAYERS, {}) == []
    # ``from .low import f`` names the package; ``from . import mid`` the submodule
    assert {(i.importer, i.target) for i in imports} == {
        ("pkg", "pkg.high"),
        ("pkg.low", "pkg.low.a"),
        ("pkg.mid", "pkg.low"),
        ("pkg.high", "pkg.mid"),
        ("pkg.high", "pkg.low.a"),
    }


def test_an_upward_import_is_found_at_module_level_and_when_called(tmp_path):
    imports = _toy(
        tmp_path,
        mid="from .low import f\nfrom . import high\n",
        low__a="def f():\n    from ..mid import f\n    return 1\n",
    )
    bad = upward(imports, TOY_LAYERS, {})
    assert bad == [
        "pkg.low.a (pkg.low, rank 0) -> pkg.mid (pkg.mid, rank 1) (line 2, when called)",
        "pkg.mid (pkg.mid, rank 1) -> pkg.high (pkg.high, rank 2) (line 2)",
    ]
    assert upward(imports, TOY_LAYERS, {("pkg.low.a", "pkg.mid"): "why"}) == bad[1:]
    # allowed only when called: the same pair at module level is still refused
    assert upward(imports, TOY_LAYERS, {("pkg.mid", "pkg.high"): "why"}) == bad


def test_a_layer_beside_its_own_rank_is_not_below_it(tmp_path):
    imports = _toy(tmp_path, side="from . import mid\n")
    assert upward(imports, TOY_LAYERS, {}) == [
        "pkg.side (pkg.side, rank 1) -> pkg.mid (pkg.mid, rank 1) (line 1)"
    ]


def test_type_checking_imports_are_not_dependencies(tmp_path):
    text = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import high\n"
    text += "else:\n    from . import side\n"
    imports = _toy(tmp_path, mid=text)
    assert [(i.importer, i.target) for i in imports if i.importer == "pkg.mid"] == [
        ("pkg.mid", "pkg.side")
    ]


def test_a_cycle_is_found_and_a_call_time_import_breaks_it(tmp_path):
    imports = _toy(tmp_path, low__a="from .b import g\n", low__b="from .a import f\n")
    assert cycles(imports) == [["pkg.low.a", "pkg.low.b"]]
    imports = _toy(tmp_path, low__a="def f():\n    from .b import g\n", low__b="from .a import f\n")
    assert cycles(imports) == []


def test_a_name_from_the_init_that_imports_you_is_a_cycle(tmp_path):
    # pkg/low/__init__ runs a.py, which asks pkg/low/__init__ for f: not defined yet
    imports = _toy(tmp_path, low__a="from . import f\n\ndef f():\n    return 1\n")
    assert cycles(imports) == [["pkg.low", "pkg.low.a"]]
    # a sibling submodule taken from the package is not
    imports = _toy(tmp_path, low__a="from . import b\n", low__b="")
    assert cycles(imports) == []


def test_a_module_with_no_layer_is_named(tmp_path):
    with pytest.raises(KeyError, match="pkg.other belongs to no layer"):
        layer_of("pkg.other", {"pkg.low": 0})
