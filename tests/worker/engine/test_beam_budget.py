"""The beam budget keeps ordinary rows at their share of the speed they have alone, without starving beams."""

from __future__ import annotations

import pytest

from gateway.config import load_settings
from worker.engine.beam_budget import BeamBudget


def _run(budget: BeamBudget, ordinary_s: float, full_s: float, steps: int = 2000) -> tuple[float, int]:
    """Ordinary rows' kept share and the number of full steps over `steps` mixed steps of fixed cost."""
    spent, full_steps = 0.0, 0
    for _ in range(steps):
        full = budget.full_step()
        spent += full_s if full else ordinary_s
        full_steps += full
        budget.record(full, full_s if full else ordinary_s)
    return steps * ordinary_s / spent, full_steps


@pytest.mark.parametrize("share", [0.5, 0.75, 0.9])
@pytest.mark.parametrize("ordinary_s,full_s", [(0.09, 0.28), (0.05, 0.06), (0.02, 0.5)])
def test_ordinary_rows_keep_their_share_and_beams_still_step(share, ordinary_s, full_s):
    kept, full_steps = _run(BeamBudget(share), ordinary_s, full_s)
    assert share - 0.01 <= kept
    assert full_steps > 0
    # and the budget is used, not hoarded: the kept share is close to the target
    if full_s - ordinary_s > 0.05:
        assert kept <= share + 0.05


def test_share_zero_steps_beams_every_time():
    _, full_steps = _run(BeamBudget(0.0), 0.1, 0.3, steps=50)
    assert full_steps == 50


@pytest.mark.parametrize("share", [-0.1, 1.0, 1.5])
def test_share_out_of_range_is_refused(share):
    with pytest.raises(ValueError, match="ordinary_share_beside_beams"):
        BeamBudget(share)


@pytest.mark.parametrize("share", [-0.5, 1.0])
def test_config_refuses_a_share_out_of_range(tmp_path, share):
    config = tmp_path / "sluice.toml"
    config.write_text(f"[[models]]\nordinary_share_beside_beams = {share}\n")
    with pytest.raises(SystemExit, match="ordinary_share_beside_beams"):
        load_settings(str(config))
    config.write_text("[[models]]\nordinary_share_beside_beams = 0.6\n")
    assert load_settings(str(config)).models[0].ordinary_share_beside_beams == 0.6
