"""The GPU-scale proxy of ``benchmarks/gpu/suite.py``: the CPU proxy's data and protocol, a larger backbone.

:func:`pretrain` trains a wider, deeper ViT than ``pretrain_proxy.py``'s on more images of the same
upstream classes (the classes below the proxy stream's, ``PRESETS["proxy"]``), on a GPU, with bfloat16
autocast and deterministic algorithms, reusing ``pretrain_proxy``'s augmentation, evaluation and
head-less state; it saves the backbone as safetensors (at most :data:`MAX_WEIGHT_BYTES`). The
augmentation runs on the CPU one batch ahead, on a side thread that draws from the one generator in
``pretrain_proxy``'s order, so the result does not depend on timing. :func:`sweep` then runs the
cross-ablation subset (DualPrompt and HiDe-Prompt, every variant, one seed) on that backbone through
``cross_ablation.main``. Both stop starting new work when their time budget would be exceeded.
"""

from __future__ import annotations

import contextlib
import copy
import json
import math
import os
import queue
import threading
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import torch
import torch.nn.functional as F

from benchmarks.core.presets import PRESETS
from benchmarks.proxy import pretrain as pretrain_proxy

__all__ = ["ProxyScale", "GPU_SCALE", "TINY_SCALE", "MAX_WEIGHT_BYTES", "SWEEP_METHODS", "SWEEP_VARIANTS",
           "pretrain", "sweep", "training_flops_per_image", "planned_flops", "upstream_classes", "model_kwargs_of"]

#: The weight file comes back from the GPU machine: at most 16 MiB.
MAX_WEIGHT_BYTES = 16 * 2**20
SWEEP_METHODS = ("dualprompt", "hide")
SWEEP_VARIANTS = ("baseline", "router", "ensemble", "both", "oracle", "oracle_both")
PRESET = "proxy"


@dataclass(frozen=True)
class ProxyScale:
    """The backbone and its pretraining (the image size and the classes come from the proxy preset)."""

    model_kwargs: Dict[str, int]
    train_per_class: int
    test_per_class: int
    epochs: int
    batch_size: int
    lr: float
    warmup_epochs: float
    weight_decay: float = 0.05
    label_smoothing: float = 0.1
    seed: int = 0
    upstream_classes: Optional[int] = None  # None: every class below the stream's (the preset's class_offset)
    sweep_flags: Tuple[str, ...] = ()  # cross_ablation overrides (the tiny scale shrinks the stream)
    sweep_method_kwargs: Dict[str, Dict[str, Any]] = field(default_factory=dict)


#: About 3 minutes on one H100 (docs/gpu.md): ViT 192 wide, 8 deep, 4x4 patches (65 tokens), 13.7 MiB
#: of float32 weights; 300 images of each of the 400 upstream classes, 24 epochs of batch 512.
GPU_SCALE = ProxyScale(model_kwargs=dict(patch_size=4, embed_dim=192, depth=8, num_heads=3), train_per_class=300,
                       test_per_class=10, epochs=24, batch_size=512, lr=2e-3, warmup_epochs=2.0)
#: Seconds on a CPU: the same code paths at toy sizes (CI and the suite's --tiny).
TINY_SCALE = ProxyScale(
    model_kwargs=dict(patch_size=8, embed_dim=32, depth=5, num_heads=2), train_per_class=6, test_per_class=2,
    epochs=2, batch_size=16, lr=1e-3, warmup_epochs=0.5, upstream_classes=8,
    sweep_flags=("--synthetic-classes", "6", "--synthetic-train-per-class", "8", "--synthetic-test-per-class", "2",
                 "--batch-size", "8", "--online-iter", "1", "--eval-period", "16", "--test-batch-size", "16",
                 "--num-experts", "3", "--expansion-dim", "64"),
    sweep_method_kwargs={"hide": {"ca_steps": 5, "ca_samples_per_class": 4}},
)


def _proxy_data() -> Dict[str, Any]:
    """The generated settings of the proxy preset's stream (its first dataset)."""
    preset = PRESETS[PRESET]
    return dict(preset["generated"][preset["datasets"][0]])


def upstream_classes(scale: ProxyScale) -> int:
    """Classes the backbone is pretrained on: ``0..U-1``, below the stream's (the preset's class_offset)."""
    return scale.upstream_classes if scale.upstream_classes is not None else _proxy_data()["class_offset"]


def planned_flops(scale: ProxyScale) -> float:
    """Training FLOPs of the whole planned pretraining (every epoch)."""
    images = upstream_classes(scale) * scale.train_per_class * scale.epochs
    return images * training_flops_per_image(model_kwargs_of(scale), upstream_classes(scale))


def model_kwargs_of(scale: ProxyScale) -> Dict[str, int]:
    """The timm keyword arguments of the backbone: the scale's shape at the proxy's image size."""
    return dict(img_size=PRESETS[PRESET]["protocol"].image_size, **scale.model_kwargs)


def training_flops_per_image(model_kwargs: Dict[str, int], num_classes: int) -> float:
    """Forward and backward FLOPs of one image (3x the forward's multiply-adds x 2; LayerNorm etc. left out)."""
    width, depth, patch = model_kwargs["embed_dim"], model_kwargs["depth"], model_kwargs["patch_size"]
    patches = (model_kwargs["img_size"] // patch) ** 2
    tokens = patches + 1
    block = 24 * tokens * width**2 + 4 * tokens**2 * width  # qkv, projection and MLP (4x); QK^T and AV
    forward = depth * block + 2 * patches * 3 * patch**2 * width + 2 * width * num_classes
    return 3.0 * forward


# ------------------------------------------------------------------------------------ pretraining
class _Ahead:
    """Iterates ``items`` on a side thread, up to ``depth`` items ahead; re-raises its errors here."""

    _END = object()

    def __init__(self, items: Iterator[Any], depth: int = 4) -> None:
        self.queue: "queue.Queue[Any]" = queue.Queue(depth)
        self.thread = threading.Thread(target=self._fill, args=(items,), daemon=True)
        self.thread.start()

    def _fill(self, items: Iterator[Any]) -> None:
        try:
            for item in items:
                self.queue.put(item)
            self.queue.put(self._END)
        except BaseException as error:  # handed to the consumer, which re-raises it
            self.queue.put(error)

    def __iter__(self) -> Iterator[Any]:
        while True:
            item = self.queue.get()
            if item is self._END:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


def _epoch_batches(images: torch.Tensor, targets: torch.Tensor, batch_size: int, generator: torch.Generator,
                   pin: bool) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """One epoch of augmented batches, drawing from ``generator`` in the order of ``pretrain_proxy.Pretraining``."""
    order = torch.randperm(len(targets), generator=generator)
    for start in range(0, len(order), batch_size):
        index = order[start:start + batch_size]
        batch = pretrain_proxy.augment(images[index], generator)
        yield (batch.pin_memory(), targets[index].pin_memory()) if pin else (batch, targets[index])


@contextlib.contextmanager
def _deterministic(device: torch.device) -> Iterator[None]:
    """Deterministic algorithms inside the block only (the sweep afterwards runs as cross_ablation.py does)."""
    if device.type == "cuda":  # read when cuBLAS starts; deterministic matmuls raise without it
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.backends.cudnn.deterministic = True
        torch.backends.cudnn.benchmark = False
    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled())
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])


def _check_deterministic_step(model: torch.nn.Module, images: torch.Tensor, targets: torch.Tensor,
                              autocast: Callable[[], Any], log: Callable[[str], None]) -> str:
    """One training step of a copy of ``model`` under deterministic algorithms; should an operation lack a
    deterministic implementation on this device, switch to ``warn_only`` (say so) rather than fail the run."""
    probe = copy.deepcopy(model).train()
    try:
        with autocast():
            loss = F.cross_entropy(probe(images), targets)
        loss.backward()
        return "strict"
    except RuntimeError as error:
        if "deterministic" not in str(error):
            raise
        torch.use_deterministic_algorithms(True, warn_only=True)
        first_line = str(error).splitlines()[0]
        log(f"pretrain: deterministic algorithms in warn-only mode ({first_line})")
        return f"warn_only: {first_line}"


def pretrain(scale: ProxyScale, *, device: torch.device, output: Path, budget_seconds: float,
             log: Callable[[str], None] = print) -> Dict[str, Any]:
    """Pretrain the backbone on the proxy's upstream classes and save it to ``output`` (safetensors).

    Epochs start only while the last epoch's duration still fits in ``budget_seconds`` (counted from the
    call, data included); the returned record says how many ran. Returns the record of the run: the
    file's SHA-256 and size, the model, data and training settings, the per-epoch history, timings and
    throughput.
    """
    with _deterministic(device):
        return _pretrain(scale, device=device, output=output, budget_seconds=budget_seconds, log=log)


def _pretrain(scale: ProxyScale, *, device: torch.device, output: Path, budget_seconds: float,
              log: Callable[[str], None]) -> Dict[str, Any]:
    from safetensors.torch import save_file

    started = time.perf_counter()
    data = _proxy_data()
    num_upstream = upstream_classes(scale)
    if num_upstream > data["class_offset"]:
        raise ValueError(f"pretrain: {num_upstream} upstream classes overlap the stream's, which start at "
                         f"{data['class_offset']}")
    model = _backbone(scale, num_upstream).to(device)
    images = _UpstreamImages(scale, num_upstream, data["difficulty"], device)
    data_seconds = time.perf_counter() - started
    log(f"pretrain: {images.train_size} training / {images.test_size} test images of {num_upstream} upstream classes "
        f"({data_seconds:.1f} s)")
    training = _Pretraining(scale, model, images, device)
    determinism = _check_deterministic_step(model, images.test_images[:8], images.test_targets[:8],
                                            training.autocast, log)
    training.run(started, budget_seconds, log)
    output.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: v.cpu() for k, v in pretrain_proxy.backbone_state(model).items()}, str(output))
    return {
        "file": output.name, "sha256": pretrain_proxy.sha256_file(output), "bytes": output.stat().st_size,
        **training.record(data, determinism),
        "data_seconds": data_seconds, "train_seconds": training.train_seconds,
        "wall_seconds": time.perf_counter() - started,
        **training.throughput(),
    }


def _backbone(scale: ProxyScale, num_upstream: int) -> torch.nn.Module:
    """The backbone with an upstream head, seeded; its weights (head left out) within MAX_WEIGHT_BYTES."""
    import timm

    torch.manual_seed(scale.seed)
    model = timm.create_model(pretrain_proxy.MODEL_NAME, pretrained=False, num_classes=num_upstream,
                              **model_kwargs_of(scale))
    weight_bytes = sum(v.numel() * v.element_size() for v in pretrain_proxy.backbone_state(model).values())
    if weight_bytes > MAX_WEIGHT_BYTES:
        raise ValueError(f"pretrain: the backbone has {weight_bytes / 2**20:.1f} MiB of weights, expected at most "
                         f"{MAX_WEIGHT_BYTES / 2**20:.0f} MiB")
    return model


class _UpstreamImages:
    """The upstream classes' images as whole tensors: the training set on the CPU (augmented there), the test
    set on ``device``."""

    def __init__(self, scale: ProxyScale, num_upstream: int, difficulty: str, device: torch.device) -> None:
        from benchmarks.data import make_synthetic_train_test, synthetic_class_split

        upstream, _ = synthetic_class_split(num_upstream, 0)
        train, test = make_synthetic_train_test(
            upstream, train_per_class=scale.train_per_class, test_per_class=scale.test_per_class,
            seed=pretrain_proxy.DATA_SEED, image_size=model_kwargs_of(scale)["img_size"],
            noise_std=pretrain_proxy.NOISE_STD, difficulty=difficulty,
        )
        self.train_images, self.train_targets = train.get_batch(torch.arange(len(train)))
        self.test_images, self.test_targets = (t.to(device) for t in test.get_batch(torch.arange(len(test))))
        self.train_size, self.test_size = len(train), len(test)


class _WarmupCosine:
    """Linear warm-up over the scale's warm-up epochs, then cosine to zero over the planned steps."""

    def __init__(self, scale: ProxyScale, steps_per_epoch: int) -> None:
        self.lr = scale.lr
        self.total_steps = steps_per_epoch * scale.epochs
        self.warmup_steps = max(1, round(scale.warmup_epochs * steps_per_epoch))

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        return self.lr * 0.5 * (1 + math.cos(math.pi * (step - self.warmup_steps)
                                             / max(self.total_steps - self.warmup_steps, 1)))


class _Pretraining:
    """One pretraining run: the model, its optimizer and schedule, the generator of the shuffling and the
    augmentation, and what the run has done so far (steps, seconds, the per-epoch history)."""

    def __init__(self, scale: ProxyScale, model: torch.nn.Module, images: _UpstreamImages,
                 device: torch.device) -> None:
        self.scale, self.model, self.images, self.device = scale, model, images, device
        self.optimizer = pretrain_proxy.make_optimizer(model, scale.lr, scale.weight_decay)
        self.lr_at = _WarmupCosine(scale, math.ceil(images.train_size / scale.batch_size))
        self.on_cuda = device.type == "cuda"
        self.autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if self.on_cuda else contextlib.nullcontext
        self.synchronize = torch.cuda.synchronize if self.on_cuda else (lambda: None)
        self.generator = torch.Generator().manual_seed(scale.seed)
        self.history: List[Dict[str, Any]] = []
        self.step, self.train_seconds, self.stopped_early = 0, 0.0, False

    def run(self, started: float, budget_seconds: float, log: Callable[[str], None]) -> None:
        """Epochs while the last one's duration still fits in the budget, each followed by the test accuracy."""
        scale = self.scale
        self.model.train()
        for epoch in range(scale.epochs):
            elapsed = time.perf_counter() - started
            if self.history and elapsed + self.history[-1]["seconds"] > budget_seconds:
                self.stopped_early = True
                log(f"pretrain: stopping after {epoch} of {scale.epochs} epochs ({elapsed:.0f} s of a "
                    f"{budget_seconds:.0f} s budget; one epoch takes {self.history[-1]['seconds']:.1f} s)")
                break
            self.synchronize()
            epoch_started = time.perf_counter()
            running = self.run_epoch()
            self.synchronize()
            seconds = time.perf_counter() - epoch_started
            self.train_seconds += seconds
            accuracy = pretrain_proxy.evaluate(self.model, self.images.test_images, self.images.test_targets)
            self.history.append({"epoch": epoch + 1, "train_loss": float(running) / self.images.train_size,
                                 "upstream_test_accuracy": accuracy, "seconds": seconds,
                                 "elapsed_seconds": time.perf_counter() - started})
            log(f"pretrain: epoch {epoch + 1}/{scale.epochs}: loss {self.history[-1]['train_loss']:.3f}, upstream "
                f"test accuracy {100 * accuracy:.2f}%, {self.images.train_size / seconds:.0f} images/s "
                f"({self.history[-1]['elapsed_seconds']:.0f} s)")

    def run_epoch(self) -> torch.Tensor:
        """One epoch; the sum of the batches' losses, kept on the device (no host synchronisation per step)."""
        images = self.images
        running = torch.zeros((), device=self.device)
        for batch, targets in _Ahead(_epoch_batches(images.train_images, images.train_targets, self.scale.batch_size,
                                                    self.generator, pin=self.on_cuda)):
            batch, targets = batch.to(self.device, non_blocking=True), targets.to(self.device, non_blocking=True)
            for group in self.optimizer.param_groups:
                group["lr"] = self.lr_at(self.step)
            with self.autocast():
                loss = F.cross_entropy(self.model(batch), targets, label_smoothing=self.scale.label_smoothing)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
            self.optimizer.step()
            running += loss.detach() * len(targets)
            self.step += 1
        return running

    def record(self, data: Dict[str, Any], determinism: str) -> Dict[str, Any]:
        """The model, data and training settings of the run, and its history."""
        scale, history, num_upstream = self.scale, self.history, upstream_classes(self.scale)
        return {
            "model": pretrain_proxy.MODEL_NAME, "model_kwargs": model_kwargs_of(scale), "num_classes": 0,
            "parameters": sum(p.numel() for n, p in self.model.named_parameters() if not n.startswith("head.")),
            "data": {"generator": "benchmarks.data.make_synthetic_train_test", "difficulty": data["difficulty"],
                     "seed": pretrain_proxy.DATA_SEED, "noise_std": pretrain_proxy.NOISE_STD,
                     "upstream_class_ids": [0, num_upstream - 1], "stream_class_offset": data["class_offset"],
                     "train_per_class": scale.train_per_class, "test_per_class": scale.test_per_class},
            "training": {**{k: v for k, v in asdict(scale).items() if not k.startswith("sweep")},
                         "optimizer": "AdamW", "schedule": "linear warm-up, cosine", "precision":
                         "bfloat16 autocast" if self.on_cuda else "float32", "deterministic_algorithms": determinism,
                         "steps": self.step, "planned_steps": self.lr_at.total_steps,
                         "epochs_completed": len(history), "stopped_early": self.stopped_early},
            "history": history,
            "upstream_test_accuracy": history[-1]["upstream_test_accuracy"] if history else None,
        }

    def throughput(self) -> Dict[str, Any]:
        """Images per second and achieved TFLOP/s over the epochs that ran; the device and the versions."""
        import timm

        flops = training_flops_per_image(model_kwargs_of(self.scale), upstream_classes(self.scale))
        images_seen, seconds = len(self.history) * self.images.train_size, self.train_seconds
        return {
            "images_per_second": images_seen / seconds if seconds else None,
            "training_flops_per_image": flops,
            "achieved_tflops": flops * images_seen / seconds / 1e12 if seconds else None,
            "device": torch.cuda.get_device_name(self.device) if self.on_cuda else "cpu",
            "torch": torch.__version__, "timm": timm.__version__,
        }


# ------------------------------------------------------------------------------------------ sweep
def sweep(scale: ProxyScale, weights: Path, *, device: torch.device, workdir: Path, budget_seconds: float,
          log: Callable[[str], None] = print) -> Dict[str, Any]:
    """DualPrompt and HiDe-Prompt x every variant, seed 1, on the pretrained ``weights``, through
    ``cross_ablation.main``; one call per method (a method starts only if the last one's time still fits),
    then one call over the finished methods, which only writes their table. Returns per-method status
    and time, and the table's rows (``workdir/table.json``)."""
    from benchmarks.ablation import cli as cross_ablation

    started = time.perf_counter()
    method_kwargs = {**PRESETS[PRESET]["protocol"].method_kwargs, **scale.sweep_method_kwargs}
    common = ["--preset", PRESET, "--variants", ",".join(SWEEP_VARIANTS), "--seeds", "1", "--weights", str(weights),
              "--model-kwargs", json.dumps(model_kwargs_of(scale)), "--method-kwargs", json.dumps(method_kwargs),
              "--device", str(device), "--output", str(workdir), "--no-progress",
              "--checkpoint-every", "off",  # a minute-long sweep into a scratch folder: nothing to resume
              *scale.sweep_flags]
    methods: Dict[str, Dict[str, Any]] = {}
    finished: List[str] = []
    for method in SWEEP_METHODS:
        elapsed = time.perf_counter() - started
        longest = max((m["seconds"] for m in methods.values() if "seconds" in m), default=0.0)
        if elapsed + 1.2 * longest > budget_seconds:
            methods[method] = {"status": "skipped", "reason": f"{elapsed:.0f} s of {budget_seconds:.0f} s used; the "
                               f"last method took {longest:.0f} s"}
            log(f"sweep: {method} skipped ({methods[method]['reason']})")
            continue
        method_started = time.perf_counter()
        try:
            status = cross_ablation.main([*common, "--methods", method])
            methods[method] = {"status": "finished" if status == 0 else "error", "exit_status": status}
        except Exception as error:  # recorded; the next method still runs
            methods[method] = {"status": "error", "error": f"{type(error).__name__}: {error}",
                               "traceback": traceback.format_exc()[-4000:]}
        methods[method]["seconds"] = time.perf_counter() - method_started
        log(f"sweep: {method} {methods[method]['status']} in {methods[method]['seconds']:.1f} s")
        if methods[method]["status"] == "finished":
            finished.append(method)
    rows: List[Dict[str, Any]] = []
    if finished:  # every run is on disk: this call only reads them and writes the table of all finished methods
        cross_ablation.main([*common, "--methods", ",".join(finished)])
        rows = json.loads((workdir / "table.json").read_text())
    return {"methods": methods, "arguments": common, "rows": rows, "seconds": time.perf_counter() - started}
