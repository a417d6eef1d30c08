"""The library in the environments its codebases pin: ``python -m benchmarks.compat``.

Each row of docs/compatibility.md's table (a codebase, its Python and its pins) becomes a virtual
environment built from the package registry; the project is installed in it as a user would, and the
library's tests, the README's Quick start and the codebase's upstream checks run there. The table of
outcomes goes to docs/results/compat/.
"""
