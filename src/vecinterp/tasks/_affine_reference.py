"""The reference models shipped inside the package: where their folders are, and loading.

Public through :mod:`vecinterp.tasks.affine_recurrence` (``REFERENCE_MODELS``,
``reference_path``, ``load_reference``), documented there; this module keeps the package
data lookup apart from the task's data generation.
"""

import importlib.resources
import os
import typing
from pathlib import Path

import torch

from ._common import check_device, check_dtype

if typing.TYPE_CHECKING:  # the model is imported inside load_reference, see there
    from ..model.transformer import HookedVectorTransformer

REFERENCE_MODELS: dict[str, str] = {
    "fast": (
        "the paper's model (MODEL_CONFIG_KWARGS) trained with FAST_RECIPE, seed 0: "
        "12,000 steps, eval MSE 9.2e-05 on fixed_eval_set(24, 64, seed=10_000)"
    ),
    "paper": (
        "the paper's model (MODEL_CONFIG_KWARGS) trained with PAPER_RECIPE, seed 0: "
        "100,000 steps, eval MSE 1.2e-04 on fixed_eval_set(24, 64, seed=10_000)"
    ),
}
# Documented in affine_recurrence.REFERENCE_MODELS, the public name.


_REFERENCE_PACKAGE = "vecinterp.tasks"
_REFERENCE_DIR = "reference"


def reference_path(name: str = "fast") -> Path:
    """The folder of the shipped reference model ``name``, inside the installed package.

    The folder is what :func:`vecinterp.save` writes, so ``vi.load(reference_path(name))``
    loads it (as :func:`load_reference` does) and ``vecinterp.model.io.read_config`` reads
    its training metadata. It is resolved with :mod:`importlib.resources`, so it is found
    wherever vecinterp is installed (a wheel in ``site-packages`` or an editable checkout),
    whatever the working directory.

    Args:
        name: one of :data:`REFERENCE_MODELS` (``"fast"``: the :data:`FAST_RECIPE` model;
            ``"paper"``: the :data:`PAPER_RECIPE` model).

    Returns:
        The folder, a :class:`pathlib.Path`.

    Raises:
        TypeError: ``name`` is not a string.
        ValueError: ``name`` is not in :data:`REFERENCE_MODELS` (the message lists them).
        FileNotFoundError: the folder or its files are missing from this installation.

    Example:
        >>> from vecinterp.tasks import affine_recurrence as ar
        >>> path = ar.reference_path("fast")
        >>> path.name, (path / "config.json").is_file(), (path / "model.safetensors").is_file()
        ('affine_recurrence_fast', True, True)
        >>> path.parts[-4:-1]
        ('vecinterp', 'tasks', 'reference')
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a string, one of {sorted(REFERENCE_MODELS)}, got {name!r}")
    if name not in REFERENCE_MODELS:
        raise ValueError(
            f"name must be one of the reference models {sorted(REFERENCE_MODELS)}, got {name!r}"
        )
    folder = f"affine_recurrence_{name}"
    resource = importlib.resources.files(_REFERENCE_PACKAGE) / _REFERENCE_DIR / folder
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
            "vecinterp; the wheel ships it), or train one with examples/train_affine.py and "
            "load it with vecinterp.load"
        )
    return path


def load_reference(
    name: str = "fast",
    *,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> "HookedVectorTransformer":
    """Load a reference model shipped with vecinterp: ``vi.load(reference_path(name))``.

    Works from an installed wheel in any working directory; no training, no download.

    Args:
        name: one of :data:`REFERENCE_MODELS` (``"fast"``: the paper's model trained with
            :data:`FAST_RECIPE`, seed 0; ``"paper"``: with :data:`PAPER_RECIPE`, seed 0).
        device: where to put the weights (default: the CPU).
        dtype: a floating dtype to cast the weights to (default: as saved, float32).

    Returns:
        A new :class:`~vecinterp.HookedVectorTransformer` with the config
        ``VectorTransformerConfig(**MODEL_CONFIG_KWARGS)``.

    Raises:
        TypeError, ValueError, FileNotFoundError: as :func:`reference_path`; ValueError for a
        ``dtype`` that is not a floating dtype or an unknown ``device``.

    Example:
        >>> import vecinterp as vi
        >>> from vecinterp.tasks import affine_recurrence as ar
        >>> model = ar.load_reference()
        >>> model.cfg == vi.VectorTransformerConfig(**ar.MODEL_CONFIG_KWARGS)
        True
        >>> vi.evaluate(model, ar.fixed_eval_set(12, 32, seed=1)) < 1e-3  # masked MSE
        True
    """
    # Imported here, not at the top: the data code of this module does not depend on the
    # model code (see affine_recurrence.MODEL_CONFIG_KWARGS), and importing it stays light.
    from ..model.io import load

    path = reference_path(name)
    if dtype is not None:
        check_dtype(dtype)
    target = None if device is None else check_device(device)
    model = load(path, device=target)
    return model if dtype is None else model.to(dtype=dtype)
