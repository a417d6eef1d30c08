"""One module per upstream repository x method family (``run(checkout, settings)``), and per-repository
import and construction helpers (the ``_`` modules)."""
