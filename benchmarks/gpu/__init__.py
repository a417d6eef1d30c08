"""Everything to measure on a GPU, in one command (docs/gpu.md)."""
