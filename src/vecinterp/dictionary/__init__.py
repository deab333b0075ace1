"""Sparse dictionaries for vector models: sparse autoencoders and transcoders, their
activations, training, evaluation and files.

- :class:`SparseAutoencoder`, :class:`Transcoder` (built from a :class:`DictionaryConfig`):
  hooked modules with SAELens's hook names; ReLU + L1, TopK, BatchTopK and JumpReLU
  (:mod:`vecinterp.dictionary.jumprelu`: its straight-through estimators).
- :func:`harvest_activations`, :class:`ActivationBuffer`: activations of any
  :class:`~vecinterp.HookedVectorTransformer` at named hook points and positions.
- :func:`train_dictionary`: a seeded, checkpointed, exactly resumable training loop.
- :func:`evaluate_dictionary`: FVU, L0, dead and dense features; :mod:`.report`: feature
  density, decoder similarity to given directions, correlations with a variable, and
  :func:`feature_report` (a :class:`FeatureReport` with a Markdown table).
- :func:`save_dictionary`, :func:`load_dictionary`: safetensors + JSON, checksummed.
- :func:`splice` (:mod:`.splice`): a new model with dictionaries at named hook points,
  exact with the error term; :func:`splice_metric` (:mod:`.report`): the MSE without it.
- :func:`dictionary_decomposition`, :func:`decompose_resid_features` (:mod:`.decompose`):
  features + bias + error, counted once.
- :func:`save_saelens`, :func:`load_saelens` (:mod:`.saelens`): SAELens's on-disk layout.
"""

from .activations import ActivationBuffer, harvest_activations
from .decompose import decompose_resid_features, dictionary_decomposition
from .evaluate import DictionaryStats, evaluate_dictionary
from .io import load_dictionary, save_dictionary
from .modules import (
    DictionaryConfig,
    SparseAutoencoder,
    SparseDictionary,
    Transcoder,
    transcoder_hooks,
)
from .report import (
    FeatureReport,
    SpliceMetric,
    decoder_similarity,
    feature_correlations,
    feature_density,
    feature_report,
    splice_metric,
)
from .saelens import SAELENS_VERSION, load_saelens, save_saelens
from .splice import SplicedPoint, splice, spliced_dictionaries, unspliced_copy
from .train import DictionaryTrainResult, train_dictionary

__all__ = [
    "SAELENS_VERSION",
    "ActivationBuffer",
    "DictionaryConfig",
    "DictionaryStats",
    "DictionaryTrainResult",
    "FeatureReport",
    "SparseAutoencoder",
    "SparseDictionary",
    "SpliceMetric",
    "SplicedPoint",
    "Transcoder",
    "decoder_similarity",
    "decompose_resid_features",
    "dictionary_decomposition",
    "evaluate_dictionary",
    "feature_correlations",
    "feature_density",
    "feature_report",
    "harvest_activations",
    "load_dictionary",
    "load_saelens",
    "save_dictionary",
    "save_saelens",
    "splice",
    "splice_metric",
    "spliced_dictionaries",
    "unspliced_copy",
    "train_dictionary",
    "transcoder_hooks",
]
