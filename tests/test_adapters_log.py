"""``handle.log_to(writer)``: the documented example (read back by TensorBoard's reader), the counts against a
hand count of what the router chose, the duck-typed writers, the refusals and the state of a resumed loop."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from fly_modules._validation import InvalidParameterError

ROOT = Path(__file__).resolve().parents[1]


def docs_example() -> str:
    """The Python block of the section "Logging to TensorBoard or W&B" of docs/diagnostics.md."""
    section = (ROOT / "docs" / "diagnostics.md").read_text().split("## Logging to TensorBoard or W&B", 1)[1]
    blocks = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], re.S)
    assert len(blocks) == 1, f"expected one Python block, found {len(blocks)}"
    return blocks[0]


class Recorded:
    """A writer with ``add_scalar`` (what a ``SummaryWriter`` offers), keeping what it was given."""

    def __init__(self, *args) -> None:
        self.scalars = []

    def add_scalar(self, tag, value, step) -> None:
        self.scalars.append((tag, value, step))

    def close(self) -> None:
        pass


def run_example(writer=Recorded) -> dict:
    """The documented example, its ``SummaryWriter`` replaced by ``writer``; its namespace."""
    code = docs_example().replace("from torch.utils.tensorboard import SummaryWriter", "")
    namespace = {"__name__": "__docs__", "SummaryWriter": writer}
    exec(compile(code, "docs/diagnostics.md", "exec"), namespace)
    return namespace


@pytest.mark.skipif(importlib.util.find_spec("tensorboard") is None,
                    reason='tensorboard is not installed (pip install -e ".[tensorboard]")')
def test_documented_example_writes_events_tensorboard_reads_back(tmp_path, monkeypatch, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.chdir(tmp_path)
    code = docs_example()
    exec(compile(code, "docs/diagnostics.md", "exec"), {"__name__": "__docs__"})
    printed = eval(capsys.readouterr().out.strip().splitlines()[-1])  # the dict the example prints
    events = EventAccumulator(str(tmp_path / "runs" / "retrofit"))
    events.Reload()
    assert set(events.Tags()["scalars"]) == set(printed) >= {"fly/routing_accuracy", "fly/expert_share/1"}
    for tag, value in printed.items():
        (event,) = events.Scalars(tag)
        assert (event.step, event.value) == (320, pytest.approx(value))


def test_counts_are_what_the_router_chose_against_the_classes_experts():
    example = run_example()
    model, handle, log, centres = example["model"], example["handle"], example["log"], example["centres"]
    torch.manual_seed(1)
    labels = torch.arange(4).repeat(16)
    with torch.no_grad():
        model(centres[labels] + 2 * torch.randn(len(labels), 8))  # noisier: some samples routed astray
    routed = handle.record.routed
    log.add_inference(labels)
    written = log.write(step=400)
    truth = labels // 2  # expert 0 trained classes 0 and 1, expert 1 classes 2 and 3
    assert written["fly/routing_accuracy"] == pytest.approx((routed == truth).double().mean().item())
    shares = torch.bincount(routed, minlength=2).double() / len(routed)
    assert [written[f"fly/expert_share/{e}"] for e in (0, 1)] == pytest.approx(shares.tolist())
    assert [written[f"fly/trained_share/{e}"] for e in (0, 1)] == [0.5, 0.5]
    assert log.write_scalar.__self__.scalars[-len(written):] == [(tag, value, 400) for tag, value in written.items()]
    log.add_inference(labels)  # no routed forward since the last one counted: nothing is
    assert set(log.write(step=401)) == {"fly/trained_share/0", "fly/trained_share/1"}
    # Given expert labels replace the training counts' (here: all wrong for expert 1's samples).
    with torch.no_grad():
        model(centres[labels])
    log.add_inference(true_experts=torch.zeros_like(labels))
    assert log.write(step=402)["fly/routing_accuracy"] == pytest.approx((handle.record.routed == 0).double().mean().item())


def test_a_callable_is_a_writer_and_the_training_counts_survive_state_dict():
    example = run_example()
    handle, log = example["handle"], example["log"]
    written = []
    fresh = handle.log_to(lambda tag, value, step: written.append((tag, value, step)), prefix="eval")
    fresh.load_state_dict(log.state_dict())
    assert torch.equal(fresh.trained, log.trained) and fresh.trained is not log.trained
    fresh.write(step=7)
    assert written == [("eval/trained_share/0", 0.5, 7), ("eval/trained_share/1", 0.5, 7)]


def test_refusals_are_one_line_and_name_what_was_expected():
    example = run_example()
    handle, log = example["handle"], example["log"]
    with pytest.raises(InvalidParameterError, match="add_scalar"):
        handle.log_to(42)
    with pytest.raises(InvalidParameterError, match="1-D integer tensor"):
        log.add_training(torch.zeros(3))
    with torch.no_grad():
        example["model"](torch.randn(5, 8))
    with pytest.raises(InvalidParameterError, match=r"expected \(5,\) labels"):
        log.add_inference(torch.zeros(4, dtype=torch.long))
    with pytest.raises(InvalidParameterError, match="shape"):
        log.load_state_dict({"trained": torch.zeros(3, 2, dtype=torch.long)})
    with pytest.raises(InvalidParameterError, match="step"):
        log.write(step=-1)
