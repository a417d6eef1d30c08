"""Speed and memory benchmarks: each prints ratios of two approaches timed side by side in one run
(docs/performance.md)."""
