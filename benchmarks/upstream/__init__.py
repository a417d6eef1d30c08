"""The adapters run on the real classes and loops of upstream continual-learning repositories.

``python -m benchmarks.upstream --checkouts DIR`` imports each repository's own model classes and
per-batch training / evaluation calls from a checkout in ``DIR`` (never copied), retrofits the model
with ``fly_modules.adapters.retrofit`` and runs the checks of ``checks.py`` (one function per check,
named for what it establishes); it prints the table of ``docs/adapters.md``. Every harness runs in its
own process. See ``docs/adapters.md``.
"""
