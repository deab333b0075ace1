"""A first look at vecinterp: build the affine-recurrence paper's architecture, run it with
a cache, read attention patterns and the residual decomposition, process the weights and
save/load the model.

Run: python examples/quickstart.py [--out DIR]
"""

import argparse
import tempfile
import time

import torch

import vecinterp as vi


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None, help="directory to save the model in")
    args = parser.parse_args()
    start = time.perf_counter()

    cfg = vi.VectorTransformerConfig(
        d_in=40, d_model=128, d_head=64, n_heads=8, n_layers=3, d_mlp=3072, n_ctx=32
    )
    model = vi.HookedVectorTransformer(cfg, seed=0)
    print(model)

    x = torch.randn(16, 14, cfg.d_in, generator=torch.Generator().manual_seed(0))
    y, cache = model.run_with_cache(x)
    print(f"output {tuple(y.shape)}; cached {len(cache)} activations")
    print(
        f"layer-0 pattern {tuple(cache['pattern', 0].shape)}, rows sum to 1: "
        f"{torch.allclose(cache['pattern', 0].sum(-1), torch.ones(1))}"
    )

    parts, labels = cache.decompose_resid(return_labels=True)
    gap = (parts.sum(0) - cache["resid_post", -1]).abs().max().item()
    print(f"residual = {' + '.join(labels)} (max gap {gap:.1e})")

    heads, head_labels = cache.stack_head_results(layer=1, return_labels=True)
    print(f"per-head outputs of layer 0: {head_labels}, shape {tuple(heads.shape)}")

    processed = vi.process_weights(model)
    diff = (processed(x) - y).abs().max().item()
    print(f"process_weights: {processed.cfg.normalization}, max output change {diff:.1e}")

    with tempfile.TemporaryDirectory() as tmp:
        path = vi.save(processed, args.out or f"{tmp}/model")
        reloaded = vi.load(path)
        same = torch.equal(reloaded(x), processed(x))
        print(f"saved to {path.name}/ and reloaded: identical outputs = {same}")
    print(f"done in {time.perf_counter() - start:.1f} s")


if __name__ == "__main__":
    main()
