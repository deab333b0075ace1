"""Models shipped inside the package (``vecinterp/tasks/reference/<folder>``): finding their
folders wherever vecinterp is installed, and loading them. Shared by the tasks that ship a
reference model (:mod:`vecinterp.tasks.affine_recurrence`,
:mod:`vecinterp.tasks.linear_regression`), which document them."""

import importlib.resources
import os
import typing
from pathlib import Path

import torch

from ._common import check_device, check_dtype

if typing.TYPE_CHECKING:  # the model is imported inside load_folder, see there
    from ..model.transformer import HookedVectorTransformer

_PACKAGE = "vecinterp.tasks"
_DIR = "reference"


def shipped_folder(folder: str, name: str, train_hint: str) -> Path:
    """The folder ``vecinterp/tasks/reference/<folder>`` of the installed package, resolved
    with :mod:`importlib.resources`; ``name`` and ``train_hint`` (how to make one instead)
    go into the errors when it is missing."""
    resource = importlib.resources.files(_PACKAGE) / _DIR / folder
    if not isinstance(resource, os.PathLike):
        raise FileNotFoundError(
            f"the reference model {name!r} is not a folder on disk: this vecinterp is installed "
            f"in a form whose files are not directories ({type(resource).__name__}); install it "
            "from a wheel or an sdist (pip install vecinterp)"
        )
    path = Path(os.fspath(resource))
    missing = [f for f in ("config.json", "model.safetensors") if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"the reference model {name!r} is missing from this installation ({path} lacks "
            f"{', '.join(missing)}). Reinstall vecinterp (pip install --force-reinstall "
            f"vecinterp; the wheel ships it), or {train_hint}"
        )
    return path


def load_folder(
    path: Path, device: str | torch.device | None, dtype: torch.dtype | None
) -> "HookedVectorTransformer":
    """``vi.load(path)`` on ``device`` (default: the CPU), cast to ``dtype`` if given."""
    # Imported here, not at the top: the tasks' data code does not depend on the model code,
    # and importing it stays light.
    from ..model.io import load

    if dtype is not None:
        check_dtype(dtype)
    target = None if device is None else check_device(device)
    model = load(path, device=target)
    return model if dtype is None else model.to(dtype=dtype)
