"""The numbers a setting may take, as numbers: a knob's range (``starpo/knobs.py``), a job setting's
(``jobs/flags.py``) and a sentinel rule's adjustments (``sentinel.py``) check against the same :class:`Range`, and
its text in an error message or the docs' knob table is made from those numbers."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Range:
    """From ``low`` to ``high`` (None: unbounded on that side), each end included unless ``*_open``."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value) -> bool:
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    @property
    def is_interval(self) -> bool:
        return self.low is not None and self.high is not None

    def __str__(self) -> str:
        if self.is_interval:
            return (
                f"{'(' if self.low_open else '['}{_number(self.low)}, "
                f"{_number(self.high)}{')' if self.high_open else ']'}"
            )
        if self.low is not None:
            return f"{'>' if self.low_open else '>='} {_number(self.low)}"
        return f"{'<' if self.high_open else '<='} {_number(self.high)}"


def _number(value: float) -> str:
    """A bound as people write it: 2**32 rather than 4294967296."""
    if isinstance(value, int) and value >= 2**16 and value & (value - 1) == 0:
        return f"2**{value.bit_length() - 1}"
    return str(value)


NON_NEGATIVE = Range(0)
POSITIVE = Range(0, low_open=True)
NON_POSITIVE = Range(high=0)
AT_LEAST_ONE = Range(1)
AT_LEAST_TWO = Range(2)
ABOVE_ONE = Range(1, low_open=True)
UNIT_INTERVAL = Range(0, 1)  # [0, 1]
BELOW_ONE = Range(0, 1, high_open=True)  # [0, 1): a share that must leave something
ABOVE_ZERO_TO_ONE = Range(0, 1, low_open=True)  # (0, 1]: a share that must keep something, a discount
SEEDS = Range(0, 2**32, high_open=True)  # numpy's
