"""Retrofits of the router and the ensemble into existing prompt-CL codebases (``fly_modules.adapters``).

Installed from the repository's top-level ``adapters/`` folder as the subpackage
``fly_modules.adapters``; it depends on torch only.
"""
