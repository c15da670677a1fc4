"""The reliability tier holds third-party strategies to crash-safe saves and failed-rank exit.

Two throwaway plugin distributions, built like any third party's: one uses core's staged saves
and rank watchdog and passes every check; one writes checkpoints in place and is caught.
"""

from __future__ import annotations

import pytest
from conftest import write_distribution

PLUGIN = """
    from lightning_strategies import hookimpl

    @hookimpl
    def register_strategies(registry):
        registry.register("careful_ddp", "third_party_strategies:CarefulDDPStrategy")
        registry.register("careless_ddp", "third_party_strategies:CarelessDDPStrategy")
"""
STRATEGIES = """
    import io
    import time

    import torch
    from lightning.pytorch.strategies import DDPStrategy

    from lightning_strategies.checkpoints import staged_save
    from lightning_strategies.ranks import ReportFailuresMixin, watch_ranks


    class CarefulDDPStrategy(ReportFailuresMixin, DDPStrategy):
        '''DDP with core's rank watchdog and staged checkpoint saves.'''

        def setup_distributed(self):
            super().setup_distributed()
            watch_ranks(self.global_rank, self.world_size)

        def save_checkpoint(self, checkpoint, filepath, storage_options=None):
            with staged_save(filepath, self.is_global_zero, self.barrier) as staged:
                if self.is_global_zero:
                    torch.save(checkpoint, staged)


    class CarelessDDPStrategy(DDPStrategy):
        '''Writes each checkpoint in place, in two halves: a kill between them leaves it torn.'''

        def save_checkpoint(self, checkpoint, filepath, storage_options=None):
            if not self.is_global_zero:
                return
            buffer = io.BytesIO()
            torch.save(checkpoint, buffer)
            data = buffer.getvalue()
            with open(filepath, "wb") as handle:
                handle.write(data[: len(data) // 2])
                handle.flush()
                time.sleep(0.5)
                handle.write(data[len(data) // 2 :])
"""


@pytest.fixture
def third_party(tmp_path, on_path):
    modules = {"third_party_plugin": PLUGIN, "third_party_strategies": STRATEGIES}
    on_path(write_distribution(tmp_path / "site", "third-party", modules, {"third-party": "third_party_plugin"}))


def results_of(report) -> dict[str, dict]:
    return {result["check"]: result for result in report.results}


def test_a_strategy_built_on_core_passes_the_reliability_tier(third_party, strategy_conformance):
    report = strategy_conformance("careful_ddp", devices=2, tiers=("reliability",))
    assert report.passed, str(report)
    results = results_of(report)
    assert set(results) == {
        "crash-safe save",
        "resume after kill",
        "failed-rank exit (raises)",
        "failed-rank exit (killed)",
    }
    assert "inside a save" in results["crash-safe save"]["detail"]


def test_a_checkpoint_written_in_place_is_caught_torn(third_party, strategy_conformance):
    report = strategy_conformance("careless_ddp", devices=1, tiers=("reliability",))
    assert not report.passed
    crash_safe = results_of(report)["crash-safe save"]
    assert not crash_safe["passed"], str(report)


def test_an_unknown_tier_is_refused():
    from lightning_strategies.conformance import run_check

    with pytest.raises(ValueError, match="Unknown conformance tier"):
        run_check("ddp", tiers=("speed",))


@pytest.mark.parametrize(
    ("late", "expected"),
    [
        pytest.param([], (2, 2), id="nothing-after-the-last-look"),
        pytest.param(["save-end last.ckpt epoch=2"], (2, 2), id="the-save-being-written-ended"),
        # An epoch shorter than a save: the next save began during the driver's sleep, so its
        # publication may beat the kill and the resume may start after it.
        pytest.param(["save-begin last.ckpt epoch=3"], (2, 3), id="a-save-began-before-the-kill"),
        pytest.param(
            ["save-begin last.ckpt epoch=3", "save-end last.ckpt epoch=3", "save-begin last.ckpt epoch=4"],
            (3, 4),
            id="one-ended-and-the-next-began",
        ),
        pytest.param(["save-begin epoch=3-step=12.ckpt epoch=3"], (2, 2), id="other-checkpoints-do-not-count"),
    ],
)
def test_the_saves_at_a_kill_count_events_printed_before_it(late, expected):
    from lightning_strategies.conformance.reliability import saves_at_kill

    assert saves_at_kill(late, newest_complete=2, being_written=2) == expected
