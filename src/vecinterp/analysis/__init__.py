"""Analysis: circuits, attribution, ablation, patching, detectors, geometry."""
