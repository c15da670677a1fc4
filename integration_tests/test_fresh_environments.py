"""What a user sees after `pip install`: names that resolve with no import, errors and hints, `list`."""

from __future__ import annotations

import pytest
from conftest import build_wheel, plugin_project

SOUND_PLUGIN = """
    from lightning_strategies import hookimpl

    @hookimpl
    def register_strategies(registry):
        registry.register(
            "acme",
            "acme_strategy.strategy:AcmeStrategy",
            description="Acme's strategy",
            init_params={"greeting": "hi"},
            fabric_target="lightning.fabric.strategies:DDPStrategy",
        )
"""
SOUND_STRATEGY = {
    "strategy": """
        from lightning.pytorch.strategies import DDPStrategy

        class AcmeStrategy(DDPStrategy):
            def __init__(self, greeting="hello", **kwargs):
                super().__init__(**kwargs)
                self.greeting = greeting
    """
}
CLASH_PLUGIN = """
    from lightning_strategies import hookimpl

    @hookimpl
    def register_strategies(registry):
        registry.register("shared_name", "lightning.pytorch.strategies:DDPStrategy")
"""
BROKEN_PLUGIN = "import a_module_that_does_not_exist\n"

STRATEGY_FOLDERS = ("colossalai-gemini", "deepspeed", "fsdp", "xla")


def test_core_alone(wheels, fresh_environment):
    env = fresh_environment("core-alone")
    env.install(wheels["core"])
    listing = env.command("list").stdout
    assert "ddp_spawn" in listing and "Lightning built-in" in listing
    assert "pip install lightning-strategies-colossalai-gemini" in listing
    result = env.probe("""
        import sys
        heavy_at_start = sorted(m for m in ("torch", "lightning", "pluggy", "lightning_strategies") if m in sys.modules)
        import lightning.pytorch as pl
        builtin = type(pl.Trainer(strategy="ddp", accelerator="cpu", devices=1, logger=False).strategy).__name__
        try:
            pl.Trainer(strategy="colossalai")
        except ValueError as error:
            missing = str(error)
        result = {"heavy_at_start": heavy_at_start, "builtin": builtin, "missing": missing}
    """)
    assert result["heavy_at_start"] == []
    assert result["builtin"] == "DDPStrategy"
    assert "pip install lightning-strategies-colossalai-gemini" in result["missing"]


@pytest.mark.parametrize("folder", STRATEGY_FOLDERS)
def test_core_with_one_strategy_package_without_its_backend(wheels, fresh_environment, folder):
    if folder not in wheels:
        pytest.skip(f"packages/{folder} is not in this checkout")
    env = fresh_environment(f"core-{folder}")
    env.install(wheels["core"])
    env.install(wheels[folder], no_deps=True)  # the backend is left out on purpose
    listing = env.command("list", "--json").stdout
    result = env.probe("""
        import sys
        from lightning_strategies import get_registry
        from lightning_strategies.known import PROJECT_PACKAGES
        ours = {entry.name: entry.distribution for entry in get_registry()}
        import lightning.pytorch as pl, pytorch_lightning as ptl, lightning.fabric as fabric
        from lightning_strategies.activation import LazyStrategy
        def lazy_names(registry):
            return sorted(name for name, data in registry.items() if isinstance(data["strategy"], LazyStrategy))
        lazy = {
            "lightning.pytorch": lazy_names(pl.strategies.StrategyRegistry),
            "pytorch_lightning": lazy_names(ptl.strategies.StrategyRegistry),
        }
        backends = sorted(m for m in ("deepspeed", "colossalai", "torch_xla") if m in sys.modules)
        result = {"ours": ours, "lazy": lazy, "backends_imported": backends, "declared": PROJECT_PACKAGES}
    """)
    distribution = f"lightning-strategies-{folder}"
    declared = set(result["declared"][distribution])
    assert set(result["ours"]) == declared, "the package registers exactly the names design.md fixes"
    assert set(result["ours"].values()) == {distribution}
    assert set(result["lazy"]["lightning.pytorch"]) == declared
    assert set(result["lazy"]["pytorch_lightning"]) == declared
    assert result["backends_imported"] == [], "listing and activation must not import a backend"
    assert distribution in listing


def test_a_third_party_plugin_a_clash_and_a_broken_plugin(wheels, fresh_environment, tmp_path):
    projects, outdir = tmp_path / "projects", tmp_path / "wheels"
    outdir.mkdir()
    plugin_wheels = [
        build_wheel(plugin_project(projects, "acme-strategy", "acme_strategy", SOUND_PLUGIN, SOUND_STRATEGY), outdir),
        build_wheel(plugin_project(projects, "clash-one", "clash_one", CLASH_PLUGIN), outdir),
        build_wheel(plugin_project(projects, "clash-two", "clash_two", CLASH_PLUGIN), outdir),
        build_wheel(plugin_project(projects, "broken-plugin", "broken_plugin", BROKEN_PLUGIN), outdir),
    ]
    env = fresh_environment("third-party")
    env.install(wheels["core"], *plugin_wheels)

    listing = env.command("list").stdout
    assert "acme-strategy 0.1.0" in listing
    assert "CLASH  'shared_name' is claimed by clash-one 0.1.0 and clash-two 0.1.0" in listing
    assert "SKIPPED plugin 'broken_plugin' (broken-plugin)" in listing and "a_module_that_does_not_exist" in listing

    result = env.probe("""
        import lightning.pytorch as pl, pytorch_lightning as ptl, lightning.fabric as fabric
        options = dict(accelerator="cpu", devices=1, logger=False)
        trainer = pl.Trainer(strategy="Acme", **options)
        standalone = ptl.Trainer(strategy="acme", **options)
        fabric_strategy = type(fabric.Fabric(strategy="acme", accelerator="cpu", devices=1).strategy).__module__
        try:
            pl.Trainer(strategy="shared_name", **options)
        except Exception as error:
            clash = f"{type(error).__name__}: {error}"
        try:
            pl.Trainer(strategy="acmee", **options)
        except ValueError as error:
            typo = str(error)
        result = {
            "greeting": trainer.strategy.greeting,
            "class": type(trainer.strategy).__module__ + "." + type(trainer.strategy).__name__,
            "standalone_is_pytorch_lightning": isinstance(standalone.strategy, ptl.strategies.DDPStrategy),
            "fabric": fabric_strategy, "clash": clash, "typo": typo,
        }
    """)
    assert result["greeting"] == "hi"
    assert result["class"] == "acme_strategy.strategy.AcmeStrategy"
    assert result["standalone_is_pytorch_lightning"]
    assert result["fabric"].startswith("lightning.fabric.strategies")
    assert (
        "StrategyConflictError" in result["clash"] and "clash-one" in result["clash"] and "clash-two" in result["clash"]
    )
    assert "Did you mean: 'acme'" in result["typo"]

    for how in ({"PL_TRAINER_STRATEGY": "acme"},):
        env_result = env.probe(
            """
            import lightning.pytorch as pl
            result = type(pl.Trainer(accelerator="cpu", devices=1, logger=False).strategy).__name__
            """,
            env=how,
        )
        assert env_result == "AcmeStrategy"

    disabled = env.probe(
        """
        import lightning.pytorch as pl
        result = "acme" in pl.strategies.StrategyRegistry
        """,
        env={"LIGHTNING_STRATEGIES_DISABLE": "acme_strategy"},
    )
    assert disabled is False


def test_lightning_cli_resolves_the_name(wheels, fresh_environment, tmp_path):
    outdir = tmp_path / "wheels"
    outdir.mkdir()
    acme = build_wheel(
        plugin_project(tmp_path / "projects", "acme-strategy", "acme_strategy", SOUND_PLUGIN, SOUND_STRATEGY),
        outdir,
    )
    env = fresh_environment("cli")
    env.install(wheels["core"], acme)
    script = tmp_path / "train.py"
    script.write_text(
        "from lightning.pytorch.cli import LightningCLI\n"
        "from lightning.pytorch.demos.boring_classes import BoringModel\n"
        "cli = LightningCLI(BoringModel, run=False)\n"
        "print('STRATEGY', type(cli.trainer.strategy).__name__, cli.trainer.strategy.greeting)\n"
    )
    arguments = ["train.py", "--trainer.strategy=acme", "--trainer.accelerator=cpu", "--trainer.devices=1"]
    result = env.run(
        f"import runpy, sys; sys.argv = {arguments!r}; runpy.run_path({str(script)!r}, run_name='__main__')"
    )
    assert "STRATEGY AcmeStrategy hi" in result.stdout
