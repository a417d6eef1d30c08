"""Test-wide settings."""

import torch

# The tests run tiny models on a 2-core machine: one intra-op thread avoids oversubscription (and is
# ~100x faster than two contended threads for these sizes). Benchmarks set their own thread counts.
torch.set_num_threads(1)
