"""Benchmark code run from a checkout (never installed): Si-Blurry stream, metrics, datasets, methods."""
