"""The checks every harness runs on its repository's real model and loop (docs/adapters.md, "Verified against
the upstream repositories"). Each check is one function, named for what it establishes; its report letter is
the one of the table:

(r)  ``accepts_model``: ``retrofit(router=True, ensemble=True)`` accepts the model (with ``correct_assembly=True``
     where the repository's prompt assembly mixes the samples of a batch); (r-ens) else with the ensemble alone.
(a)  ``pass_through_is_bit_identical``: ``router=False, ensemble=False`` leaves losses, parameters and evaluation
     logits bit-identical to the repository as it is.
(b)  ``training_unchanged``: with ``router=True, ensemble=True, schedule=None``, the same losses and state_dict
     (bitwise) as the reference; the repository's own step / task advance runs in both, the retrofitted run adds
     ``end_batch()`` per batch and ``start_expert(t)`` after the repository's own advance (the documented sync).
(c)  ``router_receives_queries``: ``router.num_samples > 0`` after the ``end_batch()`` calls of (b).
(d)  ``forced_expert_changes_prompt``: forcing expert 0 vs 1 at inference changes the prompt the model uses (pool
     row / slot, observed from its calls) AND the logits; (d') ``routed_expert_acts``: the same after feeding a
     router that holds no sample by hand, to tell "no query" from "routed value ignored"; (d0)
     ``routed_prompt_acts_alone``: the same with ``ensemble=False``.
(e)  ``banks_move``: the ensemble banks move with the first optimizer step of (b); (e2)
     ``banks_move_in_last_task``: still during the last task when the loop re-created its optimizer there.
(f)  ``schedule_moves_own_counter``: a SampleBudgetSchedule (online codebases) or SessionSchedule (task
     codebases) moves the method's OWN step counter to 1 and the slots trained afterwards belong to expert 1;
     N/A without such a counter.
(g)  ``remove_restores_model``: after ``remove()``, state_dict (key order included) and evaluation logits equal
     the reference's bitwise; module / parameter identities and order equal the pre-retrofit ones; every module's
     instance attributes, class and hook tables equal the reference's; the optimizer's step hooks are gone.
(i)  ``outputs_independent_of_batch``: through the repository's own evaluation call, a batch of the trained,
     routed retrofit whose samples are forced to experts [0, 1, 0, 1], and one forced to expert 0, give each
     sample the logits it gets alone with its expert (the function verify() uses); without a router, the model's
     own selection. (i0, informational) ``repository_outputs_independent_of_batch``: the repository as it is.
(v)  ``verify_agrees``: ``handle.verify(batch, forward=<the loop's call>)`` on the trained model agrees with (c),
     (d), (g), (i).

With ``correct_assembly=True``, every check but (a) runs with the option, and the reference run is the corrected
baseline (``router=False, ensemble=False, correct_assembly=True``, removed before its evaluation and structure are
recorded, so (g) compares like with like). When ``retrofit`` refuses ``router=True``, the checks that remain run
with ``router=False, ensemble=True``.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Dict, List, Optional

import torch
from fly_modules.adapters._batch_independence import batch_independence
from fly_modules.adapters._head import bank_copies

import fly_modules
from benchmarks.upstream.loading import quiet
from benchmarks.upstream.observe import forced_route
from benchmarks.upstream.pair import Pair, run_loop
from benchmarks.upstream.report import Report
from benchmarks.upstream.snapshots import clone_state, max_diff, state_equal, structure, structure_diff
from benchmarks.upstream.task_stream import make_stream
from fly_modules import adapters

BATCH_SAMPLES = 4  # check (i): the first test samples, routed [0, 1, 0, 1], and each alone

# A small router: the default expansion (10,000 wide) would make G an 800 MB matrix for a 32-wide ViT.
ROUTER_OPTIONS = dict(expansion_dim=256, ridge=1.0)

# Check (d) and its two variants: report letter -> title.
FORCED_EXPERT_TITLES = {
    "d": "forcing expert 0 vs 1 changes the prompt used and the logits",
    "d'": "same, router fed by hand (it held 0 samples)",
    "d0": "same with ensemble=False (router fed by hand): only the routed prompt can act",
}


@dataclass
class Settings:
    seed: int = 0
    verbose: bool = False


def needs_correction(error: BaseException) -> bool:
    """A refusal of ``router=True`` that ``correct_assembly=True`` lifts (a batch-mixing prompt assembly)."""
    return isinstance(error, adapters.SeamError) and "correct_assembly=True" in str(error)


def retrofit(model: Any, method: str, *, router: bool, ensemble: bool, optimizer: Any = None, schedule: Any = None,
             **family: Any):
    """The README call; family options (num_experts, original_model, correct_assembly, ...) pass through."""
    options = dict(router=router, ensemble=ensemble, optimizer=optimizer, schedule=schedule, **family)
    if router:
        options.update(ROUTER_OPTIONS)
    return adapters.retrofit(model, method=method, **options)


def try_retrofit(model: Any, method: str, **family: Any) -> tuple:
    """(status, detail) of ``retrofit(router=True, ensemble=True)``; an accepted retrofit is removed again."""
    try:
        handle = retrofit(model, method, router=True, ensemble=True, **family)
    except Exception as error:  # noqa: BLE001 - a refusal is a result
        return "REFUSED", one_line(error, 500)
    handle.remove()
    return "ACCEPTED", type(handle).__name__


def one_line(error: BaseException, limit: int) -> str:
    return f"{type(error).__name__}: {error}".replace("\n", " ")[:limit]


def moved_banks(before: List[torch.Tensor], after: List[torch.Tensor]) -> List[int]:
    """The ensemble banks whose EMA copies differ between two snapshots of ``bank_copies``."""
    return [bank for bank, (old, new) in enumerate(zip(before, after)) if not torch.equal(old, new)]


def loss_gap(losses: List[float], reference: List[float]) -> float:
    return max(abs(a - b) for a, b in zip(losses, reference))


@dataclass
class Reference:
    """The repository trained and evaluated with no retrofit acting: what the checks compare with."""

    losses: List[float]
    state: Dict[str, torch.Tensor]
    logits: torch.Tensor
    rows: Optional[torch.Tensor]  # the pool row each test sample used, where the pair observes it
    structure: Dict[str, Any]


class Harness:
    """What the checks of one repository x family share: the pair, the stream, the retrofit options the model
    accepts (``correct_assembly``, ``use_router``) and the two references (``plain``: the repository as it is,
    the reference of (a); ``base``: with the assembly correction where it is needed, the reference of the rest)."""

    def __init__(self, pair: Pair, settings: Settings, report: Report) -> None:
        self.pair, self.report = pair, report
        self.seed, self.verbose = settings.seed, settings.verbose
        self.train, (self.x_test, self.y_test) = make_stream(seed=settings.seed)
        self.correct_assembly = False
        self.use_router = True
        self.plain: Optional[Reference] = None
        self.base: Optional[Reference] = None

    def fresh(self) -> SimpleNamespace:
        """The repository's model (and trainer, engine or learner) built afresh from the seed."""
        with quiet(not self.verbose):
            return self.pair.build(self.seed)

    def loop(self, ctx: SimpleNamespace, handle: Any = None, **options: Any) -> List[float]:
        torch.manual_seed(self.seed + 1)
        return run_loop(self.pair, ctx, self.train, handle, verbose=self.verbose, **options)

    def train_synced(self, ctx: SimpleNamespace, handle: Any, **options: Any) -> List[float]:
        """The stream with the repository's own advance and the documented ``start_expert`` sync."""
        return self.loop(ctx, handle, sync_expert=True, own_advance=True, session_calls=False, **options)

    def evaluate(self, ctx: SimpleNamespace, x: Optional[torch.Tensor] = None, y: Optional[torch.Tensor] = None):
        """(logits, pool rows) of the repository's evaluation call on the test batch (or on ``x``, ``y``)."""
        x = self.x_test.clone() if x is None else x
        y = self.y_test.clone() if y is None else y
        with quiet(not self.verbose):
            return self.pair.eval_logits(ctx, x, y)

    def attach(self, ctx: SimpleNamespace, **options: Any) -> Any:
        """Retrofit the context's model (``ctx.handle``), with the assembly correction the model needs."""
        if self.correct_assembly:
            options = {"correct_assembly": True, **options}
        ctx.handle = retrofit(ctx.model, self.pair.method, optimizer=ctx.optimizer, **options,
                              **self.pair.family_options(ctx))
        return ctx.handle

    def reference(self, corrected: bool) -> Reference:
        """The repository alone (``corrected``: with the assembly correction only, removed before its
        evaluation and structure are recorded)."""
        ctx = self.fresh()
        handle = self.attach(ctx, router=False, ensemble=False, correct_assembly=True) if corrected else None
        losses = self.loop(ctx, handle, sync_expert=False, own_advance=True, session_calls=False)
        if handle is not None:
            handle.remove()
        state = clone_state(ctx.model)
        logits, rows = self.evaluate(ctx)
        return Reference(losses, state, logits, rows, structure(self.pair.roots(ctx), self.pair.optimizers(ctx)))

    def record_references(self) -> None:
        self.plain = self.base = plain = self.reference(corrected=False)
        rows = plain.rows.tolist() if plain.rows is not None else None
        self.report.add("info", "INFO", "reference run", f"{len(plain.losses)} training steps, final loss "
                        f"{plain.losses[-1]:.4f}, eval prompt rows {rows}")
        if self.correct_assembly:
            self.base = self.reference(corrected=True)
            self.report.add("info", "INFO",
                            "corrected reference run (correct_assembly=True, router=False, ensemble=False)",
                            f"the reference of every check but (a); final loss {self.base.losses[-1]:.4f} (as is: "
                            f"{plain.losses[-1]:.4f})")


# ------------------------------------------------------------------------------------------------ (r)
def accepts_model(harness: Harness) -> bool:
    """(r) ``retrofit`` accepts the model with the router and the ensemble, else (r-ens) with the ensemble
    alone (then ``harness.use_router`` is False); False when it refuses both."""
    report, method = harness.report, harness.pair.method
    try:
        accepts_router(harness)
        return True
    except Exception as error:  # noqa: BLE001 - a refusal is a result
        report.add("r", "REFUSED", f"retrofit(method={method!r}, router=True) refuses the model", one_line(error, 900))
    harness.use_router = False
    try:
        harness.attach(harness.fresh(), router=False, ensemble=True).remove()
    except Exception as error:  # noqa: BLE001 - a refusal is a result
        report.add("r-ens", "REFUSED", "router=False, ensemble=True refused too", one_line(error, 600))
        return False
    report.add("r-ens", "PASS", "router=False, ensemble=True accepted: the checks below run without the router")
    return True


def accepts_router(harness: Harness) -> None:
    """(r) ``router=True, ensemble=True`` accepted, with ``correct_assembly=True`` where a refusal asks for it
    (then ``harness.correct_assembly`` is True); raises the refusal otherwise."""
    method = harness.pair.method
    try:
        harness.attach(harness.fresh(), router=True, ensemble=True).remove()
    except Exception as error:  # noqa: BLE001 - a refusal is a result
        if not needs_correction(error):
            raise
        harness.attach(harness.fresh(), router=True, ensemble=True, correct_assembly=True).remove()
        harness.correct_assembly = True
        harness.report.add("r", "PASS", f"retrofit(method={method!r}) refuses router=True on the repository's "
                           "prompt assembly and accepts it with correct_assembly=True", one_line(error, 900))
        return
    harness.report.add("r", "PASS", f"retrofit(method={method!r}) accepts the model")


# ------------------------------------------------------------------------------------------------ (a)
def pass_through_is_bit_identical(harness: Harness) -> None:
    """(a) ``router=False, ensemble=False`` (without the assembly correction) leaves losses, parameters and
    evaluation logits bit-identical to the repository as it is."""
    plain, ctx = harness.plain, harness.fresh()
    handle = harness.attach(ctx, router=False, ensemble=False, correct_assembly=False)
    losses = harness.train_synced(ctx, handle)
    state = clone_state(ctx.model)
    logits, _ = harness.evaluate(ctx)
    problems = [] if losses == plain.losses else [f"losses differ (max {loss_gap(losses, plain.losses):.3g})"]
    problems += state_equal(plain.state, state)[:3]
    if not torch.equal(logits, plain.logits):
        problems.append(f"eval logits differ (max |diff| {max_diff(logits, plain.logits):.3g})")
    harness.report.add("a", "FAIL" if problems else "PASS", "router=False, ensemble=False is bit-identical"
                       + (" (without correct_assembly)" if harness.correct_assembly else ""),
                       "; ".join(problems) or f"{len(losses)} losses, state_dict and eval logits identical")
    handle.remove()


# ------------------------------------------------------------------------------------ (b), (c), (e), (g)
class BankTrace:
    """The ensemble banks' weights before training, at the first and the last batch of each task, and the
    optimizer each task started with (a ``run_loop`` ``on_batch`` callback)."""

    def __init__(self, handle: Any, ctx: SimpleNamespace) -> None:
        self.handle, self.ctx = handle, ctx
        self.start = self.weight()
        self.first: Dict[int, List[torch.Tensor]] = {}
        self.last: Dict[int, List[torch.Tensor]] = {}
        self.optimizer: Dict[int, int] = {}

    def weight(self) -> List[torch.Tensor]:
        """Each bank's EMA copies (a pool of per-expert classifiers: its own expert's), cloned."""
        return [copies.detach().clone() for copies in bank_copies(self.handle.ensemble)]

    def __call__(self, task: int, before: Any, after: Any) -> None:
        weight = self.weight()
        self.first.setdefault(task, weight)
        self.last[task] = weight
        self.optimizer.setdefault(task, id(self.ctx.optimizer))


@dataclass
class RetrofittedRun:
    """The stream trained with the retrofit (router where accepted, ensemble) in the documented loop."""

    ctx: SimpleNamespace
    handle: Any
    roots: Dict[str, torch.nn.Module]  # the modules whose structure (g) compares
    before: Dict[str, Any]  # their structure before the retrofit
    rng_used: bool  # retrofit() consumed the global RNG
    banks: BankTrace
    losses: List[float]
    error: Optional[str]  # the loop's exception, on one line
    state: Dict[str, torch.Tensor]

    @classmethod
    def train(cls, harness: Harness) -> "RetrofittedRun":
        pair, ctx = harness.pair, harness.fresh()
        roots = pair.roots(ctx)
        before = structure(roots, pair.optimizers(ctx))
        rng = torch.random.get_rng_state()
        handle = harness.attach(ctx, router=harness.use_router, ensemble=True)
        rng_used = not torch.equal(rng, torch.random.get_rng_state())
        banks, error = BankTrace(handle, ctx), None
        try:
            losses = harness.train_synced(ctx, handle, on_batch=banks)
        except Exception as exc:  # noqa: BLE001 - e.g. an end_batch that refuses
            error, losses = one_line(exc, 300), []
        return cls(ctx, handle, roots, before, rng_used, banks, losses, error, clone_state(ctx.model))


def training_with_retrofit(harness: Harness) -> None:
    """(b), (e), (e2), (c) and (g) on one retrofitted training."""
    run = RetrofittedRun.train(harness)
    training_unchanged(harness, run)
    banks_move(harness, run)
    banks_move_in_last_task(harness, run)
    router_receives_queries(harness, run)
    remove_restores_model(harness, run)


def training_unchanged(harness: Harness, run: RetrofittedRun) -> None:
    """(b) the retrofit leaves the training losses and the final state_dict bit-identical to the reference."""
    base, problems = harness.base, []
    if run.error:
        problems.append("loop raised " + run.error)
    elif run.losses != base.losses:
        problems.append(f"losses differ (max |diff| {loss_gap(run.losses, base.losses):.3g}; first "
                        f"{run.losses[:2]} vs {base.losses[:2]})")
    problems += state_equal(base.state, run.state)[:4]
    harness.report.add("b", "FAIL" if problems else "PASS", "training unchanged by the retrofit",
                       "; ".join(problems) or f"{len(run.losses)} losses and the state_dict bitwise equal to the "
                       "reference" + (" (retrofit() consumed the global RNG)" if run.rng_used else ""))


def banks_move(harness: Harness, run: RetrofittedRun) -> None:
    """(e) the ensemble banks move with the first optimizer step."""
    if not run.banks.first:
        return
    moved = moved_banks(run.banks.start, next(iter(run.banks.first.values())))
    harness.report.add("e", "PASS" if moved else "FAIL", "ensemble banks move after an optimizer step",
                       f"banks moved by the first training batch: {moved} of {run.handle.ensemble.num_experts}")


def banks_move_in_last_task(harness: Harness, run: RetrofittedRun) -> None:
    """(e2) the banks still move during the last task, also when the loop re-created its optimizer there."""
    banks, last = run.banks, len(harness.train) - 1
    if last not in banks.first:
        return
    moved = moved_banks(banks.first[last], banks.last[last])
    note, recreated = "", banks.optimizer.get(last) != banks.optimizer.get(0)
    if moved:
        note = "; the loop re-created its optimizer at the task start and the banks follow it" if recreated else ""
    elif not run.handle.ensemble.online.weight.requires_grad:
        note = "; the wrapped classifier is frozen in this task (the model trains another one)"
    elif recreated:
        followed = id(run.handle.optimizer) == banks.optimizer[last]
        note = "; the loop re-created its optimizer at the task start" + (
            " and the step hook follows it" if followed else ", the step hook sits on the first one")
    harness.report.add("e2", "PASS" if moved else "FAIL", f"banks still move in the last task (task {last})",
                       f"banks moved between its first and last batch: {moved}{note}")


def router_receives_queries(harness: Harness, run: RetrofittedRun) -> None:
    """(c) the router holds samples after the ``end_batch()`` calls of the training."""
    if not harness.use_router:
        harness.report.add("c", "N/A", "router receives queries", "router refused for this model")
        return
    samples = int(run.handle.router.num_samples) if run.handle.router is not None else 0
    harness.report.add("c", "PASS" if samples > 0 else "FAIL", "router receives queries",
                       f"router.num_samples = {samples} after {sum(len(b) for b in harness.train)} end_batch() calls")


def remove_restores_model(harness: Harness, run: RetrofittedRun) -> None:
    """(g) ``remove()`` restores identities, classes, attributes, hooks, optimizer hooks, state_dict and
    evaluation logits."""
    pair, base, ctx = harness.pair, harness.base, run.ctx
    run.handle.remove()
    after = structure(run.roots, pair.optimizers(ctx))
    replaced = pair.replaces_own_parameters
    identities = ("cls", "id", "children") if replaced else ("cls", "id", "params", "children")
    problems = structure_diff(run.before, after, identities)
    if replaced:
        problems += [p for p in structure_diff(run.before, after, ("params",)) if "(objects replaced)" not in p]
    problems += structure_diff(base.structure, after, ("cls", "attrs", "buffers", "hooks", "post", "pre"))
    state_after = clone_state(ctx.model)
    problems += state_equal(run.state, state_after)[:3]
    logits, _ = harness.evaluate(ctx)
    if run.error:
        problems.append("(state and logits not compared: the loop raised)")
    else:
        problems += [f"after remove: {p}" for p in state_equal(base.state, state_after)[:3]]
        if not torch.equal(logits, base.logits):
            problems.append(f"eval logits after remove differ from the reference "
                            f"(max {max_diff(logits, base.logits):.3g})")
    names = f" (parameter names, not identities: {replaced})" if replaced else ""
    harness.report.add("g", "FAIL" if problems else "PASS", "remove() restores the model",
                       "; ".join(problems[:6]) or "identities, classes, attributes, hooks, optimizer hooks, "
                       "state_dict and eval logits as un-retrofitted" + names)


# ------------------------------------------------------------------------------------- (d), (i), (v)
def routed_model_checks(harness: Harness) -> None:
    """(d), (d'), (i), (v) and (d0) on one model trained with the router and the ensemble; (i) and (v) with
    the ensemble alone when the router is refused."""
    if not harness.use_router:
        ensemble_only_checks(harness)
        return
    ctx = harness.fresh()
    handle = harness.attach(ctx, router=True, ensemble=True)
    try:
        harness.train_synced(ctx, handle)
    except Exception as error:  # noqa: BLE001 - the checks below still tell what the model does
        harness.report.add("d", "INFO", "training loop raised before (d)", one_line(error, 300))
    ctx.model.eval()
    held_samples = int(handle.router.num_samples)
    forced_expert_changes_prompt(harness, ctx)
    if held_samples == 0:
        routed_expert_acts(harness, ctx)
    harness.report.guard("i", "batch independence", lambda: outputs_independent_of_batch(harness, ctx, handle))
    harness.report.guard("v", "handle.verify(batch)", lambda: verify_agrees(harness, ctx, handle))
    handle.remove()
    routed_prompt_acts_alone(harness, ctx)


def ensemble_only_checks(harness: Harness) -> None:
    """(i) and (v) with ``router=False, ensemble=True`` (the router refused; (d) does not apply)."""
    harness.report.add("d", "N/A", "forcing expert 0 vs 1", "router refused for this model")
    ctx = harness.fresh()
    handle = harness.attach(ctx, router=False, ensemble=True)
    harness.train_synced(ctx, handle)
    harness.report.guard("i", "batch independence", lambda: outputs_independent_of_batch(harness, ctx, handle))
    harness.report.guard("v", "handle.verify(batch)", lambda: verify_agrees(harness, ctx, handle))
    handle.remove()


def forced_expert_changes_prompt(harness: Harness, ctx: SimpleNamespace, letter: str = "d") -> None:
    """(d) forcing expert 0 vs 1 changes the prompt the model uses (the pool rows it reads, inside the forced
    expert's slots where the pair names them) and the logits."""
    pair, results = harness.pair, {}
    for expert in (0, 1):
        with forced_route(ctx.handle, expert):
            results[expert] = harness.evaluate(ctx)
    (logits0, rows0), (logits1, rows1) = results[0], results[1]
    rows = {e: (r.tolist() if r is not None else None) for e, (_, r) in results.items()}
    rows_differ = rows0 is not None and rows1 is not None and not torch.equal(rows0, rows1)
    slots = {e: pair.expert_slots(ctx, e) for e in (0, 1)}
    inside = all(r is not None and slots[e] is not None and set(r.tolist()) <= set(slots[e])
                 for e, (_, r) in results.items()) if slots[0] is not None else None
    ok = not torch.equal(logits0, logits1) and rows_differ and inside is not False
    detail = (f"prompt rows used: expert0 {rows[0]}, expert1 {rows[1]}"
              + (f" (expert slots {slots[0]} / {slots[1]}, inside: {inside})" if slots[0] is not None else "")
              + f"; logits max |diff| {max_diff(logits0, logits1):.3g}")
    harness.report.add(letter, "PASS" if ok else "FAIL", FORCED_EXPERT_TITLES[letter], detail)


def routed_expert_acts(harness: Harness, ctx: SimpleNamespace) -> None:
    """(d') as (d) once the router, which received no query, is fed by hand: tells "no query" from "routed value
    ignored"."""
    feed_router_by_hand(ctx.handle)
    forced_expert_changes_prompt(harness, ctx, "d'")


def routed_prompt_acts_alone(harness: Harness, ctx: SimpleNamespace) -> None:
    """(d0) as (d) with ``ensemble=False`` (router fed by hand): only the routed prompt can change the logits."""
    handle = harness.attach(ctx, router=True, ensemble=False)
    feed_router_by_hand(handle)
    ctx.model.eval()
    forced_expert_changes_prompt(harness, ctx, "d0")
    handle.remove()


def feed_router_by_hand(handle: Any) -> None:
    """Four random queries, two for each of experts 0 and 1."""
    features = torch.randn(4, handle.router.in_features, generator=torch.Generator().manual_seed(0))
    handle.router.update(features, torch.tensor([0, 1, 0, 1]))


def outputs_independent_of_batch(harness: Harness, ctx: SimpleNamespace, handle: Any, letter: str = "i") -> None:
    """(i) through the repository's evaluation call, a batch forced to experts [0, 1, 0, 1] (the two the stream
    trained) and one forced to expert 0 give each sample the logits it gets alone with its expert (the check
    verify() runs); without a router, the model's own selection. ``handle`` None: the repository as it is."""
    rows_x, rows_y = harness.x_test[:BATCH_SAMPLES], harness.y_test[:BATCH_SAMPLES]
    router = getattr(handle, "router", None) if handle is not None else None

    def run(rows, experts):
        with forced_route(handle, experts) if experts is not None else contextlib.nullcontext():
            logits, _ = harness.evaluate(ctx, rows_x[rows].clone(), rows_y[rows].clone())
        return logits

    ctx.model.eval()
    found = batch_independence(run, len(rows_x), None if router is None else min(2, int(handle.num_experts)))
    where = "as the repository is" if handle is None else (
        ("router" if router is not None else "router=False, ensemble=True")
        + (", correct_assembly=True" if harness.correct_assembly else ""))
    for check in found:
        status = "INFO" if letter == "i0" else ("N/A" if check.ok is None else "PASS" if check.ok else "FAIL")
        harness.report.add(letter, status, f"{check.name} ({where})", check.detail)


def repository_outputs_independent_of_batch(harness: Harness) -> None:
    """(i0, informational) the repository as it is (no retrofit): its own selection, batch vs each sample alone."""
    ctx = harness.fresh()
    harness.loop(ctx, None, sync_expert=False, own_advance=True, session_calls=False)
    outputs_independent_of_batch(harness, ctx, None, letter="i0")


def verify_agrees(harness: Harness, ctx: SimpleNamespace, handle: Any) -> None:
    """(v) ``handle.verify`` on the trained model agrees with (c), (d), (g) and (i) of this harness."""
    with quiet(not harness.verbose):
        result = handle.verify(harness.x_test[:8].clone(), forward=harness.pair.verify_forward(ctx, handle))
    failures = [getattr(c, "name", str(c)) for c in getattr(result, "failures", [])]
    harness_bad = [r["check"] for r in harness.report.rows
                   if r["check"] in ("c", "d", "g", "i") and r["status"] == "FAIL"]
    agrees = bool(result.ok) == (not harness_bad)
    harness.report.add("v", "PASS" if agrees else "FAIL", "handle.verify(batch) agrees with the harness",
                       f"verify ok={result.ok} failures={failures}; harness failures {harness_bad or 'none'}")


# ------------------------------------------------------------------------------------------------ (f)
class TrainedSlots:
    """The prompt slots each task's training batches used (a ``run_loop`` ``on_batch`` callback)."""

    def __init__(self) -> None:
        self.by_task: Dict[int, set] = {}

    def __call__(self, task: int, before: Optional[torch.Tensor], after: Optional[torch.Tensor]) -> None:
        if before is not None and after is not None:
            self.by_task.setdefault(task, set()).update((after - before).nonzero().flatten().tolist())


def schedule_moves_own_counter(harness: Harness) -> None:
    """(f) the schedule moves the method's own step counter to 1 and the slots trained afterwards are expert 1's."""
    pair, train = harness.pair, harness.train
    if pair.counter_name is None:
        harness.report.add("f", "N/A", "schedule moves the method's own training counter", pair.counter_na)
        return
    ctx = harness.fresh()
    if pair.schedule == "samples":
        schedule = fly_modules.SampleBudgetSchedule(sum(len(x) for x, _ in train[0]), len(train))
    else:
        schedule = fly_modules.SessionSchedule(len(train))
    handle = harness.attach(ctx, router=harness.use_router, ensemble=True, schedule=schedule)
    slots, error, session = TrainedSlots(), None, pair.schedule == "session"
    try:
        harness.loop(ctx, handle, sync_expert=False, own_advance=session, session_calls=session, on_batch=slots)
    except Exception as exc:  # noqa: BLE001 - the counter is still read
        error = one_line(exc, 200)
    counter, slots1 = pair.counter(ctx), pair.expert_slots(ctx, 1)
    trained_last: List[int] = sorted(slots.by_task.get(len(train) - 1, set()))
    inside = None if slots1 is None or not trained_last else set(trained_last) <= set(slots1)
    ok = error is None and counter == 1 and handle.current_expert == 1 and inside is not False
    harness.report.add("f", "PASS" if ok else "FAIL", f"{pair.schedule} schedule moves {pair.counter_name}",
                       (f"loop raised {error}; " if error else "")
                       + f"handle.current_expert={handle.current_expert}, {pair.counter_name}={counter}; slots "
                       f"trained in task 1: {trained_last}" + (f" (expert 1 owns {slots1})" if slots1 is not None
                                                               else ""))


# --------------------------------------------------------------------------------------------- the run
# The checks in the order they run: the report letter and title of a crash, and the check.
CHECKS = (
    ("a", "router=False, ensemble=False is bit-identical", pass_through_is_bit_identical),
    ("b", "training unchanged / router queries / remove()", training_with_retrofit),
    ("d", "forced experts", routed_model_checks),
    ("f", "schedule moves the method's own training counter", schedule_moves_own_counter),
    ("i0", "batch independence of the repository as it is", repository_outputs_independent_of_batch),
)


def run_checks(pair: Pair, settings: Settings) -> Report:
    """Every check on one repository x family; a check that crashes is an ERROR row."""
    report = Report(pair.name, pair.meta(), show_tracebacks=settings.verbose)
    harness = Harness(pair, settings, report)
    if not accepts_model(harness):
        for letter in "abcdefgv":
            report.add(letter, "N/A", "not run (refused)")
        return report
    for key, status, title, detail in pair.probes(harness.fresh(), adapters):
        report.add(key, status, title, detail)
    harness.record_references()
    for letter, title, check in CHECKS:
        report.guard(letter, title, functools.partial(check, harness))
    return report
