"""Sparse dictionaries for vector models: sparse autoencoders and transcoders, their
activations, training, evaluation and files.

- :class:`SparseAutoencoder`, :class:`Transcoder` (built from a :class:`DictionaryConfig`):
  hooked modules with SAELens's hook names; ReLU + L1, TopK, BatchTopK and JumpReLU
  (:mod:`vecinterp.dictionary.jumprelu`: its straight-through estimators).
- :func:`harvest_activations`, :class:`ActivationBuffer`: activations of any
  :class:`~vecinterp.HookedVectorTransformer` at named hook points and positions.
- :func:`train_dictionary`: a seeded, checkpointed, exactly resumable training loop.
- :func:`evaluate_dictionary`: FVU, L0, dead and dense features.
- :func:`save_dictionary`, :func:`load_dictionary`: safetensors + JSON, checksummed.
"""

from .activations import ActivationBuffer, harvest_activations
from .evaluate import DictionaryStats, evaluate_dictionary
from .io import load_dictionary, save_dictionary
from .modules import (
    DictionaryConfig,
    SparseAutoencoder,
    SparseDictionary,
    Transcoder,
    transcoder_hooks,
)
from .train import DictionaryTrainResult, train_dictionary

__all__ = [
    "ActivationBuffer",
    "DictionaryConfig",
    "DictionaryStats",
    "DictionaryTrainResult",
    "SparseAutoencoder",
    "SparseDictionary",
    "Transcoder",
    "evaluate_dictionary",
    "harvest_activations",
    "load_dictionary",
    "save_dictionary",
    "train_dictionary",
    "transcoder_hooks",
]
