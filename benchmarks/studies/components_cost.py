"""The cost breakdown of FlyPrompt's components (the paper's ``components_cost`` table): parameters and
storage of REAR's ``G`` and ``Q``, its router head, the prompts and the TE2 heads as functions of the
expansion width M, the number of experts T, the prompt length l and the width d, beside the paper's
numbers (millions of entries; its defaults M = 10,000, T = 5, l = 20, d = 768).

A pure computation from the formulas of :data:`COMPONENT_COSTS`; ``tests/test_study_components_cost.py``
checks each against the size of the real object (``AnalyticRouter``'s buffers, ``TemporalEnsembleHead``'s
state_dict, FlyPrompt's prompts). Nothing is trained or downloaded.

    python -m benchmarks.studies.components_cost [--expansion-dim M] [--experts T] [--prompt-length l]
        [--width d] [--output DIR]
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Sequence

from benchmarks.flags import Parser, add_flag, add_output_flag, add_shared_flag
from fly_modules._validation import Integer, shared_default

from ..core.files import save_figure
from .study_figures import pyplot_or_none

__all__ = ["CostSetting", "ComponentCost", "COMPONENT_COSTS", "PAPER_COMPONENT_COSTS", "cost_breakdown",
           "format_breakdown", "write_breakdown", "main"]


@dataclass(frozen=True)
class CostSetting:
    """The sizes the costs depend on; the defaults are the paper's (FlyPrompt on ViT-B/16, 100 classes)."""

    expansion_dim: int = shared_default("expansion_dim")  # M
    experts: int = 5  # T
    prompt_length: int = 20  # l
    width: int = 768  # d
    prompt_layers: int = 5  # blocks with prompts (FlyPrompt: 0-4)
    classes: int = 100  # C
    decays: int = 2  # EMA copies per expert (0.9, 0.99)


Count = Callable[[CostSetting], int]


@dataclass(frozen=True)
class ComponentCost:
    """One component: entries counted as parameters (all, trainable) and stored, each a formula of the
    setting; the dtype this implementation stores it in; the paper's orders of storage and computation."""

    key: str
    label: str
    total: Count
    trainable: Count
    storage: Count
    dtype_bytes: int
    storage_order: str
    compute_order: str
    note: str = ""


def _head(s: CostSetting) -> int:
    return s.width * s.classes + s.classes


#: The rule, written once: every table, figure and test reads these formulas.
COMPONENT_COSTS = (
    ComponentCost("G", "G matrix", lambda s: 0, lambda s: 0, lambda s: s.expansion_dim ** 2, 8, "O(M^2)", "O(M^3)",
                  "float64 buffer"),
    ComponentCost("Q", "Q matrix", lambda s: 0, lambda s: 0, lambda s: s.expansion_dim * s.experts, 8, "O(MT)",
                  "O(MT)", "float64 buffer"),
    ComponentCost("router_head", "Router head", lambda s: s.expansion_dim * s.experts, lambda s: 0,
                  lambda s: s.expansion_dim * s.experts, 8, "O(MT)", "O(MT)",
                  "here the cached ridge solution, recomputed from G and Q: not in the state_dict"),
    ComponentCost("expansion", "random projection R", lambda s: 0, lambda s: 0,
                  lambda s: s.expansion_dim * s.width, 8, "O(Md)", "O(Md)",
                  "not in the paper's table; a float64 buffer here, regenerable from its seed"),
    ComponentCost("prompts", "Prompts", lambda s: s.prompt_layers * s.experts * s.prompt_length * s.width,
                  lambda s: s.prompt_layers * s.experts * s.prompt_length * s.width,
                  lambda s: s.prompt_layers * s.experts * s.prompt_length * s.width, 4, "O(ld)", "O(l^2 d)",
                  "T experts x prompt layers x l tokens x d"),
    ComponentCost("te2_heads", "TE2 heads", lambda s: s.experts * s.decays * _head(s), _head,
                  lambda s: s.experts * s.decays * _head(s), 4, "O(dT)", "O(dT)",
                  "total and storage: the T x decays EMA copies (buffers); trainable: the online head"),
)

#: the paper's table (millions): key -> (total, trainable, storage); the random projection is not in it
PAPER_COMPONENT_COSTS: Dict[str, tuple] = {
    "G": (0.00, 0.00, 100), "Q": (0.00, 0.00, 0.05), "router_head": (0.05, 0.00, 0.05),
    "prompts": (0.38, 0.38, 0.38), "te2_heads": (0.77, 0.08, 0.77),
}


def cost_breakdown(setting: CostSetting = CostSetting()) -> List[Dict[str, Any]]:
    """One row per component: millions of parameters (all, trainable) and of stored entries, megabytes
    stored in this implementation's dtype, and the paper's numbers (``None`` where it has none)."""
    rows = []
    for cost in COMPONENT_COSTS:
        paper = PAPER_COMPONENT_COSTS.get(cost.key, (None, None, None))
        storage = cost.storage(setting)
        rows.append({"component": cost.key, "label": cost.label, "total": cost.total(setting) / 1e6,
                     "trainable": cost.trainable(setting) / 1e6, "storage": storage / 1e6,
                     "megabytes": storage * cost.dtype_bytes / 2 ** 20, "storage_order": cost.storage_order,
                     "compute_order": cost.compute_order, "note": cost.note, "paper_total": paper[0],
                     "paper_trainable": paper[1], "paper_storage": paper[2]})
    return rows


def _cell(value: Optional[float]) -> str:
    return "-" if value is None else f"{value:.2f}"


def format_breakdown(rows: Sequence[Dict[str, Any]], setting: CostSetting = CostSetting()) -> str:
    """Markdown: ours / the paper's per column (millions), the bytes stored here, the orders, the notes."""
    s = setting
    lines = [f"Millions of entries at M = {s.expansion_dim}, T = {s.experts}, l = {s.prompt_length}, d = {s.width} "
             f"({s.prompt_layers} prompt layers, {s.classes} classes, {s.decays} EMA decays); the paper's at its "
             "defaults M = 10,000, T = 5, l = 20, d = 768.", "",
             "| component | total | paper | trainable | paper | storage | paper | MB here | storage cost | "
             "computation cost | note |", "|" + "---|" * 11]
    for r in rows:
        lines.append(f"| {r['label']} | {_cell(r['total'])} | {_cell(r['paper_total'])} | {_cell(r['trainable'])} | "
                     f"{_cell(r['paper_trainable'])} | {_cell(r['storage'])} | {_cell(r['paper_storage'])} | "
                     f"{r['megabytes']:.1f} | {r['storage_order']} | {r['compute_order']} | {r['note']} |")
    return "\n".join(lines)


def plot_breakdown(output: Path, rows: Sequence[Dict[str, Any]], name: str) -> Optional[Path]:
    """Stored entries per component, ours beside the paper's, on a log scale (``<name>.png``)."""
    plt = pyplot_or_none(f"{name}.png")
    if plt is None:
        return None
    figure, axis = plt.subplots(figsize=(7, 3.6))
    x = list(range(len(rows)))
    axis.bar([i - 0.2 for i in x], [r["storage"] for r in rows], 0.4, label="formula (this setting)")
    paper = [r["paper_storage"] if r["paper_storage"] is not None else float("nan") for r in rows]
    axis.bar([i + 0.2 for i in x], paper, 0.4, label="paper (its defaults)")
    axis.set_yscale("log")
    axis.set_xticks(x, [r["label"] for r in rows], fontsize=7, rotation=20)
    axis.set_ylabel("storage (millions of entries)")
    axis.legend(fontsize=7)
    figure.tight_layout()
    path = output / f"{name}.png"
    save_figure(figure, path)
    plt.close(figure)
    return path


def write_breakdown(output: Path, setting: CostSetting = CostSetting(), name: str = "study_components_cost") -> str:
    """Write ``<name>.md``, ``.json`` and ``.png`` into ``output``; returns the markdown."""
    rows = cost_breakdown(setting)
    text = format_breakdown(rows, setting)
    output.mkdir(parents=True, exist_ok=True)
    (output / f"{name}.md").write_text(text + "\n")
    (output / f"{name}.json").write_text(json.dumps({"setting": asdict(setting), "rows": rows}, indent=1) + "\n")
    plot_breakdown(output, rows, name)
    return text


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = Parser(prog="python -m benchmarks.studies.components_cost", description=__doc__.split("\n\n")[0])
    defaults = CostSetting()
    add_shared_flag(parser, "expansion_dim", narrower=[Integer(minimum=1)], help="M, the router's expansion width")
    for field, text in (("experts", "T, experts"), ("prompt_length", "l, prompt tokens"), ("width", "d, feature width"),
                        ("classes", "C, classes")):
        add_flag(parser, f"--{field.replace('_', '-')}", Integer(minimum=1), default=getattr(defaults, field), help=text)
    add_output_flag(parser, "--output", "folder", default="results/components_cost", help="folder of the tables",
                    contents={f"study_components_cost.{suffix}": "file" for suffix in ("md", "json", "png")})
    args = parser.parse_args(argv)
    setting = CostSetting(expansion_dim=args.expansion_dim, experts=args.experts, prompt_length=args.prompt_length,
                          width=args.width, classes=args.classes)
    print(write_breakdown(args.output, setting))
    print(f"written: {args.output / 'study_components_cost.md'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
