"""The cross-ablation of the paper: methods x {baseline, +router, +ensemble, +both, oracle} x datasets x
seeds on the Si-Blurry online stream, one training per (method, dataset, seed) with every variant scored
on it. ``python -m benchmarks.ablation`` (or ``python benchmarks/cross_ablation.py``) is the command line."""
