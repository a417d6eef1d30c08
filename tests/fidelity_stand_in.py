"""What the fidelity tests share: the stand-in FlyGCL checkout and a small setting on it."""

from pathlib import Path

from benchmarks.fidelity.setting import Setting

FAKE_FLYGCL = Path(__file__).parent / "fixtures" / "fake_flygcl"
SMALL = Setting(classes=4, train_per_class=8, test_per_class=2, batch_size=8, online_iter=2, num_sessions=2,
                num_experts=2, eval_period=16)
