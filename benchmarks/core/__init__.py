"""The benchmarks' shared core: what every command (the cross-ablation, the studies, fidelity, speed, the
GPU suite and the proxy) reads and writes. The Si-Blurry stream, the anytime metrics, the protocol and its
presets, the generated datasets' shapes, result and checkpoint files, timers and the user-error type.

It imports the data, backbone and parallel helpers only: no method, runner or study module
(``tests/test_import_layers.py`` checks the graph)."""
