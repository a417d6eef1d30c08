"""The checks every harness runs on its repository's real model and loop.

(a) ``router=False, ensemble=False``: losses, parameters and evaluation logits bit-identical to an
    un-retrofitted twin built from the same seed.
(b) ``router=True, ensemble=True, schedule=None``: the same losses and state_dict (bitwise) as the twin;
    the repository's own step / task advance runs in both, the retrofitted run adds ``end_batch()`` per
    batch and ``start_expert(t)`` after the repository's own advance (the documented sync).
(c) the router receives queries: ``router.num_samples > 0`` after the ``end_batch()`` calls of (b).
(d) forcing expert 0 vs 1 at inference changes the prompt the model uses (pool row / slot, observed
    from its calls) AND the logits. (d') when the router holds no sample it is fed by hand, to tell
    "no query" from "routed value ignored"; (d0) the same with ``ensemble=False``.
(e) the ensemble banks move with the first optimizer step of (b); (e2) still during the last task when
    the loop re-created its optimizer at the task start.
(f) a SampleBudgetSchedule (online codebases) or SessionSchedule (task codebases) moves the method's OWN
    step counter to 1 and the slots trained afterwards belong to expert 1; N/A without such a counter.
(g) after ``remove()``: state_dict (key order included) and evaluation logits equal the twin's bitwise;
    module / parameter identities and order equal the pre-retrofit ones; every module's instance
    attributes, class and hook tables equal the twin's; the optimizer's step hooks are gone.
(i) batch independence of the trained, routed retrofit through the repository's own evaluation call: a batch
    whose samples are forced to mixed experts [0, 1, 0, 1] and one forced to expert 0 give each sample the
    logits it gets alone with its expert (``fly_modules.adapters._batch_independence``, the function verify() uses);
    without a router, the model's own selection. (i0, informational) the same for the repository as it is.
(v) ``handle.verify(batch, forward=<the loop's call>)`` on the trained model agrees with (c), (d), (g), (i).

When ``retrofit`` refuses ``router=True`` because the repository's prompt assembly mixes the samples of a
batch, it is retried with ``correct_assembly=True``; every check but (a) then runs with the option, and the
reference run is the corrected baseline (``router=False, ensemble=False, correct_assembly=True``, removed
before its evaluation and structure are recorded, so (g) compares like with like).

When ``retrofit`` refuses ``router=True`` (r: REFUSED, with its reason), the checks that remain run with
``router=False, ensemble=True`` (r-ens).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Dict, List

import torch
from fly_modules.adapters._batch_independence import batch_independence

import fly_modules
from benchmarks.upstream.loading import quiet
from benchmarks.upstream.observe import forced_route
from benchmarks.upstream.pair import Pair, run_loop
from benchmarks.upstream.report import Report
from benchmarks.upstream.snapshots import clone_state, max_diff, state_equal, structure, structure_diff
from benchmarks.upstream.stream import make_stream
from fly_modules import adapters

BATCH_SAMPLES = 4  # check (i): the first test samples, routed [0, 1, 0, 1], and each alone

# A small router: the default expansion (10,000 wide) would make G an 800 MB matrix for a 32-wide ViT.
ROUTER_OPTIONS = dict(expansion_dim=256, ridge=1.0)


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


def run_checks(pair: Pair, settings: Settings) -> Report:
    report = Report(pair.name, pair.meta(), show_tracebacks=settings.verbose)
    train, (x_test, y_test) = make_stream(seed=settings.seed)
    seed, verbose = settings.seed, settings.verbose

    def fresh() -> SimpleNamespace:
        with quiet(not verbose):
            return pair.build(seed)

    def loop(ctx, handle=None, **kw):
        torch.manual_seed(seed + 1)
        return run_loop(pair, ctx, train, handle, verbose=verbose, **kw)

    def evaluate(ctx):
        with quiet(not verbose):
            return pair.eval_logits(ctx, x_test.clone(), y_test.clone())

    correction: Dict[str, Any] = {}  # correct_assembly=True where the repository's assembly mixes samples

    def attach(ctx, **options):
        options = {**correction, **options}
        ctx.handle = retrofit(ctx.model, pair.method, optimizer=ctx.optimizer, **options, **pair.family_options(ctx))
        return ctx.handle

    # does the adapter accept the model? (router + ensemble; with correct_assembly where it asks for it;
    # else the ensemble alone)
    use_router = True
    try:
        try:
            attach(fresh(), router=True, ensemble=True).remove()
            report.add("r", "PASS", f"retrofit(method={pair.method!r}) accepts the model")
        except Exception as error:  # noqa: BLE001 - a refusal is a result
            if not needs_correction(error):
                raise
            attach(fresh(), router=True, ensemble=True, correct_assembly=True).remove()
            correction["correct_assembly"] = True
            report.add("r", "PASS", f"retrofit(method={pair.method!r}) refuses router=True on the repository's "
                       "prompt assembly and accepts it with correct_assembly=True", one_line(error, 900))
    except Exception as error:  # noqa: BLE001 - a refusal is a result
        report.add("r", "REFUSED", f"retrofit(method={pair.method!r}, router=True) refuses the model",
                   one_line(error, 900))
        use_router = False
        try:
            attach(fresh(), router=False, ensemble=True).remove()
        except Exception as error2:  # noqa: BLE001
            report.add("r-ens", "REFUSED", "router=False, ensemble=True refused too", one_line(error2, 600))
            for key in "abcdefgv":
                report.add(key, "N/A", "not run (refused)")
            return report
        report.add("r-ens", "PASS", "router=False, ensemble=True accepted: the checks below run without the router")
    for key, status, title, detail in pair.probes(fresh(), adapters):
        report.add(key, status, title, detail)

    def reference(corrected: bool):
        """The repository alone (``corrected``: with the assembly correction only, removed before its
        evaluation and structure are recorded)."""
        ctx = fresh()
        handle = attach(ctx, router=False, ensemble=False, correct_assembly=True) if corrected else None
        losses = loop(ctx, handle, sync_expert=False, own_advance=True, session_calls=False)
        if handle is not None:
            handle.remove()
        return losses, clone_state(ctx.model), evaluate(ctx), structure(pair.roots(ctx), pair.optimizers(ctx))

    # reference run: the repository alone; check (a) compares with it as it is
    plain_losses, plain_state, (plain_logits, base_rows), base_structure = reference(False)
    base_losses, base_state, base_logits = plain_losses, plain_state, plain_logits
    report.add("info", "INFO", "reference run", f"{len(base_losses)} training steps, final loss "
               f"{base_losses[-1]:.4f}, eval prompt rows {base_rows.tolist() if base_rows is not None else None}")
    if correction:
        base_losses, base_state, (base_logits, _), base_structure = reference(True)
        report.add("info", "INFO", "corrected reference run (correct_assembly=True, router=False, ensemble=False)",
                   f"the reference of every check but (a); final loss {base_losses[-1]:.4f} (as is: "
                   f"{plain_losses[-1]:.4f})")

    def check_a():
        ctx = fresh()
        handle = attach(ctx, router=False, ensemble=False, correct_assembly=False)
        losses = loop(ctx, handle, sync_expert=True, own_advance=True, session_calls=False)
        state = clone_state(ctx.model)
        logits, _ = evaluate(ctx)
        problems = [] if losses == plain_losses else [
            f"losses differ (max {max(abs(a - b) for a, b in zip(losses, plain_losses)):.3g})"]
        problems += state_equal(plain_state, state)[:3]
        if not torch.equal(logits, plain_logits):
            problems.append(f"eval logits differ (max |diff| {max_diff(logits, plain_logits):.3g})")
        report.add("a", "FAIL" if problems else "PASS", "router=False, ensemble=False is bit-identical"
                   + (" (without correct_assembly)" if correction else ""),
                   "; ".join(problems) or f"{len(losses)} losses, state_dict and eval logits identical")
        handle.remove()

    def check_bceg():
        ctx = fresh()
        roots = pair.roots(ctx)
        before = structure(roots, pair.optimizers(ctx))
        rng = torch.random.get_rng_state()
        handle = attach(ctx, router=use_router, ensemble=True)
        rng_used = not torch.equal(rng, torch.random.get_rng_state())
        ema = {"start": handle.ensemble.ema_weight.detach().clone()}

        def on_batch(task, before, after):
            weight = handle.ensemble.ema_weight.detach().clone()
            ema.setdefault("first", weight)
            ema.setdefault(f"first{task}", weight)
            ema[f"last{task}"] = weight
            ema.setdefault(f"optimizer{task}", id(ctx.optimizer))

        error = None
        try:
            losses = loop(ctx, handle, sync_expert=True, own_advance=True, session_calls=False, on_batch=on_batch)
        except Exception as exc:  # noqa: BLE001 - e.g. an end_batch that refuses
            error, losses = one_line(exc, 300), []
        state = clone_state(ctx.model)
        problems = []
        if error:
            problems.append("loop raised " + error)
        elif losses != base_losses:
            worst = max(abs(a - b) for a, b in zip(losses, base_losses))
            problems.append(f"losses differ (max |diff| {worst:.3g}; first {losses[:2]} vs {base_losses[:2]})")
        problems += state_equal(base_state, state)[:4]
        report.add("b", "FAIL" if problems else "PASS", "training unchanged by the retrofit",
                   "; ".join(problems) or f"{len(losses)} losses and the state_dict bitwise equal to the reference"
                   + (" (retrofit() consumed the global RNG)" if rng_used else ""))
        if "first" in ema:
            moved = (ema["first"] != ema["start"]).flatten(1).any(1).nonzero().flatten().tolist()
            report.add("e", "PASS" if moved else "FAIL", "ensemble banks move after an optimizer step",
                       f"banks moved by the first training batch: {moved} of {handle.ensemble.num_experts}")
            last = len(train) - 1
            if f"first{last}" in ema:
                moved = (ema[f"last{last}"] != ema[f"first{last}"]).flatten(1).any(1).nonzero().flatten().tolist()
                note = ""
                if ema.get(f"optimizer{last}") != ema.get("optimizer0"):
                    note = ("; the loop re-created its optimizer at the task start and the banks follow it" if moved
                            else "; the loop re-created its optimizer at the task start, the step hook sits on the "
                                 "first one")
                report.add("e2", "PASS" if moved else "FAIL", f"banks still move in the last task (task {last})",
                           f"banks moved between its first and last batch: {moved}{note}")
        if use_router:
            samples = int(handle.router.num_samples) if handle.router is not None else 0
            report.add("c", "PASS" if samples > 0 else "FAIL", "router receives queries",
                       f"router.num_samples = {samples} after {sum(len(b) for b in train)} end_batch() calls")
        else:
            report.add("c", "N/A", "router receives queries", "router refused for this model")
        handle.remove()
        after = structure(roots, pair.optimizers(ctx))
        identities = ("cls", "id", "children") if pair.replaces_own_parameters else ("cls", "id", "params", "children")
        problems = structure_diff(before, after, identities)
        if pair.replaces_own_parameters:
            problems += [p for p in structure_diff(before, after, ("params",)) if "(objects replaced)" not in p]
        problems += structure_diff(base_structure, after, ("cls", "attrs", "buffers", "hooks", "post", "pre"))
        state_after = clone_state(ctx.model)
        problems += state_equal(state, state_after)[:3]
        logits, _ = evaluate(ctx)
        if error:
            problems.append("(state and logits not compared: the loop raised)")
        else:
            problems += [f"after remove: {p}" for p in state_equal(base_state, state_after)[:3]]
            if not torch.equal(logits, base_logits):
                problems.append(f"eval logits after remove differ from the reference "
                                f"(max {max_diff(logits, base_logits):.3g})")
        report.add("g", "FAIL" if problems else "PASS", "remove() restores the model",
                   "; ".join(problems[:6]) or "identities, classes, attributes, hooks, optimizer hooks, state_dict "
                   "and eval logits as un-retrofitted" + (f" (parameter names, not identities: "
                                                          f"{pair.replaces_own_parameters})"
                                                          if pair.replaces_own_parameters else ""))

    def check_v(ctx, handle):
        """handle.verify on the trained model: does its verdict agree with (c), (d), (g) of this harness?"""
        with quiet(not verbose):
            result = handle.verify(x_test[:8].clone(), forward=pair.verify_forward(ctx, handle))
        failures = [getattr(c, "name", str(c)) for c in getattr(result, "failures", [])]
        harness_bad = [r["check"] for r in report.rows if r["check"] in ("c", "d", "g", "i") and r["status"] == "FAIL"]
        agrees = bool(result.ok) == (not harness_bad)
        report.add("v", "PASS" if agrees else "FAIL", "handle.verify(batch) agrees with the harness",
                   f"verify ok={result.ok} failures={failures}; harness failures {harness_bad or 'none'}")

    def check_i(ctx, handle, key="i"):
        """Batch independence through the repository's evaluation call (the check verify() runs)."""
        rows_x, rows_y = x_test[:BATCH_SAMPLES], y_test[:BATCH_SAMPLES]
        router = getattr(handle, "router", None) if handle is not None else None

        def run(rows, experts):
            with forced_route(handle, experts) if experts is not None else contextlib.nullcontext():
                logits, _ = evaluate_on(ctx, rows_x[rows].clone(), rows_y[rows].clone())
            return logits

        ctx.model.eval()
        # experts [0, 1, 0, 1]: the two the stream trained
        found = batch_independence(run, len(rows_x), None if router is None else min(2, int(handle.num_experts)))
        where = "as the repository is" if handle is None else (
            ("router" if router is not None else "router=False, ensemble=True")
            + (", correct_assembly=True" if correction else ""))
        for check in found:
            status = "INFO" if key == "i0" else ("N/A" if check.ok is None else "PASS" if check.ok else "FAIL")
            report.add(key, status, f"{check.name} ({where})", check.detail)

    def evaluate_on(ctx, x, y):
        with quiet(not verbose):
            return pair.eval_logits(ctx, x, y)

    def check_i0():
        """The repository as it is (no retrofit): its own selection, batch vs each sample alone."""
        ctx = fresh()
        loop(ctx, None, sync_expert=False, own_advance=True, session_calls=False)
        check_i(ctx, None, key="i0")

    def check_d():
        if not use_router:
            report.add("d", "N/A", "forcing expert 0 vs 1", "router refused for this model")
            ctx = fresh()
            handle = attach(ctx, router=False, ensemble=True)
            loop(ctx, handle, sync_expert=True, own_advance=True, session_calls=False)
            report.guard("i", "batch independence", lambda: check_i(ctx, handle))
            report.guard("v", "handle.verify(batch)", lambda: check_v(ctx, handle))
            handle.remove()
            return
        ctx = fresh()
        handle = attach(ctx, router=True, ensemble=True)
        try:
            loop(ctx, handle, sync_expert=True, own_advance=True, session_calls=False)
        except Exception as error:  # noqa: BLE001
            report.add("d", "INFO", "training loop raised before (d)", one_line(error, 300))

        def forced_pair(tag: str):
            results = {}
            for expert in (0, 1):
                with forced_route(ctx.handle, expert):
                    results[expert] = evaluate(ctx)
            (l0, r0), (l1, r1) = results[0], results[1]
            rows = {e: (r.tolist() if r is not None else None) for e, (_, r) in results.items()}
            rows_differ = r0 is not None and r1 is not None and not torch.equal(r0, r1)
            slots = {e: pair.expert_slots(ctx, e) for e in (0, 1)}
            inside = all(r is not None and slots[e] is not None and set(r.tolist()) <= set(slots[e])
                         for e, (_, r) in results.items()) if slots[0] is not None else None
            ok = not torch.equal(l0, l1) and rows_differ and inside is not False
            detail = (f"prompt rows used: expert0 {rows[0]}, expert1 {rows[1]}"
                      + (f" (expert slots {slots[0]} / {slots[1]}, inside: {inside})" if slots[0] is not None else "")
                      + f"; logits max |diff| {max_diff(l0, l1):.3g}")
            title = {"d": "forcing expert 0 vs 1 changes the prompt used and the logits",
                     "d'": "same, router fed by hand (it held 0 samples)",
                     "d0": "same with ensemble=False (router fed by hand): only the routed prompt can act"}[tag]
            report.add(tag, "PASS" if ok else "FAIL", title, detail)

        def feed_by_hand():
            features = torch.randn(4, ctx.handle.router.in_features, generator=torch.Generator().manual_seed(0))
            ctx.handle.router.update(features, torch.tensor([0, 1, 0, 1]))

        ctx.model.eval()
        samples = int(handle.router.num_samples)
        forced_pair("d")
        if samples == 0:
            feed_by_hand()
            forced_pair("d'")
        report.guard("i", "batch independence", lambda: check_i(ctx, handle))
        report.guard("v", "handle.verify(batch)", lambda: check_v(ctx, handle))
        # the same forced experts with the ensemble off, so only the routed prompt can change the logits
        handle.remove()
        attach(ctx, router=True, ensemble=False)
        feed_by_hand()
        ctx.model.eval()
        forced_pair("d0")
        ctx.handle.remove()

    def check_f():
        if pair.counter_name is None:
            report.add("f", "N/A", "schedule moves the method's own training counter", pair.counter_na)
            return
        ctx = fresh()
        if pair.schedule == "samples":
            schedule = fly_modules.SampleBudgetSchedule(sum(len(x) for x, _ in train[0]), len(train))
        else:
            schedule = fly_modules.SessionSchedule(len(train))
        handle = attach(ctx, router=use_router, ensemble=True, schedule=schedule)
        used: Dict[int, set] = {}

        def on_batch(task, before, after):
            if before is not None and after is not None:
                used.setdefault(task, set()).update((after - before).nonzero().flatten().tolist())

        error = None
        session = pair.schedule == "session"
        try:
            loop(ctx, handle, sync_expert=False, own_advance=session, session_calls=session, on_batch=on_batch)
        except Exception as exc:  # noqa: BLE001
            error = one_line(exc, 200)
        counter = pair.counter(ctx)
        slots1 = pair.expert_slots(ctx, 1)
        trained_last: List[int] = sorted(used.get(len(train) - 1, set()))
        inside = None if slots1 is None or not trained_last else set(trained_last) <= set(slots1)
        ok = error is None and counter == 1 and handle.current_expert == 1 and inside is not False
        report.add("f", "PASS" if ok else "FAIL", f"{pair.schedule} schedule moves {pair.counter_name}",
                   (f"loop raised {error}; " if error else "")
                   + f"handle.current_expert={handle.current_expert}, {pair.counter_name}={counter}; slots trained in "
                   f"task 1: {trained_last}" + (f" (expert 1 owns {slots1})" if slots1 is not None else ""))

    report.guard("a", "router=False, ensemble=False is bit-identical", check_a)
    report.guard("b", "training unchanged / router queries / remove()", check_bceg)
    report.guard("d", "forced experts", check_d)
    report.guard("f", "schedule moves the method's own training counter", check_f)
    report.guard("i0", "batch independence of the repository as it is", check_i0)
    return report
