"""FlyGCL's task-expert models: S-Prompts (``models.sprompt.SPrompt`` with ``methods.sprompt.SPrompt``) and
the HiDe-Prompt / NoRGa port (``models.hide_norga_prefix_vit`` with ``methods.hide_norga_trainer``), the paper's
own retrofit targets, and CODA-Prompt (``models.codaprompt``), driven by their trainers' own ``online_step``
and ``online_evaluate``.

The trainers advance by task: the harness runs at each task boundary what FlyGCL's ``_Trainer`` loop runs
there (``online_after_task``, then ``online_before_task``; for S-Prompts first the end-of-task prototype
build its evaluation makes). S-Prompts' trainer imports scikit-learn for k-means prototypes; the harness
keeps every feature as a prototype (``num_prototypes_per_task`` above the stream's size: the trainer's own
branch for fewer features than prototypes), so no k-means runs and scikit-learn may be a stand-in.

``official_agreement``: the official ``--use_rp_gate --use_ema_head`` model built from the retrofitted run's
trained weights, with our router's random matrix and statistics in its RPFC gate and our EMA banks in its
``experts_fc``; the official evaluation (its RPFC routing, its EMA ensemble) against ours, sample by sample.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, List, Sequence

import torch

from benchmarks.upstream.checks import ROUTER_OPTIONS, Settings, retrofit, run_checks
from benchmarks.upstream.harnesses import _flygcl
from benchmarks.upstream.harnesses._online_trainer import NUM_CLASSES, OnlineTrainerPair, make_trainer
from benchmarks.upstream.loading import quiet
from benchmarks.upstream.pair import run_loop
from benchmarks.upstream.report import Report
from benchmarks.upstream.task_stream import NUM_TASKS, make_stream


def import_with_sklearn_stub(checkout: Path, modules: Sequence[str]) -> List[str]:
    return _flygcl.import_flygcl(checkout, modules, stubs=("pandas", "sklearn"))


@contextlib.contextmanager
def instance_wrapper(target: Any, name: str, wrap):
    """Shadow ``target.name`` by ``wrap(current)`` for the block (whatever was there, an adapter's wrapper
    included, is put back exactly: an instance attribute, or none)."""
    had = name in vars(target)
    saved = vars(target).get(name)
    setattr(target, name, wrap(getattr(target, name)))
    try:
        yield
    finally:
        if had:
            setattr(target, name, saved)
        else:
            delattr(target, name)


class Seen:
    """What an evaluation used: each call's ``(B,)`` experts (and its outputs, where the capture keeps them)."""

    def __init__(self) -> None:
        self.experts: List[torch.Tensor] = []
        self.outputs: List[torch.Tensor] = []

    def keeping_outputs(self, inner):
        """``inner`` (a ``forward_prompt``) that also keeps the first element of each output."""
        def call(*args, **kwargs):
            output = inner(*args, **kwargs)
            self.outputs.append(output[0].detach())
            return output
        return call


class FlyGCLTaskPair(OnlineTrainerPair):
    """Shared by the four harnesses: task-boundary calls, the experts used, the official agreement."""

    import_checkout = staticmethod(import_with_sklearn_stub)
    backbone = _flygcl.BACKBONE
    model_options = dict(task_num=NUM_TASKS, num_classes=NUM_CLASSES)
    official_router = ""  # the official RPFC module's attribute (rp_head / rp_gate)

    def roots(self, ctx):
        return {"model": ctx.model}

    def start_task(self, ctx, task, own_advance):
        if task > 0 and own_advance:
            self.end_task(ctx, task - 1)
        ctx.trainer.online_before_task(task)

    def end_task(self, ctx, task: int) -> None:
        ctx.trainer.online_after_task(task)

    def expert_capture(self, ctx) -> contextlib.AbstractContextManager:
        raise NotImplementedError

    def selection_capture(self, ctx):
        return self.expert_capture(ctx)

    def used_rows(self, ctx, capture):
        return capture.experts[-1]

    # ------------------------------------------------------------- the official REAR + TE2
    def official_model(self, ctx) -> torch.nn.Module:
        """The same class with ``use_rp_gate`` / ``use_ema_head`` on (FlyGCL's flags), and the trained
        weights the two variants share."""
        torch.manual_seed(0)
        official = self.model_cls(backbone_name=self.backbone, **self.model_options, use_rp_gate=True,
                                  use_ema_head=True, rp_dim=ROUTER_OPTIONS["expansion_dim"],
                                  rp_ridge=ROUTER_OPTIONS["ridge"], ema_ratio=[0.9, 0.99])
        missing, unexpected = official.load_state_dict(ctx.model.state_dict(), strict=False)
        extra = [k for k in missing if not k.startswith((f"{self.official_router}.", "experts_fc."))]
        if extra or unexpected:
            raise RuntimeError(f"the official model does not share the baseline's weights: {extra} {unexpected}")
        return official

    def official_routes(self, ctx, official, trainer, x) -> torch.Tensor:
        raise NotImplementedError

    def official_probabilities(self, ctx, official, trainer, x, experts) -> torch.Tensor:
        raise NotImplementedError

    def our_query(self, ctx, x) -> torch.Tensor:
        raise NotImplementedError

    def our_forward(self, ctx, x) -> torch.Tensor:
        """Log-probabilities of the retrofitted model as the trainer's evaluation calls it."""
        raise NotImplementedError


def load_ours_into_official(handle: Any, official: torch.nn.Module, gate: torch.nn.Module) -> None:
    """Our router's random matrix and float64 statistics into the RPFC gate (float32, as it keeps them),
    our EMA banks into ``experts_fc``."""
    router = handle.router
    with torch.no_grad():
        gate.W_rand.copy_(router.expansion.weight.t())
        gate.G.copy_(router.gram_matrix().to(gate.G.dtype))
        gate.Q.copy_(router.cross.to(gate.Q.dtype))
        for bank, heads in enumerate(official.experts_fc):
            for decay, head in enumerate(heads):
                head.weight.copy_(handle.ensemble.ema_weight[bank, decay])
                head.bias.copy_(handle.ensemble.ema_bias[bank, decay])


def official_agreement(pair: FlyGCLTaskPair, settings: Settings, report: Report) -> None:
    """(o) Routing and predictions of the official ``--use_rp_gate --use_ema_head`` evaluation against the
    retrofit's, on identical state (weights, random matrix, router statistics, EMA heads)."""
    train, (x_test, y_test) = make_stream(seed=settings.seed)
    with quiet(not settings.verbose):
        ctx = pair.build(settings.seed)
    ctx.handle = handle = retrofit(ctx.model, pair.method, router=True, ensemble=True, optimizer=ctx.optimizer,
                                   **pair.family_options(ctx))
    torch.manual_seed(settings.seed + 1)
    run_loop(pair, ctx, train, handle, sync_expert=True, own_advance=True, session_calls=False,
             verbose=settings.verbose)
    with quiet(not settings.verbose):
        official = pair.official_model(ctx)
    load_ours_into_official(handle, official, getattr(official, pair.official_router))
    trainer = make_trainer(pair.trainer_cls, official, ctx.optimizer, ctx.trainer.scheduler, n_classes=NUM_CLASSES,
                           **pair.trainer_options())
    for name in ("exposed_classes", "mask", "task_id"):
        setattr(trainer, name, getattr(ctx.trainer, name))
    official.update()  # what the official evaluation solves first
    official.eval()
    ctx.model.eval()
    handle.set_logit_mask(ctx.trainer.mask.clone())
    x = x_test.clone()
    seen = trainer.task_id + 1
    with torch.no_grad():
        theirs = pair.official_routes(ctx, official, trainer, x)
        official_p = pair.official_probabilities(ctx, official, trainer, x, theirs)
        official_scores = official.forward_with_rp(x)[:, :seen].double()
        query = pair.our_query(ctx, x).double()
        ours_scores = handle.router(query)[:, :seen]
        ours = handle.router.route(query).to(theirs.device)
        ours_p = pair.our_forward(ctx, x).exp()
    routed = float((ours == theirs).float().mean())
    predicted = float((ours_p.argmax(1) == official_p.argmax(1)).float().mean())
    error = float((ours_p - official_p).abs().max())
    scores = float((ours_scores - official_scores).abs().max() / official_scores.abs().max().clamp_min(1e-30))
    ok = routed == 1.0 and predicted == 1.0 and error < 1e-4 and scores < 1e-3
    report.add("o", "PASS" if ok else "FAIL",
               "agrees with the official --use_rp_gate / --use_ema_head evaluation on identical state",
               f"{len(x)} test samples: router scores max |official - ours| / max |official| {scores:.1e}, routed "
               f"task equal for {100 * routed:.1f}% (official {theirs.tolist()}), prediction equal for "
               f"{100 * predicted:.1f}%, max |p_official - p_ours| {error:.1e} (official: float32 statistics and "
               "solve; ours: float64)")
    handle.remove()


def run_with_agreement(pair: FlyGCLTaskPair, settings: Settings) -> Report:
    report = run_checks(pair, settings)
    report.guard("o", "agreement with the official --use_rp_gate / --use_ema_head", lambda: official_agreement(
        pair, settings, report))
    return report
