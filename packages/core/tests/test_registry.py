"""The registry's policies, with throwaway plugins registered and dropped per test."""

from __future__ import annotations

import pytest

from lightning_strategies import hookimpl
from lightning_strategies.errors import CapabilityError, StrategyConflictError, StrategyLookupError


class AcmePlugin:
    @hookimpl
    def register_strategies(registry):
        registry.register(
            "Acme",
            "acme_strategy.strategy:AcmeStrategy",
            description="Acme's strategy",
            init_params={"greeting": "hi"},
            accelerators=["cpu"],
            precisions=["32-true", "bf16-mixed"],
        )


def test_register_exactly_as_design_writes_it(registry, add_plugin):
    add_plugin(AcmePlugin, distribution="acme-strategy")
    entry = registry.entry("acme")
    assert entry.target == "acme_strategy.strategy:AcmeStrategy"
    assert entry.init_params == {"greeting": "hi"}
    assert entry.description == "Acme's strategy"
    assert entry.distribution == "acme-strategy"
    assert entry.accelerators == ("cpu",)
    assert registry.names() == ["acme"]


def test_names_are_case_insensitive(registry, add_plugin):
    add_plugin(AcmePlugin)
    assert "ACME" in registry
    assert registry.entry("AcMe").name == "acme"


def test_two_distributions_claiming_a_name_is_an_error_naming_both(registry, add_plugin):
    class AcmeCopy(AcmePlugin):
        pass

    add_plugin(AcmePlugin, name="first", distribution="acme-one")
    add_plugin(AcmeCopy, name="second", distribution="acme-two")
    assert "acme" not in registry
    with pytest.raises(StrategyConflictError) as error:
        registry.entry("acme")
    assert "acme-one 1.0" in str(error.value) and "acme-two 1.0" in str(error.value)
    assert "LIGHTNING_STRATEGIES_DISABLE" in str(error.value)


def test_replacing_a_builtin_needs_a_declaration(registry, add_plugin):
    def register_strategies(registry):
        registry.register("deepspeed", "somewhere:Strategy")
        registry.register("own_name", "somewhere:Strategy")

    add_plugin(register_strategies)
    assert "deepspeed" not in registry
    assert "own_name" in registry
    (problem,) = registry.problems
    assert problem.names == ("deepspeed",) and "replaces_builtin=True" in problem.reason


def test_declared_replacement_of_a_builtin_is_allowed(registry, add_plugin):
    def register_strategies(registry):
        registry.register("deepspeed", "somewhere:Strategy", replaces_builtin=True)

    add_plugin(register_strategies)
    assert registry.entry("deepspeed").replaces_builtin


def test_unknown_name_gets_close_matches(registry, add_plugin):
    add_plugin(AcmePlugin)
    with pytest.raises(StrategyLookupError) as error:
        registry.entry("acmee")
    assert "Did you mean: 'acme'" in str(error.value)
    assert isinstance(error.value, ValueError) and isinstance(error.value, KeyError)


def test_project_name_not_installed_gets_the_install_line(registry):
    with pytest.raises(StrategyLookupError) as error:
        registry.entry("colossalai")
    assert "pip install lightning-strategies-colossalai-gemini" in str(error.value)


def test_typo_of_a_project_name_hints_at_its_package(registry):
    with pytest.raises(StrategyLookupError) as error:
        registry.entry("colossalai_cude")
    assert "'colossalai_cuda'" in str(error.value)
    assert "pip install lightning-strategies-colossalai-gemini" in str(error.value)


def test_a_failing_hook_leaves_no_names_behind(registry, add_plugin):
    def register_strategies(registry):
        registry.register("half_way", "somewhere:Strategy")
        raise RuntimeError("boom")

    add_plugin(register_strategies, name="half")
    add_plugin(AcmePlugin, name="acme")
    assert registry.names() == ["acme"]
    (problem,) = registry.problems
    assert problem.plugin == "half" and "boom" in problem.reason


def test_hook_implementations_may_take_fewer_arguments(registry, add_plugin):
    def register_strategies():
        pass

    add_plugin(register_strategies, name="quiet")
    assert registry.loaded_plugins == ["quiet"] and not registry.problems


def test_a_misspelt_hook_is_reported(registry, add_plugin):
    def register_strategy(registry):
        pass

    add_plugin(register_strategy, name="misspelt")
    (problem,) = registry.problems
    assert "register_strategy" in problem.reason


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda r: r.register("x", "no_colon_here"), "package.module:ClassName"),
        (lambda r: r.register("x", "m:C", accelerator=["cpu"]), "unknown metadata"),
        (lambda r: r.register("", "m:C"), "non-empty string"),
    ],
)
def test_register_refuses_malformed_calls(registry, add_plugin, call, message):
    def register_strategies(registry):
        call(registry)

    add_plugin(register_strategies, name="bad")
    (problem,) = registry.problems
    assert message in problem.reason


def test_capabilities_are_checked_with_the_allowed_values(registry, add_plugin):
    add_plugin(AcmePlugin)
    entry = registry.entry("acme")
    entry.check_capabilities(accelerator="cpu", precision="bf16-mixed")
    with pytest.raises(CapabilityError) as error:
        entry.check_capabilities(accelerator="gpu", precision="16-mixed")
    message = str(error.value)
    assert "accelerator='gpu'" in message and "supported: cpu" in message
    assert "precision='16-mixed'" in message and "32-true, bf16-mixed" in message
    assert "lightning-strategies info acme" in message


def test_a_class_is_a_valid_target(registry, add_plugin):
    class Strategy:
        def __init__(self, greeting="hello"):
            self.greeting = greeting

    def register_strategies(registry):
        registry.register("by_class", Strategy, init_params={"greeting": "hi"})

    add_plugin(register_strategies)
    assert registry.resolve("by_class").greeting == "hi"
    assert registry.resolve("by_class", greeting="yo").greeting == "yo"


def test_a_plugin_registering_a_name_twice_is_skipped_alone(registry, add_plugin):
    def register_strategies(registry):
        registry.register("twice", "somewhere:Strategy")
        registry.register("TWICE", "somewhere:Strategy")

    add_plugin(register_strategies, name="twice")
    add_plugin(AcmePlugin, name="acme")
    assert registry.names() == ["acme"]
    assert "called twice" in registry.problems[0].reason


def test_two_entry_points_of_one_distribution_claiming_a_name_clash(registry, add_plugin):
    class AcmeCopy(AcmePlugin):
        pass

    add_plugin(AcmePlugin, name="first", distribution="acme-dist")
    add_plugin(AcmeCopy, name="second", distribution="acme-dist")
    with pytest.raises(StrategyConflictError, match=r"acme-dist 1\.0 and acme-dist 1\.0"):
        registry.entry("acme")


def test_a_typo_suggests_installing_only_the_package_of_its_closest_match(registry):
    message = registry.unknown_name_message("fsdpp")
    assert "Did you mean: 'fsdp'" in message
    assert "pip install lightning-strategies-fsdp" in message
    assert "lightning-strategies-xla" not in message


def test_a_name_of_the_other_entry_point_says_which_one_has_it(registry, add_plugin):
    message = registry.unknown_name_message("deepspeed_stage_1_offload", namespace="lightning.pytorch")
    assert "built-in strategy of Fabric only; Trainer does not have it" in message
    assert "'deepspeed_stage_1_offload'?" not in message  # no longer suggested to itself

    add_plugin(AcmePlugin)  # registered without a Fabric class
    message = registry.unknown_name_message("acme", namespace="lightning.fabric")
    assert "works with Trainer only, not with Fabric" in message
    assert "Did you mean: 'acme'" not in message
