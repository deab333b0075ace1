"""vecinterp: mechanistic interpretability for transformers on real vectors.

Axis names, used verbatim in every shape annotation:

=============  ===================================================
``batch``      independent sequences
``pos``        positions (``dest_pos``/``src_pos`` in attention)
``d_in``       input vector size
``d_out``      output vector size
``d_model``    residual stream width
``n_heads``    heads per layer
``d_head``     width of one head
``d_mlp``      MLP hidden width
``n_layers``   blocks
``component``  a stack of residual-stream contributions
=============  ===================================================

Vectors are rows and weights multiply on the right: ``resid @ W_Q``.
"""

from .analysis import *  # noqa: F403 - the analysis API is public at the top level
from .analysis import __all__ as _analysis_all
from .cache import ActivationCache, act_name
from .dictionary import (
    ActivationBuffer,
    DictionaryConfig,
    DictionaryStats,
    DictionaryTrainResult,
    FeatureReport,
    SparseAutoencoder,
    SparseDictionary,
    SplicedPoint,
    SpliceMetric,
    Transcoder,
    decoder_similarity,
    decompose_resid_features,
    dictionary_decomposition,
    evaluate_dictionary,
    feature_correlations,
    feature_density,
    feature_report,
    harvest_activations,
    load_dictionary,
    load_saelens,
    save_dictionary,
    save_saelens,
    splice,
    splice_metric,
    spliced_dictionaries,
    train_dictionary,
    transcoder_hooks,
    unspliced_copy,
)
from .factored_matrix import FactoredMatrix
from .hooks import HookHandle, HookPoint
from .interop import (
    from_garg_checkpoint,
    from_hf,
    from_torch_encoder,
    from_transformer_lens,
    tl_forward_vectors,
    tl_run_with_cache_vectors,
    to_hf,
    to_torch_encoder,
    to_transformer_lens,
)
from .loss import masked_mse
from .memory import keep_freed_memory
from .model import CompiledHooksWarning, HookedVectorTransformer, VectorTransformerConfig
from .model.io import load, save
from .model.processing import (
    center_writing_weights,
    fold_layer_norm,
    fold_value_biases,
    process_weights,
)
from .threads import choose_threads, use_threads
from .training import (
    EnsembleResult,
    SlowTrainingWarning,
    TrainHistory,
    TrainingDivergedError,
    TrainResult,
    default_device,
    evaluate,
    latest_checkpoint,
    lr_at,
    train,
    train_ensemble,
)

__version__ = "0.1.0"

__all__ = [
    *_analysis_all,
    "ActivationCache",
    "EnsembleResult",
    "SlowTrainingWarning",
    "TrainHistory",
    "TrainResult",
    "TrainingDivergedError",
    "default_device",
    "evaluate",
    "latest_checkpoint",
    "lr_at",
    "train",
    "train_ensemble",
    "choose_threads",
    "keep_freed_memory",
    "use_threads",
    "FactoredMatrix",
    "HookHandle",
    "HookPoint",
    "CompiledHooksWarning",
    "HookedVectorTransformer",
    "VectorTransformerConfig",
    "act_name",
    "center_writing_weights",
    "fold_layer_norm",
    "fold_value_biases",
    "load",
    "masked_mse",
    "process_weights",
    "save",
    "from_hf",
    "from_garg_checkpoint",
    "from_torch_encoder",
    "to_hf",
    "to_torch_encoder",
    "from_transformer_lens",
    "tl_forward_vectors",
    "tl_run_with_cache_vectors",
    "to_transformer_lens",
    "ActivationBuffer",
    "DictionaryConfig",
    "DictionaryStats",
    "DictionaryTrainResult",
    "FeatureReport",
    "SparseAutoencoder",
    "SparseDictionary",
    "Transcoder",
    "evaluate_dictionary",
    "feature_correlations",
    "feature_density",
    "feature_report",
    "harvest_activations",
    "load_dictionary",
    "save_dictionary",
    "train_dictionary",
    "splice",
    "splice_metric",
    "spliced_dictionaries",
    "unspliced_copy",
    "SpliceMetric",
    "SplicedPoint",
    "dictionary_decomposition",
    "decoder_similarity",
    "decompose_resid_features",
    "save_saelens",
    "load_saelens",
    "transcoder_hooks",
]
