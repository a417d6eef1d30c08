"""CODA-Prompt (mammoth, LAMDA-PILOT): the real model at the harness size, the framework's own training
step and evaluation once, then every family asked to retrofit it; each must refuse.

Their nets keep the component pool in a separate ``prompt`` module (``CodaPrompt.forward(x_querry, l, x_block,
train=False, task_id=None)``, its window read from ``prompt.task_count`` inside the ViT's blocks): the
``coda_prompt`` family wires FlyGCL's layout only and refuses this one with that reason. Both frameworks' net classes hard-code
ViT-B/16 widths: the net is made without ``__init__`` with a harness-size ViT of the framework's own
class, a 32-wide linear classifier and a 32-wide ``CodaPrompt`` (2 tasks, 10 components, length 8).
On CPU the frameworks' training step raises (a zero tensor made with ``requires_grad`` and then ``.to``
the input's device is the same leaf on CPU, and the in-place ``+=`` on it fails); that is reported as
information, the refusals are the result.
"""

from __future__ import annotations

from typing import Callable

import torch

from benchmarks.upstream.checks import Settings, try_retrofit
from benchmarks.upstream.loading import quiet
from benchmarks.upstream.report import Report
from benchmarks.upstream.task_stream import make_stream

FAMILIES = (("l2p", dict(num_experts=2)), ("dualprompt", dict(num_experts=2)), ("mvp", {}), ("hide", {}),
            ("norga", {}), ("sprompt", {}), ("coda_prompt", {}))
CODA_PROMPT = dict(emb_d=32, n_tasks=2, prompt_param=[10, 8, 0.0], key_dim=32)


def run_probe(name: str, meta: dict, settings: Settings, net: torch.nn.Module, train_step: Callable,
              evaluate: Callable, what: str) -> Report:
    report = Report(name, meta, show_tracebacks=settings.verbose)
    x, y = make_stream(seed=settings.seed)[0][0][0]
    with quiet(not settings.verbose):
        try:
            step = f"ran (loss {train_step(x, y)})"
        except RuntimeError as error:
            step = f"raised on CPU: {error}"
        evaluate(x, y)
    report.add("info", "INFO", what, f"training step {step}; evaluation ran")
    for method, options in FAMILIES:
        status, detail = try_retrofit(net, method, **options)
        report.add(f"r:{method}", "REFUSED" if status == "REFUSED" else "FAIL", f"retrofit(net, method={method!r})",
                   detail)
    return report
