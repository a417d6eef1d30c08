"""Where a training's time goes, by part, and what the evaluation's reuse saves, measured side by side.

    python -m benchmarks.ablation.profile                       # proxy-short, L2P and HiDe-Prompt, CPU seconds
    python -m benchmarks.ablation.profile --methods dualprompt --preset proxy --output profile.json

Each method trains once on the preset's first dataset and seed; at every evaluation point two evaluators
score the same model: the run's own (frozen features of a test batch the previous evaluation had are
reused, no pass is repeated) and the reference without reuse (every pass at every evaluation). Their logs
must be equal (the command fails otherwise) and their times give the saving. Times are CPU seconds of
the process on the CPU (``time.process_time``: on a shared machine with one torch thread, what the
work costs an idle core) and wall seconds on CUDA. docs/performance.md ("Profile of a run") quotes it.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any, Dict, Optional, Sequence

import torch

from benchmarks.core.results import write_text_atomic
from benchmarks.flags import Parser, add_output_flag

from ..core.presets import PRESETS
from ..core.timer import PartTimer
from ..core.variants import ABLATION_VARIANTS, ORACLE_VARIANTS, variants_for
from ..methods import method_class
from .arguments import build_parser, parse_methods
from .evaluation import VariantEvaluator
from .runner import build_run
from .sweep import resolve
from .sweep_data import load_data

__all__ = ["profile_method", "main"]


def profile_method(method: str, dataset: str, seed: int, protocol: Any, train: Any, test: Any, *,
                   device: torch.device) -> Dict[str, Any]:
    """One training of ``method`` with both evaluators at every evaluation point; figures by part."""
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    timer, reference_timer = PartTimer(device, clock=clock), PartTimer(device, clock=clock)
    variants = variants_for(method_class(method), [*ABLATION_VARIANTS, *ORACLE_VARIANTS])
    run = build_run(method, dataset, seed, variants, protocol, train, test, device=device, timer=timer)
    fast = run.evaluator
    reference = VariantEvaluator(
        run.model, fast.components, fast.usage, variants, test=test, exposure=run.exposure, parallel=run.parallel,
        device=device, batch_size=protocol.test_batch_size, member_names=fast.member_names,
        meta={name: log.meta for name, log in fast.logs.items()}, timer=reference_timer, reuse=False,
    )

    def both(kind: str, **point: Any) -> None:
        # Alternating which goes first, so that neither always finds the other's data in the caches.
        first, second = (fast, reference) if len(fast.routing) % 2 else (reference, fast)
        first(kind, **point)
        second(kind, **point)

    run.trainer.evaluate_at = both
    started = clock()
    run.trainer.train()
    total = clock() - started
    batches = run.trainer.position.batches
    evaluations = len(next(iter(fast.logs.values())).records)
    identical = all(fast.logs[name].to_dict() == reference.logs[name].to_dict() for name in fast.logs) and (
        fast.routing == reference.routing and fast.expert_matrix == reference.expert_matrix)
    scored = sum(sum(record.total) for record in next(iter(fast.logs.values())).records)
    parts = timer.summary()
    train_parts = {p: v["seconds"] / batches for p, v in parts.items() if p.startswith("train/")}
    eval_parts = {p: v["seconds"] / evaluations for p, v in parts.items() if p.startswith("eval/")}
    reference_parts = {p: v["seconds"] / evaluations for p, v in reference_timer.summary().items()}
    return {
        "method": method, "dataset": dataset, "seed": seed, "device": str(device),
        "clock": "process_time" if device.type == "cpu" else "perf_counter", "batches": batches,
        "evaluations": evaluations, "test_images": len(test), "logs_identical": identical,
        "train_per_batch": sum(train_parts.values()), "train_parts_per_batch": train_parts,
        "eval_per_evaluation": sum(eval_parts.values()), "eval_parts_per_evaluation": eval_parts,
        "reference_eval_per_evaluation": sum(reference_parts.values()),
        "reference_eval_parts_per_evaluation": reference_parts,
        "run_seconds_with_both_evaluations": total,
        "prompted_passes_per_image": fast.prompted_rows / max(scored, 1),
        "reference_prompted_passes_per_image": reference.prompted_rows / max(scored, 1),
    }


def _format(result: Dict[str, Any]) -> str:
    unit = "CPU ms" if result["clock"] == "process_time" else "ms"
    lines = [f"{result['dataset']}/{result['method']}/seed{result['seed']}: {result['batches']} batches, "
             f"{result['evaluations']} evaluations of up to {result['test_images']} test images "
             f"({'logs identical' if result['logs_identical'] else 'LOGS DIFFER'})",
             f"  training, {unit} per stream batch: {1000 * result['train_per_batch']:.1f} = "
             + " + ".join(f"{p.split('/')[1]} {1000 * v:.1f}" for p, v in result["train_parts_per_batch"].items())]
    for name, key in (("evaluation", "eval"), ("evaluation without reuse", "reference_eval")):
        parts = result[f"{key}_parts_per_evaluation"]
        lines.append(f"  {name}, {unit} per evaluation: {1000 * result[f'{key}_per_evaluation']:.1f} = "
                     + " + ".join(f"{p.split('/')[1]} {1000 * v:.1f}" for p, v in parts.items()))
    ratio = result["reference_eval_per_evaluation"] / max(result["eval_per_evaluation"], 1e-12)
    lines.append(f"  evaluation speed-up from reuse: {ratio:.2f}x; prompted passes per scored image "
                 f"{result['prompted_passes_per_image']:.2f} (without reuse "
                 f"{result['reference_prompted_passes_per_image']:.2f})")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = Parser(prog="python -m benchmarks.ablation.profile", description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="proxy-short", choices=list(PRESETS))
    parser.add_argument("--methods", type=parse_methods, default=["l2p", "hide"])
    parser.add_argument("--device", default=None)
    add_output_flag(parser, "--output", "file", default=None, help="JSON file for the figures")
    args = parser.parse_args(argv)
    sweep = resolve(build_parser().parse_args(
        ["--preset", args.preset, "--methods", ",".join(args.methods), *(["--device", args.device] if args.device else [])]))
    if sweep.threads:
        torch.set_num_threads(sweep.threads)
    device = torch.device(sweep.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dataset = sweep.datasets[0]
    train, test = load_data(dataset, sweep, "data", False)
    results = []
    for method in sweep.methods:
        result = profile_method(method, dataset, sweep.seeds[0], sweep.protocol, train, test, device=device)
        print(_format(result), flush=True)
        results.append(result)
    if args.output:
        write_text_atomic(args.output, json.dumps({"preset": args.preset, "threads": torch.get_num_threads(),
                                                 "torch": torch.__version__, "results": results}, indent=1))
    return 0 if all(r["logs_identical"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
