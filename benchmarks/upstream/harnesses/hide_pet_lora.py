"""thu-ml/HiDe-PET HiDe-LoRA (``--lora_type hide``) under ``retrofit(method="generic")``.

Real classes: ``vits.hide_lora_vision_transformer.VisionTransformer`` with its ``HideLoraPool`` (one LoRA per
task on the keys and values of the first 5 blocks; at inference each sample gets the LoRA of the task id it is
given) as the model, and the same class with ``lora_type='continual'`` and a class head as
``original_model`` (the task-identity model; random here, their scripts load a first-stage checkpoint).
Configuration: the HiDe-LoRA settings of their README (``lora_type hide``, rank 5 scaled to 4, pool 10, the
backbone frozen, train mask, clip 1.0, Adam, a new optimizer per task). Per batch: ``train_one_epoch`` of
``engines.hide_lora_wtp_and_tap_engine`` (the model with the task id, ``train=True``); evaluation: its
``evaluate`` (original_model's class -> task id -> ``model(x, task_id=<one id per sample>)``). At a task start
the loop copies the previous task's LoRA into the new task's (inline in ``train_and_evaluate``) and calls
``after_task`` at the task end; the harness does both. In memory only: ``timm.models.layers.helpers`` (gone in
timm 1.0) is aliased to ``timm.layers.helpers`` where missing. Not run, as in the HiDe-Prompt harness: the
class statistics (``_compute_mean``, which all-gathers over a process group), the classifier alignment
(``train_task_adaptive_prediction``) and the LoRA momentum (off without ``--lora_momentum``).

The generic seams: the query is ``original_model``'s ``pre_logits`` (its task-identity pass, run before the
model at evaluation; their training never runs it, so the loop's ``end_batch`` is given it: one forward of the
frozen ``original_model`` per batch), the route is the model's own ``task_id`` keyword (a ``(B,)`` tensor of
expert ids, the form ``evaluate`` passes), the classifier ``model.head``.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path

import torch

from benchmarks.upstream.checks import ROUTER_OPTIONS, Settings, one_line, run_checks, try_retrofit
from benchmarks.upstream.harnesses._task_loop import TaskLoopPair, class_mask, target_task_map
from benchmarks.upstream.loading import quiet
from benchmarks.upstream.observe import capture_outputs
from benchmarks.upstream.task_stream import make_stream

POOL, RANK = 10, 4
LORA = ("k_lora_A", "k_lora_B", "v_lora_A", "v_lora_B")


def alias_timm_helpers() -> None:
    try:  # the path HiDe-PET imports, as timm < 1.0 has it
        import timm.models.layers.helpers  # noqa: F401
    except ImportError:
        import timm.layers.helpers as helpers

        sys.modules.setdefault("timm.models.layers.helpers", helpers)


class HiDePETLoRA(TaskLoopPair):
    name = "HiDe-PET / HiDe-LoRA"
    method = "generic"
    counter_name = "the loop's task_id (the LoRA trained)"
    pool, top_k = POOL, 1
    prompt = dict(lora=True, lora_type="hide", rank=RANK, lora_pool_size=POOL)
    original_options = dict(lora=True, lora_type="continual", rank=RANK)
    run_args = dict(lr=0.01, reg=0.001, size=POOL, lora_rank=RANK, ca_storage_efficient_method="multi-centroid")

    def __init__(self, checkout: Path) -> None:
        alias_timm_helpers()
        super().__init__(checkout, "vits.hide_lora_vision_transformer", "engines.hide_lora_wtp_and_tap_engine")
        self.engine.cls_mean, self.engine.cls_cov = {}, {}

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model=f"vits.hide_lora_vision_transformer.VisionTransformer(+HideLoraPool pool {POOL}, rank "
                          f"{RANK}) + original_model (lora_type continual); experts = the tasks' LoRA")

    def build(self, seed):
        ctx = super().build(seed)
        ctx.usage = torch.zeros(POOL)
        ctx.stream = make_stream(seed=seed)[0]  # the stream the checks train on (the probes use it)
        return ctx

    def family_options(self, ctx):
        return dict(num_experts=2, query_module=ctx.original_model, route_module=ctx.model, route_kwarg="task_id")

    def start_task(self, ctx, task, own_advance):
        if task > 0:
            ctx.model.after_task(task_id=task - 1, device=torch.device("cpu"))
            lora = ctx.model.lora_layer
            with torch.no_grad():  # the new task's LoRA starts from the previous task's
                for name in LORA:
                    parameter = getattr(lora, name)
                    if parameter.grad is not None:
                        parameter.grad.zero_()
                    parameter[task] = parameter[task - 1]
        super().start_task(ctx, task, own_advance)

    def probes(self, ctx, adapters):
        status, detail = try_retrofit(ctx.model, "hide", num_experts=2, original_model=ctx.original_model)
        return [("r2", "INFO", f"retrofit(model, 'hide') {status.lower()}", detail), *self.statistics_pass(ctx, adapters)]

    def statistics_pass(self, ctx, adapters):
        """(s, informational) the model call of the class-statistics pass ``_compute_mean`` (decorated
        ``@torch.no_grad()``: ``model.eval()``, then ``model(x, task_id=t, train=True)`` with no ``original_model``
        pass), once the router holds the first task's batches: bare, and inside ``handle.unrouted()`` (the user's
        line), compared with the same call after ``remove()``. The function itself all-gathers over a process
        group and is not run."""
        handle = adapters.retrofit(ctx.model, method=self.method, optimizer=ctx.optimizer, **ROUTER_OPTIONS,
                                   **self.family_options(ctx))
        with quiet():
            for x, y in ctx.stream[0]:
                self.train_batch(ctx, x, y, 0)
                self.after_batch(ctx, x, handle, 0)
        found = {how: self.class_features(ctx, wrap) for how, wrap in
                 (("bare", contextlib.nullcontext), ("inside handle.unrouted()", handle.unrouted))}
        left = (handle.record.size, handle.record.query, handle.record.eval_query)
        handle.remove()
        own, rows = self.class_features(ctx, contextlib.nullcontext)[0], []
        for how, (features, error) in found.items():
            title = f"the class-statistics call of _compute_mean, router fitted, {how}"
            if error is not None:
                rows.append(("s", "INFO", f"{title} raises", error))
                continue
            rows.append(("s", "INFO", f"{title} runs", f"pre_logits bit-identical to the model's after remove(): "
                         f"{torch.equal(features, own)}; left for the next end_batch (size, query, inference "
                         f"query): {['none' if v is None else 'SET' for v in left]}"))
        return rows

    def class_features(self, ctx, wrap):
        """(the statistics pass's ``pre_logits`` of the first batch, None) or (None, its error on one line)."""
        ctx.model.eval()
        try:
            with torch.no_grad(), wrap():
                return ctx.model(ctx.stream[0][0][0], task_id=0, train=True)["pre_logits"], None
        except Exception as error:  # noqa: BLE001 - a refusal is a result
            return None, one_line(error, 300)

    def after_batch(self, ctx, x, handle, task):
        """The README's ``end_batch``, given the query: their training never runs ``original_model``
        (``train_one_epoch`` calls the model alone), so the user's line passes its features."""
        if handle is not None:
            with torch.no_grad():
                handle.end_batch(query=ctx.original_model(x)["pre_logits"])

    def train_options(self, ctx):
        return dict(target_task_map=target_task_map())

    def train_batch(self, ctx, x, y, task):
        losses = super().train_batch(ctx, x, y, task)
        ctx.usage[ctx.task_id] += len(x)  # train=True: the loop's task_id is the LoRA trained
        return losses

    def eval_logits(self, ctx, x, y):
        """The logits of ``evaluate``'s model call and the LoRA (task id) each sample was given."""
        ids = []

        def given(module, args, kwargs):
            ids.append(kwargs["task_id"])

        hook = ctx.model.lora_layer.register_forward_pre_hook(given, with_kwargs=True)
        try:
            with capture_outputs(ctx.model) as outputs:
                self.engine.evaluate(model=ctx.model, original_model=ctx.original_model, data_loader=[(x, y)],
                                     device=torch.device("cpu"), i=ctx.task_id, task_id=ctx.task_id,
                                     class_mask=class_mask(), target_task_map=target_task_map(),
                                     args=ctx.args)
        finally:
            hook.remove()
        return outputs[-1]["logits"].detach(), torch.as_tensor(ids[-1]).reshape(-1).detach()

    def verify_forward(self, ctx, handle):
        def forward(x):
            ctx.original_model(x)  # the task-identity pass evaluate() runs first
            if ctx.model.training:
                return ctx.model(x, task_id=handle.current_expert, train=True)
            return ctx.model(x, task_id=torch.full((x.shape[0],), handle.current_expert, dtype=torch.long))
        return forward

    def counter(self, ctx):
        return int(ctx.task_id)

    def expert_slots(self, ctx, expert):
        return [expert]


def run(checkout: Path, settings: Settings):
    return run_checks(HiDePETLoRA(checkout), settings)
