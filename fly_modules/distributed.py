"""Router statistics across ``torch.distributed`` processes.

The router's statistics are sums, so data-parallel training combines them exactly:

* :func:`all_reduce_statistics` sums whole routers that each accumulated a *disjoint* part of the
  data (a shard each), once; afterwards every process holds the union.
* :func:`all_gather_update` keeps the routers of all processes identical during training: each step
  gathers the processes' feature batches and every process adds the whole global batch (what
  ``router.update`` does when ``router.process_group`` is set).
* :func:`gather_rows` concatenates every process's rows, sizes may differ.

See ``docs/router.md`` ("Distributed training") for costs and the gloo shutdown note.
"""

from __future__ import annotations

from ._collectives import gather_rows
from .router import all_gather_update, all_reduce_statistics

__all__ = ["all_reduce_statistics", "all_gather_update", "gather_rows"]
