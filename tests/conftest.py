"""Test-wide settings."""

import torch

# The tests run tiny models on a 2-core machine: one intra-op thread for the whole suite avoids
# oversubscription (about 100x faster than two contended threads at these sizes). Benchmarks set
# their own thread counts.
torch.set_num_threads(1)
