"""The paper's studies beside the cross-ablation: routing algorithms, ensemble aggregations, components,
backbones and cost (docs/benchmark.md, "Studies")."""
