"""Mid-run checkpoints of a training: what a file holds, how it is written and read, which are kept.

A checkpoint is one ``torch.save`` file of tensors and plain containers (dicts, lists, ints, floats,
strings), read back with ``torch.load(weights_only=True)``: nothing is unpickled. It is written to a
temporary file in the same folder, flushed, fsynced and renamed into place, so a kill at any point
leaves either the previous checkpoint or the new one. At most the last two are kept. The frozen
backbone stays out of the file (rebuilt from the weights and the seed; a digest checks it) and the
router's ``G`` is stored as its lower triangle, the only part the router reads. docs/checkpoints.md
describes the files for users.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
import shutil
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch
from torch import Tensor, nn

from fly_modules import AnalyticRouter

from . import files
from .files import WriteError

__all__ = [
    "FORMAT", "VERSION", "CheckpointError", "WriteError", "CheckpointStore", "checkpoint_folder", "write_atomic",
    "read_checkpoint", "rng_states", "restore_rng_states", "frozen_backbone_digest", "capture", "restore",
]

FORMAT = "fly-modules/run-checkpoint"
VERSION = 1
_NAME = re.compile(r"^batch(\d+)\.pt$")


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used: unreadable, of another format, or of another run or backbone."""


def checkpoint_folder(output: Path, dataset: str, method: str, seed: int) -> Path:
    """Where the checkpoints of one training (every variant of a method, dataset and seed) live."""
    return Path(output) / "checkpoints" / dataset / method / f"seed{seed}"


# ------------------------------------------------------------------------------------ files
def write_atomic(path: Path, payload: Dict[str, Any]) -> int:
    """``torch.save`` of ``payload`` to ``path`` whole or not at all, fsynced (:func:`files.write_atomic`);
    returns the size."""
    files.write_atomic(path, lambda stream: torch.save(payload, stream), binary=True, durable=True)
    return Path(path).stat().st_size


def read_checkpoint(path: Path, *, lazily: bool = False) -> Dict[str, Any]:
    """The checkpoint at ``path`` (CPU tensors). ``lazily`` maps the tensors instead of reading them
    (torch >= 2.1), for a look at the small entries only."""
    options: Dict[str, Any] = {"map_location": "cpu", "weights_only": True}
    if lazily and tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 1):
        options["mmap"] = True
    payload = torch.load(path, **options)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a run checkpoint (no format {FORMAT!r})")
    if payload.get("version") != VERSION:
        raise CheckpointError(f"{path} has checkpoint version {payload.get('version')!r}; this code reads {VERSION}")
    return payload


class CheckpointStore:
    """The checkpoint files of one training, ``batch<NNNNNNN>.pt`` (stream batches trained), in ``folder``."""

    def __init__(self, folder: Path, *, keep: int = 2) -> None:
        self.folder, self.keep = Path(folder), int(keep)

    def path(self, batches: int) -> Path:
        return self.folder / f"batch{int(batches):07d}.pt"

    def paths(self) -> List[Path]:
        """The complete checkpoints, oldest first (temporary files of interrupted writes are not)."""
        try:
            found = [(int(m.group(1)), p) for p in self.folder.iterdir() if (m := _NAME.match(p.name))]
        except (FileNotFoundError, NotADirectoryError):
            return []
        return [p for _, p in sorted(found)]

    def latest(self, *, lazily: bool = False) -> Optional[Tuple[Path, Dict[str, Any]]]:
        """``(path, payload)`` of the newest readable checkpoint, ``None`` when there is none.

        An unreadable newer file (a damaged disk: writes are atomic) is reported and the previous one
        used; when no file can be read this raises.
        """
        damaged = False
        for path in reversed(self.paths()):
            try:
                return path, read_checkpoint(path, lazily=lazily)
            except FileNotFoundError:  # removed meanwhile by another process of the sweep (its run finished)
                continue
            except Exception as error:  # any damage: report it and fall back
                damaged = True
                warnings.warn(f"checkpoint {path} cannot be read ({error}); trying the previous one", stacklevel=2)
        if damaged:
            raise CheckpointError(f"no checkpoint in {self.folder} can be read; delete the folder to restart the run")
        return None

    def latest_agreed(self, parallel: Any, device: torch.device) -> Optional[Dict[str, Any]]:
        """:meth:`latest`'s payload, the same file for every process of ``parallel`` (a
        ``benchmarks.parallel.DataParallel``): the first process chooses, the others read its choice."""
        if parallel.world == 1:
            found = self.latest()
            return None if found is None else found[1]
        found = self.latest() if parallel.rank == 0 else None
        choice = torch.tensor([0 if found is None else found[1]["batches"] + 1], device=device)  # 0 off rank 0
        batches = int(parallel.sum_counts(choice).item()) - 1
        if batches < 0:
            return None
        return found[1] if found is not None else read_checkpoint(self.path(batches))

    def save(self, payload: Dict[str, Any]) -> Tuple[Path, int]:
        """Write ``payload`` as ``batch<payload['batches']>.pt``; keep it and the ``keep - 1`` before it.

        Files of later batches (left when a run resumed from an older, readable checkpoint) and
        temporary files of interrupted writes go too.
        """
        batches = int(payload["batches"])
        path = self.path(batches)
        size = write_atomic(path, payload)
        older = [p for p in self.paths() if _batches(p) < batches]
        newer = [p for p in self.paths() if _batches(p) > batches]
        for stale in newer + older[: max(len(older) - self.keep + 1, 0)] + list(self.folder.glob(".batch*.tmp")):
            stale.unlink(missing_ok=True)
        return path, size

    def clear(self) -> None:
        """Remove the folder (checkpoints and temporary files) and the parents it leaves empty, up to
        ``checkpoints/``."""
        # Tolerant of files that vanish meanwhile: a sweep killed between its last result and this
        # removal leaves the folder, which every later sweep on the output folder then removes.
        shutil.rmtree(self.folder, onerror=_ignore_missing)
        for parent in self.folder.parents:
            try:
                parent.rmdir()  # only an empty folder goes
            except OSError:
                break
            if parent.name == "checkpoints":
                break


def _ignore_missing(function: Any, path: str, info: Any) -> None:
    if not issubclass(info[0], FileNotFoundError):
        raise info[1]


def _batches(path: Path) -> int:
    match = _NAME.match(path.name)
    assert match is not None
    return int(match.group(1))


# ------------------------------------------------------------------------- random numbers
def rng_states(device: torch.device) -> Dict[str, Any]:
    """Every global generator a run draws from after it is built: torch (CPU and ``device``), numpy, Python.

    The stream and the methods' private generators are consumed only while building, which a resumed
    run repeats.
    """
    numpy_state = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    state: Dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"algorithm": numpy_state[0], "keys": torch.from_numpy(numpy_state[1].astype(np.int64)),
                  "position": int(numpy_state[2]), "has_gauss": int(numpy_state[3]),
                  "cached_gaussian": float(numpy_state[4])},
        "python": {"version": version, "internal": torch.tensor(internal, dtype=torch.int64), "gauss_next": gauss_next},
    }
    if device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def restore_rng_states(state: Dict[str, Any], device: torch.device) -> None:
    """Set the generators :func:`rng_states` read."""
    if ("cuda" in state) != (device.type == "cuda"):
        raise CheckpointError(
            f"the checkpoint's random-number states are of a {'CUDA' if 'cuda' in state else 'CPU'} run; "
            f"this run is on {device}: resume on the same kind of device"
        )
    torch.set_rng_state(state["torch"])
    if device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)
    numpy_state = state["numpy"]
    np.random.set_state((numpy_state["algorithm"], numpy_state["keys"].numpy().astype(np.uint32),
                         numpy_state["position"], numpy_state["has_gauss"], numpy_state["cached_gaussian"]))
    python = state["python"]
    random.setstate((python["version"], tuple(python["internal"].tolist()), python["gauss_next"]))


def _equal(a: Any, b: Any) -> bool:
    """Deep equality of plain containers holding tensors."""
    if isinstance(a, Tensor) or isinstance(b, Tensor):
        return isinstance(a, Tensor) and isinstance(b, Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


# ---------------------------------------------------------------------- the model's state
def _frozen_backbone_keys(model: nn.Module) -> List[str]:
    """State keys of the backbone's frozen parameters: rebuilt at resume, so left out of the file."""
    return [f"backbone.{name}" for name, p in model.backbone.named_parameters() if not p.requires_grad]


def _digest(state: Dict[str, Tensor], keys: Sequence[str]) -> str:
    """SHA-256 of the named tensors (name, dtype, shape and bytes)."""
    hasher = hashlib.sha256()
    for key in keys:
        tensor = state[key].detach().cpu().contiguous()
        hasher.update(f"{key}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        hasher.update(tensor.reshape(-1).view(torch.uint8).numpy())
    return hasher.hexdigest()


def _router_gram_keys(module: nn.Module) -> List[str]:
    return [f"{name}.gram" if name else "gram" for name, sub in module.named_modules() if isinstance(sub, AnalyticRouter)]


def _pack_lower_triangles(state: Dict[str, Any], keys: Sequence[str]) -> Dict[str, Any]:
    """``state`` with each router ``gram`` replaced by its lower triangle, row by row (``G`` is symmetric
    and the router reads only that triangle: half the bytes of the ``M x M`` buffer)."""
    packed = dict(state)
    for key in keys:
        gram = state[key]
        # One cat of M row views, not a boolean-mask gather: the faster of the two (docs/performance.md).
        packed[key] = torch.cat([gram[row, : row + 1] for row in range(gram.shape[0])])
    return packed


def _unpack_lower_triangles(state: Dict[str, Any], keys: Sequence[str]) -> Dict[str, Any]:
    unpacked = dict(state)
    for key in keys:
        triangle = state[key]
        size = (math.isqrt(8 * triangle.numel() + 1) - 1) // 2
        if size * (size + 1) // 2 != triangle.numel():
            raise CheckpointError(f"the checkpoint's {key} holds {triangle.numel()} values, not a lower triangle")
        gram = triangle.new_zeros(size, size)  # the upper triangle is never read
        starts = torch.arange(size + 1).mul_(torch.arange(size + 1).add_(1)).div_(2, rounding_mode="floor").tolist()
        for row in range(size):
            gram[row, : row + 1] = triangle[starts[row] : starts[row + 1]]
        unpacked[key] = gram
    return unpacked


# ---------------------------------------------------------------------------- one payload
def capture(
    trainer: Any, evaluator: Any, *, run: Dict[str, Any], setting: Dict[str, Any], rng: List[Dict[str, Any]],
    history: Dict[str, Any], backbone_digest: str,
) -> Dict[str, Any]:
    """The checkpoint of a training at a batch boundary.

    Args:
        trainer: the ``benchmarks.ablation.training.OnlineTrainer``; its ``state_dict`` is saved without the
            frozen backbone and with the routers' ``G`` as lower triangles.
        evaluator: the ``benchmarks.ablation.evaluation`` evaluator (the evaluation logs and diagnostics so far).
        run: ``{"dataset", "method", "seed", "variants"}``.
        setting: the sweep's protocol and data setting (``results.setting_differences`` compares it).
        rng: :func:`rng_states` of every process, in rank order.
        history: checkpoints written and resumes so far (reported in the run's record).
        backbone_digest: :func:`frozen_backbone_digest` of the model.
    """
    state = trainer.state_dict()
    model_keys = set(_frozen_backbone_keys(trainer.model))
    model_state = {k: v for k, v in state["model"].items() if k not in model_keys}
    state["model"] = _pack_lower_triangles(model_state, _router_gram_keys(trainer.model))
    if "router" in state["components"]:  # components trained beside the method
        state["components"] = {**state["components"],
                               "router": _pack_lower_triangles(state["components"]["router"], ["gram"])}
    return {
        "format": FORMAT, "version": VERSION, "run": dict(run), "setting": setting,
        "batches": int(trainer.position.batches), "world_size": len(rng), "backbone_sha256": backbone_digest,
        "trainer": state, "evaluator": evaluator.state_dict(), "rng": rng, "history": dict(history),
    }


def frozen_backbone_digest(model: nn.Module) -> str:
    """Digest of the frozen backbone tensors a checkpoint leaves out."""
    return _digest(model.state_dict(), _frozen_backbone_keys(model))


def restore(payload: Dict[str, Any], trainer: Any, evaluator: Any, *, rank: int, world: int, device: torch.device) -> None:
    """Load a :func:`capture` payload into a freshly built ``trainer`` and ``evaluator`` and set this
    process's random-number generators; refuses another backbone or an unresumable world size."""
    model = trainer.model
    frozen = _frozen_backbone_keys(model)
    current = model.state_dict()
    digest = _digest(current, frozen)
    if digest != payload["backbone_sha256"]:
        raise CheckpointError(
            f"the frozen backbone differs from the checkpoint's (sha256 {payload['backbone_sha256'][:12]}... -> "
            f"{digest[:12]}...): its weights file changed since the run started"
        )
    states = payload["rng"]
    if len(states) == world:
        rng = states[rank]
    elif all(_equal(states[0], other) for other in states[1:]):
        rng = states[0]  # every process drew the same numbers: any world size continues them
    else:
        raise CheckpointError(
            f"world_size: {len(states)} -> {world}: the checkpoint's processes have different random-number "
            f"states; resume with {len(states)} processes"
        )
    state = dict(payload["trainer"])
    model_state = _unpack_lower_triangles(state["model"], _router_gram_keys(model))
    state["model"] = {**{key: current[key] for key in frozen}, **model_state}
    if "router" in state["components"]:
        state["components"] = {**state["components"],
                               "router": _unpack_lower_triangles(state["components"]["router"], ["gram"])}
    trainer.load_state_dict(state)
    evaluator.load_state_dict(payload["evaluator"])
    restore_rng_states(rng, device)
