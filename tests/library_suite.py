"""The library's tests: those that need only fly_modules, torch, numpy, timm, pytest, hypothesis, scipy and
tensorboard (one test), and pass on every supported environment (the oldest: Python 3.8, torch 1.12.1, timm 0.6.7, numpy 1.21).

Paths are relative to the repository root; ``fly_modules`` stands for the package's doctests. The
compatibility command (docs/compatibility.md) runs these in each pinned environment; tests of the
benchmarks are not listed (they need Python >= 3.10 and torch >= 2).
"""

LIBRARY_TESTS = [
    "tests/test_router.py",
    "tests/test_router_blocked.py",
    "tests/test_router_solvers.py",
    "tests/test_states_across_torch.py",
    "tests/test_ensemble.py",
    "tests/test_tensor_arguments.py",
    "tests/test_library_warnings.py",
    "tests/test_masks_schedule.py",
    "tests/test_distributed.py",
    "tests/test_torch_fallbacks.py",
    "tests/test_python38_source.py",
    "tests/test_adapters_batch.py",
    "tests/test_adapters_errors.py",
    "tests/test_adapters_hide_shared_pass.py",
    "tests/test_adapters_layer.py",
    "tests/test_adapters_live_retrofit.py",
    "tests/test_adapters_log.py",
    "tests/test_adapters_state.py",
    "tests/test_adapters_upstream.py",
    "tests/test_adapters_verify.py",
    "tests/test_adapters_verify_restores.py",
    "tests/test_cuda_core.py",
    "fly_modules",
]
