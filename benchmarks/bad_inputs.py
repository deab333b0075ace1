"""Adversarial inputs: how vecinterp answers the mistakes a careful user makes.

Calls the public API (everything in ``vecinterp.__all__``, the cache, save/load, train,
the task modules, ``FactoredMatrix``) with a catalogue of bad inputs
(``_bad_input_cases.py``: wrong shapes and ranks, NaN/inf in every tensor argument,
non-finite config floats, wrong types, out-of-range layers/heads/positions, unknown names
and enum strings, TransformerLens habits, bad paths and corrupt files, hooks returning the
wrong thing, threads) and sorts every answer into one of these outcomes:

``clear``
    It raised an exception of an expected type (``ValueError``, ``TypeError``,
    ``KeyError``, ``IndexError``, ``RuntimeError``, ``FileNotFoundError``,
    ``NotADirectoryError``, ``IsADirectoryError``, ``FileExistsError``,
    ``vecinterp.TrainingDivergedError`` or a subclass; a case may allow others, e.g.
    ``AttributeError`` for an attribute) whose message is at most 1,000 characters and
    either names the offending argument (any of the case's ``names``: the argument's name,
    or a value that identifies the mistake such as an unknown hook name or file), or was
    raised by a ``raise`` statement inside the vecinterp package (the innermost traceback
    frame is a ``raise`` line of the package) and names the expected value (any of the
    case's ``expect``). Words match whole: ``x`` does not match ``6x5`` or ``d_x``. A
    warning counts as clear where the case allows one (``warn_ok``) and it names the
    argument or the expected value.
``unclear``
    It raised anything else: a raw torch or Python error, an exception of another type
    (``AttributeError`` for a missing API name included), a message that names neither
    the argument nor the expected value, a message over 1,000 characters, or no answer
    within the time limit.
``silent non-finite``
    It returned, and the result holds NaN or inf (in a tensor, a float, a model's
    parameters, a config's fields, a cache): the worst class. ``-inf`` in a module's
    buffers and in cached ``hook_attn_scores`` is a mask, not a fault; a case may narrow
    the scan to the entries that are defined (``scan``: composition scores are NaN by
    design where the earlier layer is not earlier).
``silent wrong``
    It returned finite values, but the case's own check found them wrong (a cache entry
    that is not what flowed through its hook, a hook of another thread that fired, a
    checkpoint or weights file with a flipped byte loaded as if intact, a concurrent run
    that was crashed).
``silent finite``
    It returned finite values for an input that should have been refused.
``accepted``
    It returned finite values (passing the case's check, if any) where the case declares
    acceptance legitimate (``ok_if_accepted``): e.g. ``np.int64(4)`` for an int, a
    backward hook returning ``(grad,)`` as in TransformerLens.

"Answered well" is ``clear + accepted``. Every case belongs to a category (the API area it
calls) and to one of four areas: cache; save/load/checkpoints; hooks/threads;
config/inputs/messages.

Usage::

    python benchmarks/bad_inputs.py                 # summary tables
    python benchmarks/bad_inputs.py --list          # and every case not answered well
    python benchmarks/bad_inputs.py --json out.json # every case's outcome and message
    python benchmarks/bad_inputs.py --only cache    # cases whose id contains "cache"

The run uses tiny models, one torch thread and a temporary directory; it takes about a
minute on two cores. ``--interop`` adds the TransformerLens conversion cases (importing
TransformerLens takes 10-20 s).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import linecache
import math
import os
import re
import signal
import sys
import tempfile
import time
import traceback
import warnings
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _bad_input_cases as catalogue  # noqa: E402

import vecinterp  # noqa: E402

PACKAGE_DIR = str(Path(vecinterp.__file__).resolve().parent) + os.sep
HARNESS_DIR = str(HERE) + os.sep
MAX_MESSAGE = 1000
OUTCOMES = ("clear", "unclear", "silent_nonfinite", "silent_wrong", "silent_finite", "accepted")
HEADERS = {
    "clear": "raised clearly",
    "unclear": "raised unclearly",
    "silent_nonfinite": "silent, non-finite",
    "silent_wrong": "silent, wrong",
    "silent_finite": "silent, finite",
    "accepted": "accepted (legit)",
}


class CaseTimeout(Exception):
    """A case ran past its time limit."""


@dataclasses.dataclass
class Outcome:
    id: str
    category: str
    area: str
    outcome: str
    exc_type: str | None = None
    message: str | None = None
    origin: str | None = None
    reason: str = ""
    seconds: float = 0.0
    warnings: list[str] = dataclasses.field(default_factory=list)


# ----------------------------------------------------------------------------- outcomes


def _innermost(exc: BaseException) -> tuple[str, int]:
    tb = exc.__traceback__
    if tb is None:
        return "", 0
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_filename, tb.tb_lineno


def origin_of(exc: BaseException) -> str:
    """``vecinterp-raise`` (a raise statement in the package), ``vecinterp-call`` (a
    builtin or C function failing on a package line), ``harness``, or ``external``."""
    filename, lineno = _innermost(exc)
    path = os.path.realpath(filename) if filename else ""
    if path.startswith(PACKAGE_DIR):
        line = linecache.getline(filename, lineno).strip()
        return "vecinterp-raise" if line.startswith("raise") else "vecinterp-call"
    if path.startswith(HARNESS_DIR):
        return "harness"
    return "external"


def message_of(exc: BaseException) -> str:
    if isinstance(exc, KeyError) and len(exc.args) == 1 and isinstance(exc.args[0], str):
        return exc.args[0]
    return str(exc)


def mentions(message: str, words: tuple[str, ...]) -> bool:
    """Whether ``message`` contains one of ``words`` as a whole word (identifiers are not
    matched inside longer identifiers: ``x`` does not match ``d_x`` or ``6x5``)."""
    for word in words:
        if re.search(r"(?<![\w])" + re.escape(word) + r"(?![\w])", message):
            return True
    return False


def _bad_values(t: torch.Tensor, masks: bool) -> str | None:
    if t.device.type == "meta" or t.numel() == 0 or not (t.is_floating_point() or t.is_complex()):
        return None
    t = t.detach()
    bad = ~torch.isfinite(t)
    if masks and not t.is_complex():
        bad &= t != -math.inf  # -inf marks masked attention (scores, causal mask buffers)
    if bool(bad.any()):
        return f"tensor {tuple(t.shape)} with {int(bad.sum())} non-finite"
    return None


def non_finite(obj: Any, depth: int = 0, seen: set[int] | None = None) -> str | None:
    """Where ``obj`` holds a NaN or inf, or ``None``. ``-inf`` is allowed where it is a
    mask: in a module's buffers and in cached ``hook_attn_scores``."""
    seen = set() if seen is None else seen
    if depth > 6 or id(obj) in seen:
        return None
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return _bad_values(obj, masks=False)
    if isinstance(obj, float):
        return None if math.isfinite(obj) else f"float {obj}"
    if isinstance(obj, torch.nn.Module):
        for name, t in obj.named_parameters():
            bad = _bad_values(t, masks=False)
            if bad:
                return f"{name}: {bad}"
        for name, buf in obj.named_buffers():
            bad = _bad_values(buf, masks=True)
            if bad:
                return f"{name}: {bad}"
        cfg = getattr(obj, "cfg", None)
        return non_finite(cfg, depth + 1, seen) if cfg is not None else None
    if isinstance(obj, vecinterp.FactoredMatrix):
        return non_finite(obj.A, depth + 1, seen) or non_finite(obj.B, depth + 1, seen)
    if isinstance(obj, vecinterp.ActivationCache):
        for key, value in list(obj.cache_dict.items()):
            bad = _bad_values(value, masks=key.endswith("hook_attn_scores"))
            if bad:
                return f"cache[{key!r}]: {bad}"
        return None
    if isinstance(obj, dict):
        items = list(obj.items())
    elif isinstance(obj, list | tuple):
        items = list(enumerate(obj))
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        items = [(f.name, getattr(obj, f.name, None)) for f in dataclasses.fields(obj)]
    else:
        return None
    for key, value in items:
        bad = non_finite(value, depth + 1, seen)
        if bad:
            return f"[{key!r}] {bad}"
    return None


def classify_exception(case: catalogue.Case, exc: BaseException) -> Outcome:
    out = Outcome(case.id, case.category, case.area, "unclear")
    out.exc_type = type(exc).__name__
    out.message = message_of(exc)
    out.origin = origin_of(exc)
    msg = out.message
    if isinstance(exc, CaseTimeout):
        out.reason = "no answer within the time limit"
        return out
    if out.origin == "harness" and isinstance(exc, NameError | SyntaxError):
        out.outcome = "harness_error"
        out.reason = "a bug in the case itself"
        return out
    types = case.types or catalogue.CLEAR_TYPES
    if not isinstance(exc, types):
        out.reason = f"{out.exc_type} is not one of the expected error types"
    elif len(msg) > MAX_MESSAGE:
        out.reason = f"message of {len(msg)} characters (> {MAX_MESSAGE})"
    elif mentions(msg, case.names):
        out.outcome, out.reason = "clear", "names the argument"
    elif out.origin == "vecinterp-raise" and mentions(msg, case.expect):
        out.outcome, out.reason = "clear", "vecinterp names the expected value"
    elif out.origin != "vecinterp-raise":
        out.reason = f"raised outside vecinterp ({out.origin}) without naming the argument"
    else:
        out.reason = "names neither the argument nor the expected value"
    return out


def classify_result(
    case: catalogue.Case, result: Any, fx: catalogue.Fx, caught: list[str]
) -> Outcome:
    out = Outcome(case.id, case.category, case.area, "silent_finite", warnings=caught)
    if isinstance(result, catalogue.Problem):
        out.outcome, out.reason = "silent_wrong", result.what
        return out
    if case.warn_ok and any(mentions(w, case.names + case.expect) for w in caught):
        out.outcome, out.reason = "clear", "warned, naming the argument"
        return out
    bad = non_finite(case.scan(result) if case.scan is not None else result)
    if bad:
        out.outcome, out.reason = "silent_nonfinite", bad
        return out
    if case.check is not None:
        try:
            problem = case.check(result, fx)
        except Exception as err:  # noqa: BLE001 - a failing check is itself a finding
            problem = f"the check could not read the result: {type(err).__name__}: {err}"
        if problem:
            out.outcome, out.reason = "silent_wrong", problem
            return out
        out.outcome, out.reason = "accepted", "passed the case's check"
        return out
    if case.ok_if_accepted:
        out.outcome, out.reason = "accepted", "acceptance is legitimate here"
    else:
        out.reason = "a bad input was accepted"
    return out


def _alarm(signum: int, frame: Any) -> None:
    raise CaseTimeout("time limit")


def run_case(case: catalogue.Case, fx: catalogue.Fx, limit: float) -> Outcome:
    sink = io.StringIO()
    start = time.perf_counter()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, case.timeout or limit)
    caught: list[str] = []
    try:
        with warnings.catch_warnings(record=True) as log:
            warnings.simplefilter("always")
            with contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
                result = case.run(fx)
            caught = [str(w.message) for w in log]
        signal.setitimer(signal.ITIMER_REAL, 0)
        out = classify_result(case, result, fx, caught)
    except BaseException as exc:  # noqa: BLE001 - every answer is recorded
        signal.setitimer(signal.ITIMER_REAL, 0)
        if isinstance(exc, KeyboardInterrupt):
            raise
        out = classify_exception(case, exc)
        if out.outcome == "harness_error":
            out.message = "".join(traceback.format_exception(exc))[-800:]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    out.seconds = time.perf_counter() - start
    return out


# ------------------------------------------------------------------------------ reports


def table(rows: dict[str, Counter[str]], title: str) -> str:
    cols = ["cases", *OUTCOMES, "answered well"]
    names = ["cases", *(HEADERS[o] for o in OUTCOMES), "answered well"]
    width = max([len(title), *(len(k) for k in rows)])
    lines = [
        f"| {title:<{width}} | " + " | ".join(names) + " |",
        "|" + "-" * (width + 2) + "|" + "|".join("-" * (len(n) + 2) for n in names) + "|",
    ]
    for key, count in rows.items():
        total = sum(count[o] for o in OUTCOMES) + count["harness_error"]
        values = {"cases": total, **{o: count[o] for o in OUTCOMES}}
        good = count["clear"] + count["accepted"]
        cells = [str(values[c]) for c in cols[:-1]]
        cells.append(f"{good} ({100 * good / total:.0f} %)" if total else "0")
        lines.append(
            f"| {key:<{width}} | "
            + " | ".join(f"{c:>{len(n)}}" for c, n in zip(cells, names, strict=True))
            + " |"
        )
    return "\n".join(lines)


def summarise(outcomes: list[Outcome]) -> str:
    total: Counter[str] = Counter(o.outcome for o in outcomes)
    by_area: dict[str, Counter[str]] = defaultdict(Counter)
    by_cat: dict[str, Counter[str]] = defaultdict(Counter)
    for o in outcomes:
        by_area[o.area][o.outcome] += 1
        by_cat[o.category][o.outcome] += 1
    n = len(outcomes)
    parts = [
        table({"all": total}, "cases"),
        "",
        table(dict(sorted(by_area.items())), "area"),
        "",
        table(dict(sorted(by_cat.items())), "category"),
        "",
        f"{n} bad inputs tried: {total['clear']} raised clearly "
        f"({100 * total['clear'] / n:.1f} %), {total['accepted']} legitimately accepted; "
        f"answered well {total['clear'] + total['accepted']} "
        f"({100 * (total['clear'] + total['accepted']) / n:.1f} %). Silent: "
        f"{total['silent_nonfinite']} non-finite, {total['silent_wrong']} wrong, "
        f"{total['silent_finite']} finite; {total['unclear']} raised unclearly.",
    ]
    if total["harness_error"]:
        parts.append(f"{total['harness_error']} cases failed inside the harness (bugs).")
    return "\n".join(parts)


def listing(outcomes: list[Outcome]) -> str:
    lines = []
    order = {
        o: i
        for i, o in enumerate(
            ("silent_nonfinite", "silent_wrong", "silent_finite", "unclear", "harness_error")
        )
    }
    bad = [o for o in outcomes if o.outcome in order]
    bad.sort(key=lambda o: (o.area, order[o.outcome], o.category, o.id))
    area = None
    for o in bad:
        if o.area != area:
            area = o.area
            lines.append(f"\n== {area}")
        what = f"{o.exc_type} ({o.origin})" if o.exc_type else "returned"
        msg = (o.message or "").replace("\n", " ")
        if len(msg) > 220:
            msg = msg[:200] + f"... [{len(o.message or '')} chars]"
        lines.append(f"- [{o.outcome}] {o.id}: {what}: {o.reason}")
        if msg:
            lines.append(f"    {msg}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="print every case not answered well")
    parser.add_argument("--json", metavar="PATH", help="write every outcome to this JSON file")
    parser.add_argument("--only", metavar="TEXT", help="run the cases whose id contains TEXT")
    parser.add_argument("--interop", action="store_true", help="add the TransformerLens cases")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per case")
    parser.add_argument("--threads", type=int, default=1, help="torch threads")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    # torch imports its compiler stack on the first optimizer (seconds): once, outside the cases
    torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))])
    cases = catalogue.build_cases(interop=args.interop)
    ids = Counter(c.id for c in cases)
    dupes = [i for i, k in ids.items() if k > 1]
    if dupes:
        raise SystemExit(f"duplicate case ids: {dupes}")
    if args.only:
        cases = [c for c in cases if args.only in c.id]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="vecinterp-bad-inputs-") as root:
        fx = catalogue.Fx(Path(root))
        outcomes = [run_case(case, fx, args.timeout) for case in cases]
        fx.close()
    elapsed = time.perf_counter() - started
    print(f"vecinterp {getattr(vecinterp, '__version__', '?')} from {PACKAGE_DIR}")
    print(f"torch {torch.__version__}; {len(cases)} cases in {elapsed:.1f} s\n")
    print(summarise(outcomes))
    if args.list:
        print(listing(outcomes))
    if args.json:
        record = {
            "package": PACKAGE_DIR,
            "seconds": elapsed,
            "counts": dict(Counter(o.outcome for o in outcomes)),
            "cases": [dataclasses.asdict(o) for o in outcomes],
        }
        Path(args.json).write_text(json.dumps(record, indent=1))
    slow = sorted(outcomes, key=lambda o: -o.seconds)[:3]
    print("\nslowest cases: " + ", ".join(f"{o.id} {o.seconds:.1f} s" for o in slow))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
