"""Checks of a sweep that only the output folder, the device, the model or the method can make.

Each flag is checked on its own when it is parsed; values that are each valid can still not fit together
(``--image-size`` and the model's input size, ``--num-experts`` and a method's prompt pool,
``--method-kwargs`` and the method's constructor). :func:`check` finds those once, cheaply, before any
data is generated or loaded: it probes the output folder, allocates on the device, builds the backbone
(with its weights) and every method on the CPU and scores one blank image with each. A failure is a
:class:`PreflightError`, one line naming what was found, what was expected and the flag to change.

Only the exception types that user values provoke are turned into that line (wrong keywords, values and
shapes, unreadable files); any other exception is a bug and keeps its traceback.
"""

from __future__ import annotations

import copy
import json
import pickle
import random
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from ..backbone import BackboneLoadError, backbone_of
from ..core.protocol import Protocol
from ..core.proxy_datasets import is_generated
from ..flags import output_problem
from ..methods import method_class
from .output_layout import sweep_outputs

__all__ = ["PreflightError", "USER_ERRORS", "check", "check_output", "check_device", "check_models", "class_counts"]

#: What construction and a forward pass raise for unfitting user values: unknown keywords (TypeError),
#: values a constructor refuses (ValueError), timm's shape asserts (AssertionError), tensor shape
#: mismatches and unreadable weight or prompt files (RuntimeError, OSError, UnpicklingError).
USER_ERRORS = (TypeError, ValueError, AssertionError, RuntimeError, OSError, pickle.UnpicklingError)
#: Class counts of the real datasets (they size the method's head in the check).
_CLASSES = {"cifar100": 100, "imagenet-r": 200, "cub200": 200}
_DEVICE_TYPES = ("cpu", "cuda")


class PreflightError(Exception):
    """Values that do not fit together, or that the output folder, device, model or method rejects."""


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    line = text.splitlines()[0] if text else "no message"
    return f"{type(error).__name__}: {line if len(line) <= 200 else line[:197] + '...'}"


def check_output(output: Path, log: Sequence[str] = ()) -> None:
    """The output folder is a folder (or can be created), a file can be written in it, and nothing the sweep
    writes there (``output_layout``, the dashboards' folders of ``log`` included) is in the way: the rule
    every command's output flags use (:func:`benchmarks.flags.output_problem`), for the default folder too."""
    problem = output_problem(Path(output), "folder", sweep_outputs(log))
    if problem:
        raise PreflightError(f"--output {output}: {problem} (choose another --output)")


def check_device(device: Optional[str]) -> None:
    """``device`` (``None``: chosen later) is a CPU or CUDA device that exists on this machine."""
    if device is None:
        return
    kind = torch.device(device)
    if kind.type not in _DEVICE_TYPES:
        raise PreflightError(f"--device {device}: a {kind.type} device; expected cpu, cuda or cuda:<index> (change --device)")
    try:
        torch.empty(1, device=kind)
    except (RuntimeError, AssertionError) as error:
        count = torch.cuda.device_count() if kind.type == "cuda" else 0
        raise PreflightError(
            f"--device {device}: cannot allocate on it ({_first_line(error)}); this machine has {count} CUDA "
            "device(s): choose another --device"
        ) from None


class _SavedRandomState:
    """Leaves every global generator (torch CPU, numpy, Python) as it found it: the runs are seeded, but
    nothing may depend on whether the check ran."""

    def __enter__(self) -> None:
        self.states = torch.get_rng_state(), np.random.get_state(), random.getstate()

    def __exit__(self, *exc: Any) -> None:
        torch.set_rng_state(self.states[0])
        np.random.set_state(self.states[1])
        random.setstate(self.states[2])


def _model_flags(protocol: Protocol) -> str:
    return f"--model {protocol.model} --model-kwargs '{json.dumps(protocol.model_kwargs)}'"


def check_models(protocol: Protocol, methods: Sequence[str], datasets: Sequence[str], class_counts: dict,
                 seed: int) -> None:
    """Build the backbone and each method on the CPU and score one blank image with each."""
    with _SavedRandomState(), torch.no_grad():
        try:
            backbone = backbone_of(protocol).eval()
        except BackboneLoadError:
            raise  # its own line says how to supply the weights
        except (TypeError, ValueError, AssertionError) as error:
            raise PreflightError(
                f"{_model_flags(protocol)}: timm cannot build it ({_first_line(error)}); expected a timm ViT and "
                "keyword arguments of its constructor (change --model or --model-kwargs)"
            ) from None
        images = torch.zeros(1, 3, protocol.image_size, protocol.image_size)  # one: ViT-B passes are slow on a CPU
        try:
            backbone(images)
        except USER_ERRORS as error:
            raise PreflightError(
                f"--image-size {protocol.image_size}: the backbone rejects {protocol.image_size}x"
                f"{protocol.image_size} images ({_first_line(error)}); expected the model's input size (change "
                "--image-size, or img_size in --model-kwargs)"
            ) from None
        for method in methods:
            for classes in sorted({class_counts[name] for name in datasets}):
                _check_method(method, backbone, classes, protocol, seed, images)


def _check_method(method: str, backbone: Any, classes: int, protocol: Protocol, seed: int, images: Any) -> None:
    given = protocol.method_kwargs.get(method, {})
    flags = f"{_model_flags(protocol)} --num-experts {protocol.num_experts}"
    flags += f" --method-kwargs '{json.dumps({method: given})}'" if given else ""
    flags += f" --misa-prompts {protocol.misa_prompts}" if method == "misa" and protocol.misa_prompts else ""
    try:
        model = method_class(method).from_protocol(copy.deepcopy(backbone), classes, protocol, seed).eval()
        model.predict(images)
    except USER_ERRORS as error:
        raise PreflightError(
            f"--methods {method}: it cannot be built or run with {flags} ({_first_line(error)}); expected values "
            "that fit the method and the model (change one of these flags)"
        ) from None


def class_counts(data: dict) -> dict:
    """Classes of each dataset of a sweep (``data``: dataset -> generated-data settings)."""
    return {name: settings["num_classes"] if is_generated(name) else _CLASSES[name] for name, settings in data.items()}


def check(sweep: Any) -> None:
    """Every check of this module for a ``benchmarks.ablation.sweep.Sweep``; raises :class:`PreflightError`."""
    if sweep.threads:
        torch.set_num_threads(sweep.threads)  # as the sweep will
    check_output(sweep.output, sweep.log)
    check_device(sweep.device)
    check_models(sweep.protocol, sweep.methods, sweep.datasets, class_counts(sweep.data), sweep.seeds[0])

