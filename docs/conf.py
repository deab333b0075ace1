"""Sphinx configuration for the vecinterp documentation.

Build (from the repository root): ``python -m sphinx -W --keep-going -b html docs docs/_build/html``.
"""

import os
import sys

# vecinterp is installed editable; this keeps the build working from a plain checkout too.
sys.path.insert(0, os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "src")))

project = "vecinterp"
author = "vecinterp contributors"
copyright = "2025, vecinterp contributors"

try:
    from vecinterp import __version__ as release
except ImportError:  # pragma: no cover - only when the package cannot be imported
    release = "0.1.0"
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.autosummary",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
]
# intersphinx is left out on purpose: it fetches objects.inv over the network at build
# time, and a build without network access would then warn (and fail under -W).

autosummary_generate = True
autodoc_typehints = "description"
autodoc_member_order = "bysource"
autodoc_default_options = {"members": True}

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False
# Attribute types come from jaxtyping annotations such as Float[Tensor, "*fit"], whose
# "*" reStructuredText would read as unterminated emphasis; the docstrings give shapes.
napoleon_attr_annotations = False

nitpicky = False

templates_path = ["_templates"]
exclude_patterns = ["_build"]
# _static/tutorial holds the tutorial's figures (written by examples/affine_recurrence.py);
# copying it lets a figure link to its full-size image.
html_static_path = ["_static"]

html_theme = "furo"
html_title = "vecinterp"
