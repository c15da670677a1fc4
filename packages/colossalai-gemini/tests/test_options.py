"""The seed's parameters land in GeminiPlugin: checked on the mapping and on a real GeminiPlugin."""

from __future__ import annotations

import warnings

import pytest
import torch

from lightning_strategies.parameters import ObsoleteParameterWarning
from lightning_strategies_colossalai.options import GeminiSettings, gemini_plugin_arguments

MEBI = 2**20


def build_plugin(arguments):
    """A real ColossalAI GeminiPlugin (CPU, one-process gloo group); the chunk device is set by hand
    because ColossalAI's default would be the current CUDA device."""
    from colossalai.booster.plugin import GeminiPlugin

    return GeminiPlugin(chunk_init_device=torch.device("cpu"), **arguments)


@pytest.mark.parametrize(
    ("placement", "expected"),
    [
        (
            "cuda",
            {
                "placement_policy": "static",
                "shard_param_frac": 1.0,
                "offload_optim_frac": 0.0,
                "offload_param_frac": 0.0,
            },
        ),
        (
            "cpu",
            {
                "placement_policy": "static",
                "shard_param_frac": 1.0,
                "offload_optim_frac": 1.0,
                "offload_param_frac": 1.0,
            },
        ),
        ("auto", {"placement_policy": "auto"}),
        (
            {"placement_policy": "static", "offload_optim_frac": 0.45},
            {
                "placement_policy": "static",
                "shard_param_frac": 1.0,
                "offload_optim_frac": 0.45,
                "offload_param_frac": 0.0,
            },
        ),
        (
            {"placement_policy": "static", "offload_optim_frac": 1.0, "offload_param_frac": 1.0},
            {"placement_policy": "static", "offload_optim_frac": 1.0, "offload_param_frac": 1.0},
        ),
        ({"placement_policy": "static"}, {"placement_policy": "static", "offload_optim_frac": 0.0}),
    ],
)
def test_placement_reaches_gemini_plugin(gloo_world_of_one, placement, expected):
    given = placement if isinstance(placement, dict) else {"placement_policy": placement}
    arguments = gemini_plugin_arguments(GeminiSettings(**given), "16-mixed", world_size=1)
    plugin = build_plugin(arguments)
    for key, value in expected.items():
        assert plugin.gemini_config[key] == value
    assert plugin.gemini_config["mixed_precision"] is torch.float16


def test_every_seed_parameter_reaches_gemini_plugin(gloo_world_of_one):
    settings = GeminiSettings(
        placement_policy="auto",
        force_outputs_fp32=True,
        gpu_margin_mem_ratio=0.25,
        chunk_search_range=16 * MEBI,
        chunk_search_n_grids=1024,
        min_chunk_size=8 * MEBI,
        initial_scale=2**10,
        min_scale=2,
        growth_factor=3,
        backoff_factor=0.25,
        growth_interval=50,
        hysteresis=4,
        max_scale=2**20,
        max_prefetch=2,
    )
    plugin = build_plugin(
        gemini_plugin_arguments(settings, "16-mixed", world_size=1, accumulate_grad_batches=4, gradient_clip_val=0.5)
    )
    config = plugin.gemini_config
    assert config["force_outputs_fp32"] is True
    assert config["max_prefetch"] == 2
    assert config["search_range_m"] == 16
    assert config["hidden_dim"] == 16 * MEBI // 1024  # search step = range / n_grids
    assert config["min_chunk_size_m"] == 8
    assert config["strict_ddp_mode"] is False
    assert config["enable_gradient_accumulation"] is True
    assert plugin.zero_optim_config == {"gpu_margin_mem_ratio": 0.25}
    assert plugin.optim_kwargs == {
        "initial_scale": 2**10,
        "growth_factor": 3,
        "backoff_factor": 0.25,
        "growth_interval": 50,
        "hysteresis": 4,
        "min_scale": 2,
        "max_scale": 2**20,
        "max_norm": 0.5,
        "norm_type": 2.0,
    }


def test_fixed_chunk_size_and_no_distributed_storage(gloo_world_of_one):
    settings = GeminiSettings(placement_policy="cuda", chunk_size=4 * MEBI, enable_distributed_storage=False)
    plugin = build_plugin(gemini_plugin_arguments(settings, "bf16-mixed", world_size=1))
    config = plugin.gemini_config
    assert config["chunk_config_dict"] == {1: {"chunk_size": 4 * MEBI, "keep_gathered": True}}
    assert config["strict_ddp_mode"] is True
    assert config["shard_param_frac"] == 0.0
    assert config["mixed_precision"] is torch.bfloat16


def test_chunk_config_is_keyed_by_world_size():
    arguments = gemini_plugin_arguments(GeminiSettings(chunk_size=1024), "16-mixed", world_size=8)
    assert arguments["chunk_config_dict"] == {8: {"chunk_size": 1024, "keep_gathered": False}}


def test_defaults_match_the_seed_page():
    import inspect

    from lightning_strategies_colossalai.strategy import ColossalAIStrategy

    seed_defaults = {
        "use_chunk": True,
        "chunk_size": None,
        "enable_distributed_storage": True,
        "placement_policy": "auto",
        "force_outputs_fp32": False,
        "gpu_margin_mem_ratio": 0.0,
        "chunk_search_range": 67108864,
        "chunk_search_n_grids": 4096,
        "min_chunk_size": 33554432,
        "initial_scale": 65536,
        "min_scale": 1,
        "growth_factor": 2,
        "backoff_factor": 0.5,
        "growth_interval": 1000,
        "hysteresis": 2,
        "max_scale": 4294967296,
        "accelerator": None,
        "parallel_devices": None,
        "cluster_environment": None,
        "checkpoint_io": None,
        "precision_plugin": None,
    }
    parameters = inspect.signature(ColossalAIStrategy.__init__).parameters
    assert {name: parameters[name].default for name in seed_defaults} == seed_defaults


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"placement_policy": "gpu"}, "placement_policy='gpu'.*'cpu', 'cuda', 'auto'"),
        ({"state_dict_type": "partial"}, "state_dict_type='partial'.*'full', 'sharded'"),
        ({"gpu_margin_mem_ratio": 1.5}, "between 0 and 1"),
        ({"chunk_size": 0}, "chunk_size=0.*positive"),
        ({"backoff_factor": 2.0}, "backoff_factor"),
        ({"min_scale": 10, "initial_scale": 1}, "min_scale <= initial_scale"),
        ({"use_chunk": "yes"}, "use_chunk='yes'.*bool"),
        ({"max_prefetch": -1}, "max_prefetch=-1.*zero or positive"),
    ],
)
def test_bad_values_say_what_is_allowed(kwargs, message):
    with pytest.raises((ValueError, TypeError), match=message):
        GeminiSettings(**kwargs)


def test_fp32_precision_is_refused_by_the_mapping():
    with pytest.raises(ValueError, match=r"no fp32 mode"):
        gemini_plugin_arguments(GeminiSettings(), "32-true", world_size=1)


def test_obsolete_and_ignored_parameters_warn_with_a_reason():
    with pytest.warns(ObsoleteParameterWarning) as caught:
        GeminiSettings(
            use_chunk=False,
            placement_policy="cuda",
            gpu_margin_mem_ratio=0.5,
            chunk_size=MEBI,
            min_chunk_size=MEBI,
        ).warn_obsolete()
    messages = "\n".join(str(warning.message) for warning in caught)
    assert "always stores parameters in chunks" in messages
    assert "only used by placement_policy='auto'" in messages
    assert "min_chunk_size" in messages and "no chunk size is searched" in messages


def test_loss_scaler_settings_warn_under_bf16_only():
    settings = GeminiSettings(placement_policy="cuda", initial_scale=2**8)
    with pytest.warns(ObsoleteParameterWarning, match=r"initial_scale.*does not scale the loss"):
        settings.warn_precision("bf16-mixed")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        settings.warn_precision("16-mixed")
        GeminiSettings().warn_obsolete()


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"placement_policy": "cuda", "offload_optim_frac": 0.5}, r"only placement_policy='static' reads.*Pass"),
        ({"placement_policy": "auto", "offload_param_frac": 0.5}, r"only placement_policy='static' reads"),
        ({"placement_policy": "static", "offload_optim_frac": 1.5}, r"must lie between 0 and 1"),
        # GeminiPlugin itself only warns and keeps every parameter chunk on the GPU.
        (
            {"placement_policy": "static", "offload_optim_frac": 0.5, "offload_param_frac": 1.0},
            r"once every optimizer state is offloaded.*offload_optim_frac=1.0",
        ),
        # Gemini evicts parameter chunks only while those leaving exceed the share kept: a share in between
        # offloads about nothing.
        ({"placement_policy": "static", "offload_optim_frac": 1.0, "offload_param_frac": 0.2}, r"all or none"),
        (
            {"placement_policy": "static", "offload_optim_frac": 1.0, "offload_param_frac": 1.0,
             "enable_distributed_storage": False},
            r"needs sharded chunks",
        ),
    ],
)  # fmt: skip
def test_offload_fractions_outside_what_gemini_honours_are_refused(given, message):
    with pytest.raises(ValueError, match=message):
        GeminiSettings(**given)


def test_only_a_placement_that_offloads_optimizer_states_counts_as_offloading():
    assert not GeminiSettings(placement_policy="cuda").offloads
    assert not GeminiSettings(placement_policy="static").offloads
    assert GeminiSettings(placement_policy="static", offload_optim_frac=0.05).offloads
    assert GeminiSettings(placement_policy="cpu").offloads
    assert GeminiSettings(placement_policy="auto").offloads


@pytest.mark.parametrize(
    ("placement", "pin_memory", "pinned"),
    [("cuda", None, False), ("static", None, False), ("auto", None, False), ("cpu", None, True),
     ("cuda", True, True), ("cpu", False, False)],
)  # fmt: skip
def test_chunks_are_pinned_only_where_they_live_on_the_host_or_when_asked(
    gloo_world_of_one, placement, pin_memory, pinned
):
    """Pinned, GeminiPlugin keeps a host copy of every chunk, the GPU-held ones too; by default only placement
    "cpu", whose chunks live on the host anyway, is pinned."""
    settings = GeminiSettings(placement_policy=placement, pin_memory=pin_memory)
    config = build_plugin(gemini_plugin_arguments(settings, "bf16-mixed", 1)).gemini_config
    assert config["pin_memory"] is pinned
    assert config["enable_async_reduce"] is pinned
