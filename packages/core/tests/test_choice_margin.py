"""The margin every package's memory model keeps free on each GPU when it chooses how much to offload.

It lives in core so that DeepSpeed's offload ratio and Gemini's offload fractions are chosen equally
cautiously; a package keeping its own copy could drift from the others unnoticed.
"""

from __future__ import annotations

from lightning_strategies.planning import (
    CHOICE_MARGIN,
    GIB,
    Machine,
    smallest_fitting_fraction,
    with_choice_margin,
)


def test_the_margin_takes_its_share_of_gpu_memory_and_nothing_else() -> None:
    machine = Machine(gpus=4, gpu_memory_bytes=80 * GIB, host_memory_bytes=512 * GIB, nvme_bytes=GIB)
    smaller = with_choice_margin(machine)
    assert smaller.gpu_memory_bytes == int(80 * GIB * (1 - CHOICE_MARGIN))
    assert (smaller.gpus, smaller.host_memory_bytes, smaller.nvme_bytes) == (4, 512 * GIB, GIB)
    assert machine.gpu_memory_bytes == 80 * GIB  # the machine described is left as it is


def test_a_prediction_just_under_the_budget_needs_more_offload_with_the_margin() -> None:
    machine = Machine(gpus=1, gpu_memory_bytes=80 * GIB, host_memory_bytes=512 * GIB)
    budget = machine.gpu_budget_bytes

    def peaks(fraction: float) -> tuple[float, float]:
        # Offloading everything frees half the GPU peak; with none offloaded it just fits.
        return budget * (1 - fraction / 2), 0.0

    assert smallest_fitting_fraction(peaks, machine) == 0.0
    assert smallest_fitting_fraction(peaks, with_choice_margin(machine)) > 0.0
