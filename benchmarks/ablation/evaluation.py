"""Scoring a trained method on the test subset of an evaluation point.

:class:`VariantEvaluator` scores every requested variant on the same test batches: one query pass,
one prompted pass per distinct selection (own, REAR-routed, oracle), the online head and the
ensemble on each; it also counts the diagnostics (docs/diagnostics.md). The forced-expert matrix,
one prompted pass per trained expert, is computed at the end of the stream only.
:class:`PredictEvaluator` scores one variant through ``model.predict`` (the reference path).
Every count is summed over the processes of a data-parallel run in one all-reduce per evaluation.

What does not change between evaluations is computed once per run (:class:`TestImages`): the test
images are read once and kept on the device, transformed there batch by batch; the frozen,
prompt-free features of a method that splits its query (``PromptMethod.splits_query``) are reused for
a test batch the previous evaluation had; a prompted pass whose selection equals, sample for sample,
one already made on the batch (routed, oracle, forced experts) is not repeated. Every reuse is of the
same computation on the same batch, so the logs are those of every pass at every evaluation.
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor

from fly_modules import seen_class_mask
from fly_modules.ensemble import aggregate_logits

from ..core.head_sets import head_set_members
from ..core.metrics import EvaluationLog, count_correct
from ..core.stream import Exposure
from ..core.timer import NO_TIMER, PartTimer
from ..core.variants import VARIANTS
from ..data.records import TensorImageDataset
from ..methods.base import MethodOutput, PromptMethod, QueryFeatures
from ..parallel import DataParallel
from ..studies.cka import ExpertFeatureMoments, cka_matrices
from .components import ScoredComponents
from .diagnostics import ROUTING_VERSIONS, ExpertUsage, expert_matrix_summary, member_summary, routing_summary

__all__ = ["EvaluationPoint", "PredictEvaluator", "TestImages", "VariantEvaluator"]

# (kind, timestamp, samples_seen, session, final): where in the stream an evaluation runs.
EvaluationPoint = Tuple[str, int, int, int, bool]


class TestImages:
    """The test set, read once per run: its images on the device, and a method's frozen features.

    Frozen features are kept per test batch, by the batch's exact indices: an evaluation whose subset is
    the previous one's (no class exposed in between) reuses them, and a batch that changed is computed
    again. Keyed so, a reused feature is the one the same computation on the same batch gives, on any
    device (a batch of other images may round differently).

    Args:
        test: the ``benchmarks.data`` test record.
        device: where the images are kept (at stored resolution, uint8) when they take at most
            ``max_device_bytes``; otherwise they stay in host memory and batches move per evaluation.
    """

    def __init__(self, test: Any, device: torch.device, *, max_device_bytes: int = 2 << 30) -> None:
        self.test, self.device = test, device
        raw, targets = test.get_raw_batch(torch.arange(len(test)))
        home = device if raw.numel() <= max_device_bytes else torch.device("cpu")
        # The same record type and transform as the dataset's own get_batch, on the images' device.
        self.images = TensorImageDataset(raw.to(home), targets, test.classes, name=test.name,
                                         image_size=test.image_size, stats=(test.mean, test.std))
        self._previous: Dict[bytes, Any] = {}  # batch indices -> frozen features, of the last evaluation
        self._current: Dict[bytes, Any] = {}
        self.computed_rows = 0

    def batch(self, indices: Tensor) -> Tensor:
        """Normalised ``(n, 3, S, S)`` images on the device (the dataset's test transform)."""
        return self.images.get_batch(indices)[0].to(self.device)

    def next_evaluation(self) -> None:
        """Keep only the batches of the evaluation that just ended."""
        self._previous, self._current = self._current, {}

    def frozen(self, model: PromptMethod, indices: Tensor, images: Tensor) -> Any:
        """``model.frozen_features(images)`` of the batch ``indices``, reused if the last evaluation had it."""
        key = indices.cpu().numpy().tobytes()
        features = self._current.get(key, self._previous.get(key))
        if features is None:
            features = model.frozen_features(images)
            self.computed_rows += len(indices)
        self._current[key] = features
        return features


class _TestSubset:
    """The test samples of the exposed classes at an evaluation point, this process's share of them."""

    def __init__(self, test: Any, exposure: Exposure, parallel: DataParallel, device: torch.device) -> None:
        self.test, self.exposure, self.parallel, self.device = test, exposure, parallel, device
        self.images = TestImages(test, device)

    def select(self, samples_seen: int) -> Tuple[int, Tensor, Tensor, Tensor, Tensor]:
        """``(exposed, seen-class mask, all targets, this rank's indices, this rank's targets)``."""
        exposed = self.exposure.num_exposed(samples_seen)
        indices, targets = self.exposure.eval_subset(self.test.targets, samples_seen)
        mask = seen_class_mask(exposed, len(self.test.classes), device=self.device)
        return exposed, mask, targets, self.parallel.split(indices), self.parallel.split(targets)

    def batches(self, indices: Tensor, targets: Tensor, batch_size: int):
        """``(indices, images, labels)`` per batch (images on the device)."""
        # Nothing to score (no class exposed yet, or a rank's empty share): torch.split would yield one empty batch.
        if len(indices) == 0:
            return
        for chunk, labels in zip(torch.split(indices, batch_size), torch.split(targets, batch_size)):
            yield chunk, self.images.batch(chunk), labels.to(self.device)


class PredictEvaluator:
    """One evaluation log from ``model.predict(x, seen-class mask)`` (the retrofit's inference)."""

    def __init__(
        self, model: PromptMethod, *, test: Any, exposure: Exposure, parallel: DataParallel, device: torch.device,
        batch_size: int, meta: Dict[str, Any],
    ) -> None:
        self.model, self.batch_size, self.parallel = model, int(batch_size), parallel
        self.subset = _TestSubset(test, exposure, parallel, device)
        self.log = EvaluationLog(meta=meta)

    @torch.no_grad()
    def __call__(self, kind: str, *, timestamp: int, samples_seen: int, session: int, final: bool) -> None:
        exposed, mask, _, indices, targets = self.subset.select(samples_seen)
        correct = torch.zeros(exposed, dtype=torch.long, device=self.subset.device)
        for _, images, labels in self.subset.batches(indices, targets, self.batch_size):
            correct += count_correct(self.model.predict(images, mask).argmax(dim=1), labels, exposed)[0]
        total = count_correct(targets, targets, exposed)[1].to(correct.device)
        counts = self.parallel.sum_counts(torch.stack([correct, total])).cpu()
        self.log.record(kind, timestamp=timestamp, samples_seen=samples_seen, session=session,
                        correct=counts[0], total=counts[1])

    def state_dict(self) -> Dict[str, Any]:
        return {"log": self.log.to_dict()}


class VariantEvaluator:
    """Every requested variant of one trained method, scored on the same test batches.

    Args:
        model: the trained method; forced and routed selections go through ``model(x, expert=ids, query=q)``.
        components: its REAR and TE2 (``benchmarks.ablation.components``): ``route`` and ``ensemble``.
        usage: the class x expert training counts (true experts, docs/diagnostics.md).
        variants: names from ``benchmarks.core.variants.VARIANTS``.
        member_names: names of the ensemble's members (online head, then one per decay).
        meta: the evaluation logs' meta (the variant's spec is added).
        timer: times the parts of each evaluation (``benchmarks.core.timer``).
        reuse: reuse the frozen features of a batch the previous evaluation had and skip a pass whose
            selection was already made (``False``: every pass at every evaluation, the reference the
            reuse is tested and profiled against).
        routers: the routing study's routers (``benchmarks.studies.router_set.ROUTERS``; ``components``
            then has ``route_all``, :class:`benchmarks.studies.router_components.WithRouters`): each one
            other than ``ridge`` replaces REAR in the routed variants (in ``full``, the method's own
            router), scored as ``<variant>@<router>``, with its routing accuracy.
        aggregations: TE2 aggregation rules (``fly_modules.ensemble.AGGREGATION_RULES``) each scored on
            the ensemble variants' members as ``<variant>~<rule>`` (the aggregation study).
        cka: at the last evaluation, the linear CKA between the trained experts' features of the forced
            passes (the CKA study, ``benchmarks.studies.cka``; the method needs ``common_features``).
        heads: subsets of the ensemble's heads (``benchmarks.core.head_sets``) each scored with the run's
            rule on the ensemble variants as ``<variant>#<subset>`` (the EMA-decay study).
    """

    def __init__(
        self, model: PromptMethod, components: ScoredComponents, usage: ExpertUsage, variants: Sequence[str], *, test: Any,
        exposure: Exposure, parallel: DataParallel, device: torch.device, batch_size: int,
        member_names: Sequence[str], meta: Dict[str, Dict[str, Any]], timer: PartTimer = NO_TIMER,
        reuse: bool = True, routers: Sequence[str] = (), aggregations: Sequence[str] = (), heads: Sequence[str] = (),
        cka: bool = False,
    ) -> None:
        self.model, self.components, self.usage = model, components, usage
        self.variants = [VARIANTS[name] for name in variants]
        self.batch_size, self.parallel, self.timer, self.reuse = int(batch_size), parallel, timer, reuse
        self.subset = _TestSubset(test, exposure, parallel, device)
        # Frozen features are reused only when the method splits its query and its backbone is frozen.
        frozen = not any(p.requires_grad for p in model.backbone.parameters())
        self.reuse_frozen = reuse and type(model).splits_query() and frozen
        self.prompted_rows = 0  # images through a prompted pass (what the plan's probe divides by)
        self.member_names = list(member_names)
        self.logs = {v.name: EvaluationLog(meta=meta[v.name]) for v in self.variants}
        self.member_logs = {
            v.name: [EvaluationLog() for _ in self.member_names] for v in self.variants if v.head == "ensemble"
        }
        self.routing: List[Dict[str, Any]] = []
        self.expert_use: Dict[str, Tensor] = {}  # own / rear: (experts,) test samples each selected, last evaluation
        self.expert_matrix: Optional[Dict[str, Any]] = None
        self.true_experts: Optional[List[int]] = None  # modal expert of each class at the end of the stream
        self.selections = sorted({v.selection for v in self.variants} | {"own"})
        self.ensemble_selections = {v.selection for v in self.variants if v.head == "ensemble"}
        self.per_class_counts = [v.name for v in self.variants] + [
            f"{name}/{member}" for name in self.member_logs for member in range(len(self.member_names))
        ]
        self.study_routers = list(routers)
        self.routable = [v for v in self.variants if v.selection == "routed" or v.name == "full"]
        self.router_logs = {f"{v.name}@{r}": EvaluationLog() for v in self.routable for r in routers if r != "ridge"}
        self.per_class_counts += list(self.router_logs)
        self.aggregations = list(aggregations)
        self.aggregation_logs = {f"{v.name}~{rule}": EvaluationLog() for v in self.variants if v.head == "ensemble"
                                 for rule in self.aggregations}
        self.per_class_counts += list(self.aggregation_logs)
        self.heads = {name: head_set_members(name, self.member_names) for name in heads}
        self.head_logs = {f"{v.name}#{name}": EvaluationLog() for v in self.variants if v.head == "ensemble"
                          for name in self.heads}
        self.per_class_counts += list(self.head_logs)
        alternatives = [r for r in routers if r != "ridge"]
        self.routing_counts = _ROUTING_COUNTS + tuple(f"{r}_{version}" for r in alternatives for version in ROUTING_VERSIONS)
        self.cka, self.cka_summary, self.cka_moments = bool(cka), None, None

    # -------------------------------------------------------------------------- one evaluation
    @torch.no_grad()
    def __call__(self, kind: str, *, timestamp: int, samples_seen: int, session: int, final: bool) -> None:
        exposed, mask, all_targets, indices, targets = self.subset.select(samples_seen)
        modal, trained_any, trained = self.usage.modal_expert(), self.usage.trained_any(), self.usage.trained_experts()
        first = self.usage.first_expert()
        if bool((modal[all_targets.to(modal.device)] < 0).any()):
            raise RuntimeError("an exposed test class has no training sample counted: the usage table is out of step")
        tally = _Tally(self.per_class_counts, exposed, self.usage.num_experts, self.subset.device, self.routing_counts)
        matrix_experts = torch.nonzero(trained).flatten().tolist() if final else []
        if final and self.cka:
            width = self.model.get_classifier().in_features
            self.cka_moments = ExpertFeatureMoments(len(matrix_experts) + 1, width, self.subset.device)
        batches = iter(self.subset.batches(indices, targets, self.batch_size))
        while True:
            with self.timer("eval/images"):
                batch = next(batches, None)
            if batch is None:
                break
            self._score_batch(*batch, mask, modal, first, trained_any, matrix_experts, tally)
        self.subset.images.next_evaluation()
        with self.timer("eval/counts"):
            counts = tally.unpack(self.parallel.sum_counts(tally.pack()))
            for name, log in self.logs.items():
                log.record(kind, timestamp=timestamp, samples_seen=samples_seen, session=session,
                           correct=counts[name].cpu(), total=counts["total"].cpu())
            for name, logs in self.member_logs.items():
                for member, log in enumerate(logs):
                    log.record(kind, timestamp=timestamp, samples_seen=samples_seen, session=session,
                               correct=counts[f"{name}/{member}"].cpu(), total=counts["total"].cpu())
            for name, log in {**self.router_logs, **self.aggregation_logs, **self.head_logs}.items():
                log.record(kind, timestamp=timestamp, samples_seen=samples_seen, session=session,
                           correct=counts[name].cpu(), total=counts["total"].cpu())
            self.routing.append(self._routing_entry(kind, samples_seen, counts, all_targets, trained_any, trained,
                                                    self.routing_counts))
            self.expert_use = {who: counts[f"{who}_use"].cpu() for who in _USE_COUNTS}
        if final:
            self.expert_matrix = expert_matrix_summary(counts["matrix"], counts["group_sizes"], trained)
            if self.cka_moments is not None:
                self.cka_moments.reduce(self.parallel)
                self.cka_summary, self.cka_moments = cka_matrices(self.cka_moments, matrix_experts), None
            self.true_experts = modal[:exposed].tolist()

    def _query(self, indices: Tensor, images: Tensor) -> QueryFeatures:
        if self.reuse_frozen:
            return self.model.query_from_frozen(self.subset.images.frozen(self.model, indices, images))
        return self.model.compute_query(images)

    def _prompted(self, images: Tensor, query: QueryFeatures, expert: Optional[Tensor],
                  made: List[MethodOutput]) -> MethodOutput:
        """``model(images, expert=expert, query=query)``, or a pass already ``made`` on this batch with the
        same selection for every sample (the same computation: its output is the one this pass gives)."""
        if self.reuse:
            selection = self.model.select(query.query, train=False, expert=expert)
            for output in made:
                if output.selection.shape == selection.shape and torch.equal(output.selection, selection):
                    return output
        output = self.model(images, expert=expert, query=query)
        made.append(output)
        self.prompted_rows += len(images)
        return output

    def _score_batch(
        self, indices: Tensor, images: Tensor, labels: Tensor, mask: Tensor, modal: Tensor, first: Tensor,
        trained_any: Tensor, matrix_experts: List[int], tally: "_Tally",
    ) -> None:
        model, timer = self.model, self.timer
        with timer("eval/query"):
            query = self._query(indices, images)
        with timer("eval/prompted"):
            true_expert = modal[labels]
            made: List[MethodOutput] = []
            outputs: Dict[str, MethodOutput] = {"own": self._prompted(images, query, None, made)}
            own_experts = model.expert_of(outputs["own"].selection)
            routed = self.components.route(query.router)
            rear_experts = own_experts if routed is None else routed.to(own_experts.device)
            if "routed" in self.selections:
                outputs["routed"] = outputs["own"] if routed is None else self._prompted(images, query, routed, made)
            if "oracle" in self.selections:
                outputs["oracle"] = self._prompted(images, query, true_expert, made)
        with timer("eval/scoring"):
            members = {s: self._member_scores(outputs[s], mask) for s in self.ensemble_selections}
            for variant in self.variants:
                if variant.head == "online":
                    scores = outputs[variant.selection].logits + mask
                else:
                    scores = self.components.ensemble.aggregate_members(members[variant.selection])
                    for member in range(len(self.member_names)):
                        tally.add_correct(f"{variant.name}/{member}", members[variant.selection][:, member], labels)
                    for rule in self.aggregations:
                        tally.add_correct(f"{variant.name}~{rule}", aggregate_logits(members[variant.selection], rule),
                                          labels)
                    for head, chosen in self.heads.items():
                        tally.add_correct(f"{variant.name}#{head}", self.components.ensemble.aggregate_members(
                            members[variant.selection][:, chosen]), labels)
                tally.add_correct(variant.name, scores, labels)
            tally.add_total(labels)
            tally.add_routing("own", own_experts, true_expert, first[labels], trained_any[labels])
            tally.add_routing("rear", rear_experts, true_expert, first[labels], trained_any[labels])
            tally.add_use("own", own_experts)
            tally.add_use("rear", rear_experts)
        if self.router_logs:
            with timer("eval/study_routers"):
                self._score_routers(images, query, labels, mask, (true_expert, first[labels], trained_any[labels]),
                                    outputs["own"], own_experts, made, tally)
        if not matrix_experts:
            return
        with timer("eval/forced"):
            tally.add_groups(true_expert)
            features = []
            for expert in matrix_experts:
                forced = self._prompted(images, query, torch.full_like(labels, expert), made)
                tally.add_forced(expert, forced.logits + mask, labels, true_expert)
                features.append(forced.features)
            if self.cka_moments is not None:
                self.cka_moments.add([*features, model.common_features(images)])

    def _score_routers(
        self, images: Tensor, query: QueryFeatures, labels: Tensor, mask: Tensor, truth: Tuple[Tensor, Tensor, Tensor],
        own: MethodOutput, own_experts: Tensor, made: List[MethodOutput], tally: "_Tally",
    ) -> None:
        """Each study router's selection in the routable variants; the method's own while it has no sample."""
        routed = self.components.route_all(query.router)
        for name in self.study_routers:
            if name == "ridge":
                continue
            experts = routed.get(name)
            output = own if experts is None else self._prompted(images, query, experts.to(own_experts.device), made)
            tally.add_routing(name, own_experts if experts is None else experts.to(own_experts.device), *truth)
            for variant in self.routable:
                if variant.head == "online":
                    scores = output.logits + mask
                else:
                    scores = self.components.ensemble.aggregate_members(self._member_scores(output, mask))
                tally.add_correct(f"{variant.name}@{name}", scores, labels)

    def _member_scores(self, output: MethodOutput, mask: Tensor) -> Tensor:
        """``(B, members, C)`` masked logits of the online head and each EMA copy of the samples' banks."""
        model, ensemble = self.model, self.components.ensemble
        members = model.transform_logits(ensemble.member_logits(output.features, model.bank_of(output.selection)),
                                         output.selection)
        return members + mask

    @staticmethod
    def _routing_entry(
        kind: str, samples_seen: int, counts: Dict[str, Tensor], targets: Tensor, trained_any: Tensor, trained: Tensor,
        names: Sequence[str],
    ) -> Dict[str, Any]:
        experts = max(int(trained.sum()), 1)
        entry: Dict[str, Any] = {"kind": kind, "samples_seen": samples_seen, "samples": int(targets.numel())}
        for name in names:
            entry[name] = int(counts[name])
        # Expected hits of an expert drawn uniformly from the trained ones.
        entry["chance_modal"] = entry["chance_first"] = targets.numel() / experts
        entry["chance_any"] = float(trained_any[targets.to(trained_any.device)].sum()) / experts
        return entry

    # ------------------------------------------------------------------------------- results
    def diagnostics(self, variant: str) -> Dict[str, Any]:
        """The diagnostics of ``variant``'s run record (JSON: plain floats and lists)."""
        spec = VARIANTS[variant]
        result: Dict[str, Any] = {
            "selection": spec.selection,
            "head": spec.head,
            "true_expert_of_class": self.true_experts,
            "routing": routing_summary(self.routing),
            "expert_matrix": self.expert_matrix,
        }
        if variant in self.member_logs:
            names = [*self.member_names, "ensemble"]
            result["members"] = member_summary(names, [*self.member_logs[variant], self.logs[variant]])
        if self.study_routers and any(v.name == variant for v in self.routable):
            result["routers"] = self._router_summary(variant)
        if self.aggregations and variant in self.member_logs:
            logs = [self.aggregation_logs[f"{variant}~{rule}"] for rule in self.aggregations]
            result["aggregations"] = member_summary(self.aggregations, logs)
        if self.cka_summary is not None:
            result["cka"] = self.cka_summary
        if self.heads and variant in self.member_logs:
            result["heads"] = member_summary(list(self.heads), [self.head_logs[f"{variant}#{h}"] for h in self.heads])
        return result

    def _router_summary(self, variant: str) -> Dict[str, Any]:
        """``{router: {"A_auc", "A_last", "routing", seconds}}`` of ``variant`` (``ridge``: REAR itself)."""
        alternatives = [name for name in self.study_routers if name != "ridge"]
        routing = routing_summary(self.routing, ("rear", *alternatives))
        seconds = getattr(self.components, "seconds", {})
        summary = {}
        for name in self.study_routers:
            log = self.logs[variant] if name == "ridge" else self.router_logs[f"{variant}@{name}"]
            summary[name] = {**member_summary([name], [log])[name], "routing": routing["rear" if name == "ridge" else name]}
            if name in seconds:
                timing = seconds[name]
                summary[name]["seconds_per_update"] = timing["update"] / max(timing["updates"], 1)
                summary[name]["seconds_per_routed_batch"] = timing["route"] / max(timing["routed_batches"], 1)
        return summary

    def state_dict(self) -> Dict[str, Any]:
        return {
            "logs": {name: log.to_dict() for name, log in self.logs.items()},
            "member_logs": {name: [log.to_dict() for log in logs] for name, logs in self.member_logs.items()},
            "routing": [dict(entry) for entry in self.routing],
            "expert_matrix": self.expert_matrix,
            "true_experts": self.true_experts,
            **({"router_logs": {name: log.to_dict() for name, log in self.router_logs.items()}} if self.router_logs else {}),
            **({"aggregation_logs": {name: log.to_dict() for name, log in self.aggregation_logs.items()}}
               if self.aggregation_logs else {}),
            **({"cka": self.cka_summary} if self.cka_summary is not None else {}),
            **({"head_logs": {name: log.to_dict() for name, log in self.head_logs.items()}} if self.head_logs else {}),
        }

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.logs = {name: EvaluationLog.from_dict(log) for name, log in state["logs"].items()}
        self.member_logs = {name: [EvaluationLog.from_dict(log) for log in logs]
                            for name, logs in state["member_logs"].items()}
        self.routing = [dict(entry) for entry in state["routing"]]
        self.expert_matrix = state["expert_matrix"]
        self.true_experts = state["true_experts"]
        self.cka_summary = state.get("cka")
        if self.router_logs:
            self.router_logs = {name: EvaluationLog.from_dict(log) for name, log in state["router_logs"].items()}
        if self.aggregation_logs:
            self.aggregation_logs = {name: EvaluationLog.from_dict(log)
                                     for name, log in state["aggregation_logs"].items()}
        if self.head_logs:
            self.head_logs = {name: EvaluationLog.from_dict(log) for name, log in state["head_logs"].items()}


_ROUTING_COUNTS = tuple(f"{who}_{version}" for who in ("own", "rear") for version in ROUTING_VERSIONS)
_USE_COUNTS = ("own", "rear")  # the selections whose experts' use is counted (the dashboards', run_log.py)


class _Tally:
    """The counts of one evaluation, packed into one tensor for the all-reduce over processes.

    Every rank creates the same entries in the same order (also a rank without test samples).
    """

    def __init__(self, per_class: Sequence[str], exposed: int, num_experts: int, device: torch.device,
                 routing: Sequence[str] = _ROUTING_COUNTS) -> None:
        self.exposed, self.num_experts = exposed, num_experts
        shapes: Dict[str, Tuple[int, ...]] = {name: (exposed,) for name in ("total", *per_class)}
        shapes.update({name: () for name in routing})
        shapes.update({f"{who}_use": (num_experts,) for who in _USE_COUNTS})
        shapes.update(matrix=(num_experts, num_experts), group_sizes=(num_experts,))
        self.counts = {name: torch.zeros(shape, dtype=torch.long, device=device) for name, shape in shapes.items()}

    def add_correct(self, name: str, scores: Tensor, labels: Tensor) -> None:
        self.counts[name] += count_correct(scores.argmax(dim=1), labels, self.exposed)[0]

    def add_total(self, labels: Tensor) -> None:
        self.counts["total"] += torch.bincount(labels, minlength=self.exposed)

    def add_routing(self, who: str, experts: Tensor, true_expert: Tensor, first: Tensor, trained_any: Tensor) -> None:
        self.counts[f"{who}_modal"] += (experts == true_expert).sum()
        self.counts[f"{who}_first"] += (experts == first).sum()
        self.counts[f"{who}_any"] += trained_any.gather(1, experts.unsqueeze(1)).sum()

    def add_use(self, who: str, experts: Tensor) -> None:
        self.counts[f"{who}_use"] += torch.bincount(experts, minlength=self.num_experts)

    def add_groups(self, true_expert: Tensor) -> None:
        self.counts["group_sizes"] += torch.bincount(true_expert, minlength=self.num_experts)

    def add_forced(self, expert: int, scores: Tensor, labels: Tensor, true_expert: Tensor) -> None:
        right = scores.argmax(dim=1) == labels
        self.counts["matrix"][:, expert] += torch.bincount(true_expert[right], minlength=self.num_experts)

    def pack(self) -> Tensor:
        return torch.cat([tensor.reshape(-1) for tensor in self.counts.values()])

    def unpack(self, flat: Tensor) -> Dict[str, Tensor]:
        out, offset = {}, 0
        for name, tensor in self.counts.items():
            out[name] = flat[offset : offset + tensor.numel()].view(tensor.shape)
            offset += tensor.numel()
        return out
