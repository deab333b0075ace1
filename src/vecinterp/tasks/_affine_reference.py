"""The reference models shipped inside the package: where their folders are, and loading.

Public through :mod:`vecinterp.tasks.affine_recurrence` (``REFERENCE_MODELS``,
``reference_path``, ``load_reference``), documented there; this module keeps the package
data lookup apart from the task's data generation.
"""

import typing
from pathlib import Path

import torch

from ._shipped import load_folder, shipped_folder

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
    return shipped_folder(
        f"affine_recurrence_{name}",
        name,
        "train one with examples/train_affine.py and load it with vecinterp.load",
    )


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
    return load_folder(reference_path(name), device, dtype)
