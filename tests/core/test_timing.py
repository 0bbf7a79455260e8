"""`core/timing.py`: every side runs once per round, in an order that rotates, and its own block is what is timed."""
from __future__ import annotations

import time

from lit_iclr.core.timing import interleaved_cpu_times


def test_sides_rotate_and_each_block_is_timed_on_its_own():
    order = []

    def busy(seconds: float):
        def block():
            order.append(seconds)
            t = time.process_time()
            while time.process_time() - t < seconds:
                pass
        return block

    times = interleaved_cpu_times({"short": busy(0.01), "long": busy(0.05)}, rounds=4)
    assert order == [0.01, 0.05, 0.05, 0.01, 0.01, 0.05, 0.05, 0.01]  # the order flips every round
    assert len(times["short"]) == len(times["long"]) == 4
    assert all(0.008 <= t < 0.04 for t in times["short"])
    assert all(0.045 <= t < 0.2 for t in times["long"])
