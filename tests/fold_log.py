"""The router's summation history, for tests that compare two runs bit for bit.

Two runs give the same bits on every CPU only when they add the same rows to ``G`` and ``Q`` in the same
rank-k updates (a CPU's BLAS may split a longer update's sum differently). :class:`FoldLog` records the
rows of every update in order; a test asserts two runs' histories are equal before it compares their bits.
"""

from __future__ import annotations

from typing import List

from fly_modules import _blocked


class FoldLog:
    """Installed with pytest's ``monkeypatch``: ``sizes`` lists the rows of each fold, in order."""

    def __init__(self, monkeypatch) -> None:
        self.sizes: List[int] = []
        self._add_rows = _blocked.add_rows
        monkeypatch.setattr(_blocked, "add_rows", self._logged)

    def _logged(self, gram, cross, phi, ids, panel_rows=None) -> None:
        self.sizes.append(int(phi.shape[0]))
        self._add_rows(gram, cross, phi, ids, panel_rows)

    def take(self) -> List[int]:
        """The history so far; the log starts again empty."""
        sizes, self.sizes = self.sizes, []
        return sizes
