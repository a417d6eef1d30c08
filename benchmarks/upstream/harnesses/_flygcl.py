"""Import of AnAppleCore/FlyGCL for the harnesses, and the step schedule its trainers read.

In memory only: a builder ``fly_harness_tiny`` is added to the checkout's ``models.vit`` (the models
pick ``getattr(models.vit, backbone_name)(pretrained=True, num_classes=...)``); it returns the
checkout's own ``models.vit.VisionTransformer`` at the harness size with random weights. ``pandas``
(imported by the trainer modules, unused here) becomes a stand-in when missing. ``step_schedule``: one
task's samples per step, FlyGCL's own advance (``model.process_task_count()`` from inside
``online_step`` once a step's sample budget is seen).
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Sequence

from benchmarks.upstream.loading import import_upstream
from benchmarks.upstream.task_stream import BATCH_SIZE, BATCHES_PER_TASK, IMAGE_SIZE, NUM_TASKS

BACKBONE = "fly_harness_tiny"
TINY_VIT = dict(img_size=IMAGE_SIZE, patch_size=8, embed_dim=32, depth=5, num_heads=2)


def import_flygcl(checkout: Path, modules: Sequence[str], stubs: Sequence[str] = ("pandas",)) -> List[str]:
    """Import ``modules``; a missing third-party package named in ``stubs`` becomes a stand-in."""
    made = import_upstream(checkout, ["models.vit", *modules, "utils.train_utils"], allowed_stubs=list(stubs))
    import models.vit as vit

    def tiny_vit(pretrained=False, num_classes=1000, **kwargs):
        return vit.VisionTransformer(**TINY_VIT, num_classes=num_classes)

    setattr(vit, BACKBONE, tiny_vit)
    return made


def step_schedule() -> dict:
    """The trainer attributes of FlyGCL's step schedule, starting at step 0 of task 0."""
    return dict(no_batchmask=False, task_id=0, step_num=NUM_TASKS, samples_per_step=BATCHES_PER_TASK * BATCH_SIZE,
                current_step=0, current_step_seen_samples=0)
