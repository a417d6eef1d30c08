"""TE2's aggregation rules against the official trainers' ``_ensemble_logits`` (the stand-in checkout):
every official rule is one of ours, and a change on either side shows up as a disagreement."""

from __future__ import annotations

import shutil

import pytest
from fidelity_stand_in import FAKE_FLYGCL

from benchmarks.core import reference_checkout as ref
from benchmarks.fidelity import aggregations
from fly_modules import AGGREGATION_RULES


def _rows(path):
    checkout = ref.load_checkout(str(path), aggregations.TRAINERS)
    return aggregations.compare_rules({name: checkout.trainers[name] for name in aggregations.TRAINERS})


def test_every_official_rule_of_every_trainer_is_computed_by_one_of_ours():
    rows = _rows(FAKE_FLYGCL)
    assert set(aggregations.OFFICIAL_RULES.values()) <= set(AGGREGATION_RULES)
    assert {(r.trainer, r.official, r.case) for r in rows} == {
        (t, o, c) for t in aggregations.TRAINERS for o in aggregations.OFFICIAL_RULES
        for c in ("masked", "unmasked", "positive")}
    assert all(row.agrees for row in rows), [row for row in rows if not row.agrees]


def test_our_min_entropy_is_not_the_official_one(monkeypatch):
    """The rule the paper's "Min Entropy" row ran is logit_min_entropy: ours of the same name disagrees."""
    monkeypatch.setitem(aggregations.OFFICIAL_RULES, "min_entropy", "min_entropy")
    rows = _rows(FAKE_FLYGCL)
    wrong = {(r.official, r.case) for r in rows if not r.agrees}
    assert wrong == {("min_entropy", case) for case in ("masked", "unmasked", "positive")}


def test_a_change_planted_in_the_official_rule_shows_up(tmp_path):
    planted = tmp_path / "flygcl"
    shutil.copytree(FAKE_FLYGCL, planted)
    trainer = planted / "methods" / "dualprompt.py"
    text = trainer.read_text()
    assert "torch.log(stacked + 1e-8)" in text
    # the entropy of the softmax even for the raw-logit rule: what our own min_entropy selects by
    trainer.write_text(text.replace("torch.log(stacked + 1e-8)", "torch.log(stacked.softmax(dim=1) + 1e-8)"))
    rows = _rows(planted)
    wrong = {(r.official, r.case) for r in rows if not r.agrees}
    assert {("min_entropy", "positive"), ("min_entropy", "unmasked")} <= wrong
    assert all(official.endswith("min_entropy") for official, _ in wrong)


def test_a_checkout_without_the_trainers_ends_in_one_line(tmp_path, capsys):
    assert aggregations.main(["--flygcl", str(tmp_path)]) == 2
    error = capsys.readouterr().err.strip()
    assert len(error.splitlines()) == 1 and "FlyGCL" in error


@pytest.mark.parametrize("case", ["masked", "unmasked", "positive"])
def test_the_cases_have_what_they_are_named_for(case):
    members = aggregations.member_cases(samples=8)[case]
    assert members.shape == (8, 3, 10)
    if case == "masked":
        assert bool(members[..., 7:].isinf().all()) and bool(members[..., :7].isfinite().all())
    elif case == "positive":
        assert bool((members > 0).all())
    else:
        assert bool(members.isfinite().all()) and bool((members < 0).any())
