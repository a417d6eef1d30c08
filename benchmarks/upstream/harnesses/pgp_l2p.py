"""JingyangQiao/prompt-gradient-projection (PGP, ``l2p-pgp``) under ``retrofit(method="generic")``.

Real classes: ``vision_transformer.VisionTransformer`` with its ``prompt.Prompt`` pool (model) and a
prompt-free one (original_model), built directly at the harness size. Configuration: the CIFAR-100 10-task
L2P-PGP defaults (pool 10, top 5, length 5, prompt key, batch-wise prompt, 'cls' key, 'prompt' head, no
prompt mask, pull constraint 0.1, train mask, clip 1.0, Adam, gradient projection on). Per batch:
``engine.train_one_epoch`` with the projection matrices; evaluation: ``engine.evaluate``.

At each task start the loop (inline in ``engine.train_and_evaluate``) runs the model on memory examples in
eval mode, reads the patch embeddings it records (``model.act["rep"]``) and the prompt-free features, and
updates the projection matrices with ``memory.update_memory``. The harness does the same at the tiny size
(their ``memory.get_rep`` hard-codes ViT-B's 196 x 768 and 32 batches of 24): 32 memory examples (the
task's 24 training images, the first 8 twice; their 768 examples equal the ViT-B width, which the sum of the
two PCA projections needs), sklearn's PCA with their component counts and thresholds.

The generic seams: the query is ``original_model``'s ``pre_logits`` (the loop runs it before the model in
training and evaluation), the route is ``prompt.Prompt.forward``'s ``prompt_mask`` keyword (a routed
expert ``e`` gets the slots ``[5e, 5e + 5)``, as the l2p family's key slices), the classifier is
``model.head``. The task-start memory pass runs the model before ``original_model``: retrofitted, it runs inside
``handle.unrouted()`` (the user's line: L2P's own selection, no query needed).
"""

from __future__ import annotations

import contextlib
import importlib
from pathlib import Path

import numpy as np
import torch

from benchmarks.upstream.checks import ROUTER_OPTIONS, Settings, one_line, run_checks
from benchmarks.upstream.harnesses._prompt_options import l2p_prompt
from benchmarks.upstream.harnesses._task_loop import TaskLoopPair
from benchmarks.upstream.loading import quiet
from benchmarks.upstream.pair import active_handle
from benchmarks.upstream.task_stream import make_stream

POOL, TOP_K = 10, 5
MEMORY = 32  # memory examples: their 768 equals the ViT-B width; the tiny ViT's is 32


def routed_slots(experts: torch.Tensor, module, args, kwargs) -> torch.Tensor:
    """The user's route value: expert ``e`` selects its slice of ``TOP_K`` consecutive prompts."""
    return experts[:, None] * TOP_K + torch.arange(TOP_K, device=experts.device)


class PGPL2P(TaskLoopPair):
    name = "prompt-gradient-projection / L2P-PGP"
    method = "generic"
    counter_name = None
    counter_na = ("L2P-PGP's training selection ignores task_id (no prompt mask: top-k key match, batch-wise); "
                  "the loop's task_id only masks classes. Experts are key-pool slices named by the route value")
    pool, top_k = POOL, TOP_K
    prompt = l2p_prompt(POOL, TOP_K, batchwise_prompt=True)
    run_args = dict(pull_constraint_coeff=0.1, no_pgp=False, size=POOL, top_k=TOP_K, prompt_pool=True,
                    shared_prompt_pool=False, shared_prompt_key=False)

    def __init__(self, checkout: Path) -> None:
        super().__init__(checkout / "l2p-pgp")
        self.memory = importlib.import_module("memory")
        from sklearn.decomposition import PCA

        self.pca = PCA

    def meta(self):
        return dict(stubbed_modules=self.stubs or "none",
                    model=f"vision_transformer.VisionTransformer(+prompt.Prompt pool {POOL}, top_k {TOP_K}) + "
                          "original_model; 2 experts = key slices of 5 (route_value)")

    def build(self, seed):
        ctx = super().build(seed)
        ctx.feature = ctx.key_feature = ctx.feature_mat = ctx.key_feature_mat = None
        ctx.train_stream = make_stream(seed=seed)[0]  # the stream the checks train on: the memory examples
        return ctx

    def family_options(self, ctx):
        return dict(num_experts=2, query_module=ctx.original_model, route_module=ctx.model.prompt,
                    route_kwarg="prompt_mask", route_value=routed_slots)

    def start_task(self, ctx, task, own_advance):
        self.update_projection(ctx, task)
        super().start_task(ctx, task, own_advance)

    def memory_images(self, ctx, task):
        images = torch.cat([x for x, _ in ctx.train_stream[task]])
        return torch.cat([images, images])[:MEMORY]

    def update_projection(self, ctx, task):
        """Their task-start memory pass and projection update (engine.train_and_evaluate, tiny sizes)."""
        mem = self.memory_images(ctx, task)
        ctx.model.eval()
        ctx.original_model.eval()
        handle = active_handle(ctx)
        with torch.no_grad():  # memory.get_rep: the model first, then original_model
            with contextlib.nullcontext() if handle is None else handle.unrouted():
                ctx.model(mem, task_id=task, train=False)  # the user's line above: the model's own selection
            rep = ctx.model.act["rep"].reshape(MEMORY, -1).numpy()
            rep_key = ctx.original_model(mem, train=False)["pre_logits"].numpy()
        rep = self.pca(n_components=9).fit_transform(rep)
        if task:
            width = ctx.model.prompt.prompt.shape[-1]
            rep = rep + self.pca(n_components=9).fit_transform(
                ctx.model.prompt.prompt.detach().view(-1, width).numpy().transpose(1, 0))
            ctx.feature_mat = torch.Tensor(np.dot(ctx.feature, ctx.feature.transpose()))
            ctx.key_feature_mat = torch.Tensor(np.dot(ctx.key_feature, ctx.key_feature.transpose()))
        rep_key = self.pca(n_components=5).fit_transform(rep_key)
        ctx.feature = self.memory.update_memory(rep, 0.50, ctx.feature)
        ctx.key_feature = self.memory.update_memory(rep_key, 0.97, ctx.key_feature)

    def probes(self, ctx, adapters):
        """(q, informational) the task-1 memory pass once the router holds task 0: memory.get_rep runs the model
        before original_model, so no query of these images is recorded when the model's routed call runs. Bare,
        it raises (never another batch's query); inside ``handle.unrouted()`` (the user's line) it keeps L2P's own
        prompt selection, that of the model after ``remove()``; inside ``handle.forcing(1)`` expert 1's slots."""
        handle = adapters.retrofit(ctx.model, method=self.method, optimizer=ctx.optimizer, **ROUTER_OPTIONS,
                                   **self.family_options(ctx))
        with quiet():
            self.start_task(ctx, 0, True)
            for x, y in ctx.train_stream[0]:
                self.train_batch(ctx, x, y, 0)
                handle.end_batch(len(x))
        passes = {"bare": contextlib.nullcontext, "inside handle.unrouted()": handle.unrouted,
                  "inside handle.forcing(1)": lambda: handle.forcing(1)}
        found = {how: self.memory_prompts(ctx, wrap) for how, wrap in passes.items()}
        handle.remove()
        own = self.memory_prompts(ctx, contextlib.nullcontext)
        rows = []
        for how, (prompts, error) in found.items():
            title = f"the task-1 memory pass (model before original_model), {how}"
            if error is not None:
                rows.append(("q", "INFO", f"{title} raises", error))
                continue
            same = torch.equal(prompts, own[0])
            rows.append(("q", "INFO", f"{title} runs", f"prompt slots {sorted(set(prompts.flatten().tolist()))}; "
                         f"{'the same as' if same else 'other than'} the model's own after remove()"))
        return rows

    def memory_prompts(self, ctx, wrap):
        """(the prompt slots the memory pass of task 1 used, None) or (None, its error on one line)."""
        ctx.model.eval()
        try:
            with torch.no_grad(), wrap():
                return ctx.model(self.memory_images(ctx, 1), task_id=1, train=False)["prompt_idx"], None
        except Exception as error:  # noqa: BLE001 - a refusal to route it is a result
            return None, one_line(error, 300)

    def train_options(self, ctx):
        return dict(feature_mat=ctx.feature_mat, key_feature_mat=ctx.key_feature_mat)


def run(checkout: Path, settings: Settings):
    return run_checks(PGPL2P(checkout), settings)
