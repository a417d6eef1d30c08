"""The result cell of each harness and the Markdown table of ``docs/adapters.md``.

A harness result is a dict: ``name``, ``outcome`` ("ran", "skipped", "crashed"), ``detail``,
``meta`` (``upstream_commit``, ...) and ``checks`` (rows of ``report.Report``).
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

from benchmarks.upstream.registry import ROWS, Row

# The table's letters and the harness checks each stands for: (d) includes d' and d0, (e) includes e2.
GROUPS = (("a", ("a",)), ("b", ("b",)), ("c", ("c",)), ("d", ("d", "d'", "d0")), ("e", ("e", "e2")),
          ("f", ("f",)), ("g", ("g",)), ("i", ("i",)), ("v", ("v",)))
STATUS_COLUMNS = ("r", "r-ens", "a", "b", "c", "d", "d'", "d0", "e", "e2", "f", "g", "i", "v")
CORRECTED = "`correct_assembly=True`: "
HEADER = "| method | repository | commit | retrofit target | what the router replaces | result |"


def summarise(result: Dict[str, Any]) -> str:
    """The result cell of one harness: "all pass", "a b c d e g v pass; f n/a", "ens.: ...", "refused"."""
    if result["outcome"] != "ran":
        return result["detail"]
    status = {row["check"]: row["status"] for row in result["checks"]}
    refusals = {k: v for k, v in status.items() if k.startswith("r:")}
    if refusals:  # a refusal probe: every family asked in turn
        accepted = sorted(k[2:] for k, v in refusals.items() if v != "REFUSED")
        return "refused" if not accepted else f"accepted by {' '.join(accepted)}: fail"
    if status.get("r") == "REFUSED" and status.get("r-ens") != "PASS":
        return "refused"
    words: Dict[str, List[str]] = {"pass": [], "n/a": [], "fail": [], "not run": []}
    for letter, keys in GROUPS:
        found = [status[k] for k in keys if k in status and status[k] != "INFO"]
        if any(s in ("FAIL", "ERROR") for s in found):
            words["fail"].append(letter)
        elif not found:
            words["not run"].append(letter)
        elif all(s == "N/A" for s in found):
            words["n/a"].append(letter)
        else:
            words["pass"].append(letter)
    if not any(words[w] for w in ("n/a", "fail", "not run")):
        text = "all pass"
    else:
        text = "; ".join(f"{' '.join(letters)} {word}" for word, letters in words.items() if letters)
    corrected = any(row["check"] == "r" and "correct_assembly=True" in row["title"] for row in result["checks"])
    return ("ens.: " if status.get("r") == "REFUSED" else "") + (CORRECTED if corrected else "") + text


def row_cells(row: Row, results: Dict[str, Dict[str, Any]], adapters_link: str) -> List[str]:
    chosen = [results[name] for name in row.harnesses if name in results]
    commits = ", ".join(f"`{r['meta']['upstream_commit'][:10]}`" if r["outcome"] != "skipped" else "—"
                        for r in chosen)
    cells = sorted({summarise(r) for r in chosen}, key=[summarise(r) for r in chosen].index)
    result = cells[0] if len(cells) == 1 else "; ".join(f"{r['name']}: {summarise(r)}" for r in chosen)
    return [row.method, row.repository, commits, row.target, row.replaces.format(adapters=adapters_link), result]


def markdown_table(results: Dict[str, Dict[str, Any]], adapters_link: str = "") -> str:
    """The table of docs/adapters.md for the harnesses in ``results`` (rows without any are left out)."""
    lines = [HEADER, "|" + "---|" * 6]
    for row in ROWS:
        if any(name in results for name in row.harnesses):
            lines.append("| " + " | ".join(row_cells(row, results, adapters_link)) + " |")
    return "\n".join(lines)


def status_line(result: Dict[str, Any], columns: Sequence[str] = STATUS_COLUMNS) -> str:
    """``a=PASS b=PASS ...`` for one harness (``-`` where a check did not run)."""
    if result["outcome"] != "ran":
        return result["detail"]
    status = {row["check"]: row["status"] for row in result["checks"]}
    probes = [k for k in status if k.startswith("r:")]
    if probes:  # a refusal probe has only these
        return " ".join(f"{k}={status[k]}" for k in probes)
    extra = [k for k in status if k not in columns and k != "info"]
    return " ".join(f"{k}={status.get(k, '-')}" for k in (*columns, *extra))
