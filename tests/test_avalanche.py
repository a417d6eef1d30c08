"""Avalanche plugin: an online Avalanche stream, ``Naive`` with ``FlyPlugin``, equal to the retrofit driven by hand."""

from __future__ import annotations

import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import pytest
import torch

avalanche = pytest.importorskip("avalanche", reason='needs the avalanche extra: pip install -e ".[avalanche]"')
timm = pytest.importorskip("timm")

from avalanche.benchmarks.scenarios.online import split_online_stream  # noqa: E402
from avalanche.benchmarks.scenarios.supervised import class_incremental_benchmark  # noqa: E402
from avalanche.core import SupervisedPlugin  # noqa: E402
from avalanche.evaluation.metrics import accuracy_metrics  # noqa: E402
from avalanche.training import Naive  # noqa: E402
from avalanche.training.plugins import EvaluationPlugin  # noqa: E402
from fly_modules.adapters import generic, reference  # noqa: E402
from fly_modules.adapters.avalanche import FlyPlugin  # noqa: E402
from fold_log import FoldLog  # noqa: E402

from benchmarks.data import make_synthetic_train_test  # noqa: E402
from benchmarks.methods import create_method  # noqa: E402
from fly_modules import SampleBudgetSchedule, SessionSchedule, batch_seen_class_mask, class_mask  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CLASSES, EMBED, MB, EXP_SIZE = 6, 32, 4, 8
ROUTER = dict(expansion_dim=128, ridge=1e-2, seed=0)
# Online experiences that end a session (3 per original experience); the test stream is evaluated after
# them. Avalanche 0.6.0 sets is_last_subexp on none of them (24 samples split evenly into 8s).
SESSION_ENDS = EVAL_AFTER = (2, 5)
METHOD_KWARGS = {
    "dualprompt": dict(num_experts=2, pool_size=4, g_prompt_length=2, e_prompt_length=3),
    "mvp": dict(num_experts=2, g_prompt_length=2, e_prompt_length=3),
    "flyprompt": dict(num_experts=2, prompt_layers=(0, 1), prompt_length=2, router_expansion_dim=128, router_ridge=1e-2),
}



@pytest.fixture(scope="module")
def scenario():
    """6 generated classes in 2 experiences, split into an online stream of 8-sample experiences."""
    train, test = make_synthetic_train_test(CLASSES, train_per_class=8, test_per_class=3, seed=0)
    bench = class_incremental_benchmark({"train": train, "test": test}, class_order=list(range(CLASSES)), num_experiences=2)
    online = list(split_online_stream(bench.train_stream, EXP_SIZE, shuffle=True, seed=0, access_task_boundaries=True))
    return online, list(bench.test_stream), bench


def make_method(name: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    backbone = timm.create_model(
        "vit_tiny_patch16_224", pretrained=False, num_classes=0, img_size=32, patch_size=8, embed_dim=EMBED,
        depth=4, num_heads=2,
    )
    torch.manual_seed(seed + 100)
    return create_method(name, backbone, CLASSES, **METHOD_KWARGS[name])


def batches(dataset, size: int) -> List[Tuple[torch.Tensor, torch.Tensor]]:
    """The minibatches a non-shuffling DataLoader yields: consecutive items, default collate."""
    items = [dataset[i] for i in range(len(dataset))]
    out = []
    for start in range(0, len(items), size):
        chunk = items[start:start + size]
        out.append((torch.stack([c[0] for c in chunk]), torch.as_tensor([int(c[1]) for c in chunk])))
    return out


def assert_same_state(got: torch.nn.Module, want: torch.nn.Module) -> None:
    """Equal ``state_dict``s, tensors bit for bit (extra state compared with ``==``)."""
    got_state, want_state = got.state_dict(), want.state_dict()
    assert list(got_state) == list(want_state)
    for key, value in want_state.items():
        same = torch.equal(got_state[key], value) if isinstance(value, torch.Tensor) else got_state[key] == value
        assert same, key


def spy_session_ends(method: torch.nn.Module) -> List[int]:
    """Record the sessions ``method.on_session_end`` is called with (L2P and HiDe act on them)."""
    calls: List[int] = []
    hook = method.on_session_end

    def on_session_end(session: int) -> None:
        calls.append(session)
        hook(session)

    method.on_session_end = on_session_end
    return calls


def make_schedule(kind: str):
    return "experience" if kind == "experience" else SampleBudgetSchedule(12, 2)


class Recorder(SupervisedPlugin, supports_distributed=False):
    """Placed after FlyPlugin: the training minibatches and the evaluation outputs the strategy saw."""

    def __init__(self) -> None:
        super().__init__()
        self.train_batches: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self.eval_outputs: List[torch.Tensor] = []

    def after_training_iteration(self, strategy, **kwargs):
        self.train_batches.append((strategy.mb_x.clone(), strategy.mb_y.clone()))

    def after_eval_forward(self, strategy, **kwargs):
        self.eval_outputs.append(strategy.mb_output.clone())


def run_plugin(case: Dict[str, Any], online, test_stream) -> Dict[str, Any]:
    method = make_method(case["name"])
    optimizer = torch.optim.Adam(method.trainable_parameters(), lr=method.default_lr)
    plugin = FlyPlugin(
        router=case["router"], ensemble=case["ensemble"], schedule=make_schedule(case["kind"]),
        train_mask=case["train_mask"], **ROUTER,
    )
    recorder = Recorder()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No loggers specified")
        evaluator = EvaluationPlugin(accuracy_metrics(stream=True), loggers=[])
        warnings.filterwarnings("error", message=".*incompatible callbacks.*")
        strategy = Naive(
            model=method, optimizer=optimizer, train_mb_size=MB, train_epochs=1, eval_mb_size=5,
            plugins=[plugin, recorder], evaluator=evaluator,
        )
    accuracies, session_ends = [], spy_session_ends(method)
    for index, experience in enumerate(online):
        strategy.train(experience, eval_streams=[], shuffle=False)
        if index in EVAL_AFTER:
            accuracies.append(strategy.eval(test_stream)["Top1_Acc_Stream/eval_phase/test_stream"])
    return dict(method=method, handle=plugin.handle, plugin=plugin, recorder=recorder, accuracies=accuracies,
                criterion=strategy._criterion, session_ends=session_ends)


def run_manual(case: Dict[str, Any], online, test_stream) -> Dict[str, Any]:
    """The same run through ``reference.retrofit`` and a hand-written loop (what Naive does)."""
    method = make_method(case["name"])
    optimizer = torch.optim.Adam(method.trainable_parameters(), lr=method.default_lr)
    kind, train_mask = case["kind"], case["train_mask"]
    schedule = make_schedule(kind)
    handle = reference.retrofit(
        method, router=case["router"], ensemble=case["ensemble"], schedule=None if kind == "experience" else schedule,
        **ROUTER,
    )
    if kind == "experience":
        handle.schedule = SessionSchedule(method.num_experts)
    session, seen, trained, scores, accuracies = -1, None, [], [], []
    session_ends = spy_session_ends(method)

    def evaluate() -> None:
        method.eval()
        method.on_evaluate()
        correct = total = 0
        for experience in test_stream:
            for x, y in batches(experience.dataset, 5):
                predicted = method.predict(x, class_mask(seen, CLASSES))
                scores.append(predicted.log() if case["ensemble"] else predicted)
                correct += int((predicted.argmax(1) == y).sum())
                total += len(y)
        accuracies.append(correct / total)
        method.train()

    method.train()
    for index, experience in enumerate(online):
        if experience.is_first_subexp:
            session += 1
            handle.start_session(session)
        for x, y in batches(experience.dataset, MB):
            seen = y.unique() if seen is None else torch.cat([seen, y]).unique()
            output = method(x)
            mask = {None: None, "batch": batch_seen_class_mask(y, CLASSES), "seen": class_mask(seen, CLASSES)}[train_mask]
            loss = method.loss(output, y, mask)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            method.on_optimizer_step(output)
            handle.update_ensemble()
            method.on_batch_end(x, y, output)
            handle.end_batch(len(y))
            trained.append((x, y))
        if index in SESSION_ENDS:
            method.on_session_end(session)
        if index in EVAL_AFTER:
            evaluate()
    return dict(method=method, handle=handle, trained=trained, scores=scores, accuracies=accuracies, seen=seen,
                session_ends=session_ends)


CASES = {
    # one expert per original experience (task boundaries of the online stream), plain Avalanche loss
    "dualprompt-session": dict(name="dualprompt", kind="experience", train_mask=None, router=True, ensemble=True),
    # task-free sample budget, the reference's batch mask, a loss that is not cross-entropy (AFS + MCR)
    "mvp-budget": dict(name="mvp", kind="budget", train_mask="batch", router=True, ensemble=True),
    # nothing retrofitted: FlyPrompt's built-in router and ensemble, driven by the method's own hooks
    "flyprompt-builtin": dict(name="flyprompt", kind="budget", train_mask="batch", router=False, ensemble=False),
}


@pytest.mark.parametrize("case", list(CASES))
def test_plugin_equals_the_retrofit_driven_by_hand(case, scenario, monkeypatch):
    online, test_stream, _ = scenario
    case = CASES[case]
    folds = FoldLog(monkeypatch)
    got = run_plugin(case, online, test_stream)
    plugin_folds = folds.take()
    want = run_manual(case, online, test_stream)
    # the routers (the retrofit's, FlyPrompt's own) added their rows in the same updates: the same summation
    # history, so the bit-for-bit comparisons below hold on any CPU
    assert folds.take() == plugin_folds
    # the strategy trained on exactly the minibatches of the hand-written loop
    assert len(got["recorder"].train_batches) == len(want["trained"]) == CLASSES * 8 // MB
    for (gx, gy), (wx, wy) in zip(got["recorder"].train_batches, want["trained"]):
        assert torch.equal(gx, wx) and torch.equal(gy, wy)
    # router statistics and ensemble banks: bit for bit
    for part in ("router", "ensemble"):
        assert (getattr(got["handle"], part) is None) == (not case[part])
        if case[part]:
            assert_same_state(getattr(got["handle"], part), getattr(want["handle"], part))
    if case["router"]:
        assert got["handle"].router.num_samples == CLASSES * 8
    assert got["handle"].current_expert == want["handle"].current_expert == 1
    assert torch.equal(got["plugin"].seen_classes, want["seen"])
    # the trained methods are identical (prompts, keys, head, method statistics, FlyPrompt's router)
    assert_same_state(got["method"], want["method"])
    # evaluation (mid-stream with unseen classes masked, and at the end): the strategy's outputs are the
    # routed ensemble's scores (log of the retrofit's predict), and Avalanche's accuracy matches
    assert len(got["recorder"].eval_outputs) == len(want["scores"]) == len(EVAL_AFTER) * 2 * 2  # 2 test experiences of 9 samples, batches of 5
    for g, w in zip(got["recorder"].eval_outputs, want["scores"]):
        assert torch.equal(g, w)
    assert got["accuracies"] == pytest.approx(want["accuracies"])
    assert got["session_ends"] == want["session_ends"] == [0, 1]
    # the strategy's own criterion is back after training
    assert type(got["criterion"]).__name__ == "CrossEntropyLoss"


# ------------------------------------------------------------------------ a generic-adapter model
class _Body(torch.nn.Module):
    """Prompt selection by key match, restricted to ``expert`` when given (the seam the router uses)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.keys = torch.nn.Parameter(torch.randn(2, dim))
        self.prompts = torch.nn.Parameter(torch.zeros(2, dim))
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, query: torch.Tensor, expert: Optional[torch.Tensor] = None) -> torch.Tensor:
        if expert is None:
            expert = (query @ self.keys.T).argmax(1)
        return torch.relu(self.proj(query + self.prompts[expert]))


class ToyPrompted(torch.nn.Module):
    """Not a seam-contract method: a frozen query module, a route module and a head (generic adapter)."""

    def __init__(self, dim: int = 16) -> None:
        super().__init__()
        self.query = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 32 * 32, dim)).requires_grad_(False)
        self.body = _Body(dim)
        self.head = torch.nn.Linear(dim, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(self.query(x)))


def toy_and_handle(schedule):
    torch.manual_seed(5)
    model = ToyPrompted()
    handle = generic.retrofit(
        model, num_experts=2, query_module=model.query, route_module=model.body, route_kwarg="expert",
        schedule=schedule, **ROUTER,
    )
    return model, handle


def test_generic_retrofit_with_two_epochs_equals_the_loop_by_hand(scenario):
    """``from_retrofit`` on a generic-adapter model; the second epoch trains but adds nothing to the router."""
    online, test_stream, _ = scenario
    model, handle = toy_and_handle(SessionSchedule(2))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    recorder = Recorder()
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No loggers specified")
        strategy = Naive(
            model=model, optimizer=optimizer, train_mb_size=MB, train_epochs=2, eval_mb_size=5,
            plugins=[FlyPlugin.from_retrofit(handle, train_mask="seen"), recorder], evaluator=EvaluationPlugin(),
        )
    for index, experience in enumerate(online):
        strategy.train(experience, eval_streams=[], shuffle=False)
        if index in EVAL_AFTER:
            strategy.eval(test_stream)
            assert handle.logit_mask is None  # the plugin's evaluation mask is not left behind

    ref_model, ref = toy_and_handle(SessionSchedule(2))
    ref_optimizer = torch.optim.SGD(ref_model.parameters(), lr=0.1)
    session, seen, want = -1, None, []
    for index, experience in enumerate(online):
        ref_model.train()
        if experience.is_first_subexp:
            session += 1
            ref.start_session(session)
        for epoch in range(2):
            for x, y in batches(experience.dataset, MB):
                seen = y.unique() if seen is None else torch.cat([seen, y]).unique()
                loss = torch.nn.functional.cross_entropy(ref_model(x) + class_mask(seen, CLASSES), y)
                ref_optimizer.zero_grad()
                loss.backward()
                ref_optimizer.step()
                ref.update_ensemble()
                if epoch == 0:
                    ref.end_batch(len(y))
                else:
                    ref.discard_batch()  # a repeat: its query was counted in the first epoch
        if index in EVAL_AFTER:
            ref_model.eval()
            ref.set_logit_mask(class_mask(seen, CLASSES))
            with torch.no_grad():
                want += [ref_model(x) for test_exp in test_stream for x, _ in batches(test_exp.dataset, 5)]

    assert handle.router.num_samples == ref.router.num_samples == CLASSES * 8  # one count per sample
    assert handle.current_expert == 1
    assert_same_state(handle.router, ref.router)
    assert_same_state(handle.ensemble, ref.ensemble)
    assert_same_state(model, ref_model)
    assert len(recorder.eval_outputs) == len(want) == len(EVAL_AFTER) * 2 * 2
    assert torch.isinf(recorder.eval_outputs[0]).any()  # mid-stream: unseen classes masked
    for g, w in zip(recorder.eval_outputs, want):
        assert torch.equal(g, w)


def test_plugin_logs_routing_accuracy_and_expert_use_after_every_evaluation(scenario):
    """``log_to``: after each ``strategy.eval``, at the stream samples trained, what the router chose for the
    test stream scored against the expert that trained each class (classes 0-2: expert 0, 3-5: expert 1)."""
    online, test_stream, _ = scenario
    model, handle = toy_and_handle(SessionSchedule(2))
    written = []
    plugin = FlyPlugin.from_retrofit(handle).log_to(lambda tag, value, step: written.append((tag, value, step)))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No loggers specified")
        strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), train_mb_size=MB,
                         eval_mb_size=5, plugins=[plugin], evaluator=EvaluationPlugin())
    x, y = (torch.cat(parts) for parts in zip(*(b for e in test_stream for b in batches(e.dataset, 5))))
    for index, experience in enumerate(online):
        strategy.train(experience, eval_streams=[], shuffle=False)
        if index not in EVAL_AFTER:
            continue
        written.clear()
        strategy.eval(test_stream)
        with torch.no_grad():
            experts = handle.route(model.query(x))
        known = y < 3 * (1 + EVAL_AFTER.index(index))  # the classes trained so far
        step = (index + 1) * EXP_SIZE
        got = {tag: value for tag, value, at in written if at == step}
        assert len(got) == len(written) == 5
        assert got["fly/routing_accuracy"] == pytest.approx((experts == y // 3)[known].double().mean().item())
        assert got["fly/expert_share/1"] == pytest.approx((experts == 1).double().mean().item())
        assert got["fly/trained_share/1"] == pytest.approx(0.0 if index == EVAL_AFTER[0] else 0.5)


def test_session_schedule_needs_task_boundaries(scenario):
    bench = scenario[2]
    hidden = next(iter(split_online_stream(bench.train_stream, EXP_SIZE, shuffle=False)))  # task-free stream
    model, handle = toy_and_handle(SessionSchedule(2))
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="No loggers specified")
        strategy = Naive(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), train_mb_size=MB,
                         plugins=[FlyPlugin.from_retrofit(handle)], evaluator=EvaluationPlugin())
    with pytest.raises(RuntimeError, match=r"access_task_boundaries=True"):
        strategy.train(hidden, eval_streams=[])


# ------------------------------------------------------------------------------ API and packaging
def test_plugin_defines_only_official_callbacks_and_checks_its_options():
    plugin = FlyPlugin()
    callbacks = {name for name in dir(plugin) if name.startswith(("before", "after"))}
    assert callbacks <= set(dir(SupervisedPlugin))
    assert FlyPlugin.supports_distributed is False
    with pytest.raises(ValueError, match="schedule"):
        FlyPlugin(schedule="batch")
    with pytest.raises(ValueError, match="train_mask"):
        FlyPlugin(train_mask="all")
    with pytest.raises(TypeError, match="optimizer"):
        FlyPlugin(optimizer=torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1))
    with pytest.raises(TypeError, match="Retrofit"):
        FlyPlugin.from_retrofit(object())


def test_importing_fly_modules_does_not_import_avalanche(tmp_path):
    code = (
        "import sys, fly_modules, fly_modules.adapters, fly_modules.adapters.reference\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'avalanche'))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
    import fly_modules.adapters

    assert fly_modules.adapters.avalanche.FlyPlugin is FlyPlugin  # the lazy attribute


def test_missing_avalanche_names_the_extra(monkeypatch):
    import importlib

    monkeypatch.delitem(sys.modules, "fly_modules.adapters.avalanche")
    monkeypatch.setitem(sys.modules, "avalanche.core", None)
    with pytest.raises(ImportError, match=r'pip install "fly-modules\[avalanche\]"'):
        importlib.import_module("fly_modules.adapters.avalanche")


def test_missing_distutils_on_python_312_names_setuptools(monkeypatch):
    import importlib

    class NoDistutils:  # what importing Avalanche does on Python >= 3.12 without setuptools
        def find_spec(self, name, path=None, target=None):
            if name == "avalanche.core":
                raise ModuleNotFoundError("No module named 'distutils'", name="distutils")
            return None

    monkeypatch.delitem(sys.modules, "fly_modules.adapters.avalanche")
    monkeypatch.delitem(sys.modules, "avalanche.core")
    monkeypatch.setattr(sys, "meta_path", [NoDistutils(), *sys.meta_path])
    with pytest.raises(ImportError, match="install setuptools"):
        importlib.import_module("fly_modules.adapters.avalanche")


def test_documented_avalanche_example_runs(capsys):
    text = (ROOT / "docs" / "adapters.md").read_text()
    code = re.search(r"```python\n(.*?)```", text.split("## The Avalanche plugin", 1)[1], re.S).group(1)
    exec(compile(code, "docs/adapters.md (The Avalanche plugin)", "exec"), {"__name__": "__docs__"})
    out = capsys.readouterr().out
    accuracy, samples = re.search(r"accuracy (\d\.\d+), router samples (\d+)", out).groups()
    assert 0.0 <= float(accuracy) <= 1.0 and int(samples) == 4 * 16
