"""How often beam rows take part in a decode step while ordinary rows are running.

A beam request is k rows that step together; eight of them add 32 rows to every forward and would
slow the ordinary requests beside them to a third of their speed. While both kinds run, the engine
mixes ordinary-only steps (ordinary rows are a prefix of the batch; the beam rows sit the step out,
their cache and state untouched) with full steps, so that ordinary rows keep `share` of the speed
they would have alone. Every mixed step earns (1/share - 1) x the time of an ordinary-only step;
a full step spends what it took beyond one. Both step times are measured as the batch runs,
so the rule holds whatever the model, the machine or the mix.
"""

from __future__ import annotations

_SMOOTHING = 0.3  # weight of the newest step time in the moving averages


class BeamBudget:
    def __init__(self, share: float):
        if not 0.0 <= share < 1.0:
            raise ValueError(f"ordinary_share_beside_beams must be in [0, 1), got {share}")
        self.share = share
        self.credit = 0.0  # seconds of slowdown the ordinary rows can still absorb
        self.ordinary_s: float | None = None  # moving averages of the two kinds of mixed step
        self.full_s: float | None = None

    def full_step(self) -> bool:
        """Whether the next step, with both kinds of rows running, includes the beam rows."""
        if self.share == 0.0:
            return True
        if self.ordinary_s is None:
            return False  # measure an ordinary-only step first
        return self.credit >= self._extra()

    def record(self, full: bool, seconds: float) -> None:
        """The time of a mixed step just taken (not of steps with one kind of row only)."""
        if self.share == 0.0:
            return
        if full:
            self.full_s = _average(self.full_s, seconds)
            spent = max(seconds - self.ordinary_s, 0.0)  # full_step() measured an ordinary-only step first
        else:
            self.ordinary_s = _average(self.ordinary_s, seconds)
            spent = 0.0
        earned = (1.0 / self.share - 1.0) * self.ordinary_s  # every step, full ones too
        # no saving up beyond one full step: a burst of full steps would stall the ordinary rows
        self.credit = min(self.credit + earned - spent, self._extra() + earned)

    def _extra(self) -> float:
        """What a full step is expected to cost beyond an ordinary-only one."""
        if self.full_s is None or self.ordinary_s is None:
            return 0.0
        return max(self.full_s - self.ordinary_s, 0.0)


def _average(current: float | None, sample: float) -> float:
    return sample if current is None else (1.0 - _SMOOTHING) * current + _SMOOTHING * sample
