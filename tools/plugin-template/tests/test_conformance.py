"""The contract with lightning-strategies: "{{name}}" passes the conformance suite and works by name.

`strategy_conformance` comes with lightning-strategies (a pytest plugin it installs): it runs
the same suite as `lightning-strategies check {{name}}` in a separate process.
"""

import json
import subprocess
import sys


def test_conformance_on_two_cpu_processes(strategy_conformance):
    report = strategy_conformance("{{name}}", accelerator="cpu", devices=2)
    assert report.passed, str(report)


def test_saves_killed_midway_resumes_and_failed_ranks(strategy_conformance):
    # The reliability tier: about a minute and a half of short runs, most of them killed.
    report = strategy_conformance("{{name}}", accelerator="cpu", devices=2, tiers=("reliability",))
    assert report.passed, str(report)


def test_name_works_in_a_fresh_interpreter_without_importing_the_plugin():
    # What a user gets after `pip install {{distribution}}`: the name alone is enough.
    code = """
import json, sys
imported_at_start = sorted(name for name in sys.modules if name.startswith("{{module}}"))
import lightning.pytorch
trainer = lightning.pytorch.Trainer(strategy="{{name}}", accelerator="cpu", devices=1, logger=False)
strategy = type(trainer.strategy)
print(json.dumps({"imported_at_start": imported_at_start, "strategy": f"{strategy.__module__}:{strategy.__name__}"}))
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, (
        "Trainer(strategy='{{name}}') failed in a fresh interpreter. Is this package installed "
        "(pip install -e .) and LIGHTNING_STRATEGIES_AUTOLOAD not set to 0?\n" + result.stderr
    )
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found == {"imported_at_start": [], "strategy": "{{module}}.strategy:{{class_name}}"}
