"""Run files as a sweep writes them, for the tests of their readers: a committed run file's fields, with the
spec, metrics and protocol a test gives (``benchmarks.core.run_file`` reads every field)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any, Dict, Optional

#: a committed run file: every field the readers check
TEMPLATE = json.loads((Path(__file__).resolve().parents[1] / "docs" / "results" / "proxy-10" / "runs" / "synthetic"
                       / "hide" / "baseline" / "seed1.json").read_text())


def run_record(spec: Dict[str, Any], metrics: Dict[str, float], protocol: Optional[Dict[str, Any]] = None,
               **fields: Any) -> Dict[str, Any]:
    """A whole run file of ``spec`` whose metrics (both definitions) are the template's with ``metrics``."""
    record = copy.deepcopy(TEMPLATE)
    record.update(spec=spec, metrics={**record["metrics"], **metrics},
                  metrics_paper={**record["metrics_paper"], **metrics}, **fields)
    if protocol is not None:
        record["protocol"] = protocol
    return record
