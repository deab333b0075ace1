"""Analysis: circuits and scores, direct attribution, ablation, patching, head detectors,
geometry and emergence across checkpoints, linear probes, subspace patching and
distributed alignment search. Every function works on any
:class:`~vecinterp.HookedVectorTransformer` and returns new tensors or models; none edits
the model it is given."""

from .ablation import (
    ablate,
    ablate_heads,
    ablate_patterns,
    head_ablation_sweep,
    mean_ablation_hook,
    mean_activations,
    pattern_ablation_hook,
    resample_ablation_hook,
    zero_ablation_hook,
)
from .alignment_search import AlignmentResult, alignment_search
from .attribution import DirectAttribution, direct_attribution, next_vector_targets
from .attribution_patching import attribution_patching
from .circuit_discovery import CircuitResult, circuit_threshold_sweep, discover_circuit
from .circuits import full_ov_circuit, full_qk_circuit, ov_circuit, pos_qk_circuit, qk_circuit
from .detectors import (
    attention_patterns,
    detect_heads,
    induction_score,
    induction_target,
    pattern_score,
    position_k_score,
    position_k_target,
    previous_position_score,
    previous_position_target,
    repeated_random_vectors,
)
from .emergence import EmergenceTable, emergence, path_attention
from .geometry import (
    LinearFit,
    OVLinearity,
    fit_line,
    fraction_outside_embedding,
    logit_lens,
    ov_linearity,
)
from .patching import activation_patching, patch_hook
from .path_patching import path_patching
from .probes import ProbeResult, fit_probes
from .qk_patch import patch_qk_identity
from .scores import CompositionBaseline, composition_baseline, composition_scores, eigenvalue_scores
from .subspace import orthonormal_basis, patch_subspace, subspace_patch_hook

__all__ = [
    "AlignmentResult",
    "ProbeResult",
    "alignment_search",
    "fit_probes",
    "orthonormal_basis",
    "patch_subspace",
    "subspace_patch_hook",
    "EmergenceTable",
    "emergence",
    "path_attention",
    "ablate",
    "ablate_heads",
    "ablate_patterns",
    "head_ablation_sweep",
    "mean_ablation_hook",
    "mean_activations",
    "pattern_ablation_hook",
    "resample_ablation_hook",
    "zero_ablation_hook",
    "CircuitResult",
    "CompositionBaseline",
    "DirectAttribution",
    "LinearFit",
    "OVLinearity",
    "activation_patching",
    "attention_patterns",
    "attribution_patching",
    "circuit_threshold_sweep",
    "composition_baseline",
    "composition_scores",
    "detect_heads",
    "direct_attribution",
    "discover_circuit",
    "eigenvalue_scores",
    "fit_line",
    "fraction_outside_embedding",
    "full_ov_circuit",
    "full_qk_circuit",
    "induction_score",
    "induction_target",
    "logit_lens",
    "next_vector_targets",
    "ov_circuit",
    "ov_linearity",
    "patch_hook",
    "path_patching",
    "patch_qk_identity",
    "pattern_score",
    "pos_qk_circuit",
    "position_k_score",
    "position_k_target",
    "previous_position_score",
    "previous_position_target",
    "qk_circuit",
    "repeated_random_vectors",
]
