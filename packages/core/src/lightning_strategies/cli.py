"""The `lightning-strategies` command: list, info, doctor, check, plan, export and convert.

`list` and `info` read metadata only: they import no backend and no strategy module.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys
from collections.abc import Sequence

from lightning_strategies.entries import StrategyEntry, target_text
from lightning_strategies.errors import StrategyConflictError, StrategyLookupError
from lightning_strategies.known import (
    CONVERT_TARGETS,
    LIGHTNING_BUILTIN_NAMES,
    PROJECT_PACKAGES,
    lightning_builtin_entry_points,
)
from lightning_strategies.registry import get_registry


def _flavours(entry: StrategyEntry) -> str:
    return "Trainer+Fabric" if entry.fabric_target else "Trainer"


def command_list(arguments: argparse.Namespace) -> int:
    registry = get_registry()
    ours = {entry.name: entry for entry in registry}
    rows = [(entry.name, entry.provider, _flavours(entry), entry.description) for entry in ours.values()]
    rows += [
        (name, "Lightning built-in", "+".join(lightning_builtin_entry_points(name)), "")
        for name in LIGHTNING_BUILTIN_NAMES
        if name not in ours
    ]
    rows.sort()
    not_installed = {
        distribution: [name for name in names if name not in ours]
        for distribution, names in PROJECT_PACKAGES.items()
        if not any(name in ours for name in names)
    }
    if arguments.json:
        json.dump(
            {
                "strategies": [
                    dict(zip(("name", "provider", "supports", "description"), row, strict=True)) for row in rows
                ],
                "problems": [vars(problem) for problem in registry.problems],
                "clashes": {name: [e.provider for e in entries] for name, entries in registry.clashes().items()},
                "not_installed": not_installed,
            },
            sys.stdout,
            indent=1,
        )
        print()
        return 0
    width = max(len(row[0]) for row in rows) + 2
    provider_width = max(len(row[1]) for row in rows) + 2
    print(f"{'NAME':<{width}}{'PROVIDER':<{provider_width}}{'SUPPORTS':<16}DESCRIPTION")
    for name, provider, supports, description in rows:
        print(f"{name:<{width}}{provider:<{provider_width}}{supports:<16}{description}")
    for name, entries in registry.clashes().items():
        print(f"\nCLASH  {name!r} is claimed by " + " and ".join(e.provider for e in entries) + "; it cannot be used.")
    for problem in registry.problems:
        print(
            f"\nSKIPPED plugin {problem.plugin!r} ({problem.distribution or 'unknown distribution'}): {problem.reason}"
        )
    if not_installed:
        print("\nMore strategies from this project:")
        for distribution, names in not_installed.items():
            print(f"  pip install {distribution:<42} # {', '.join(names)}")
    return 0


def command_info(arguments: argparse.Namespace) -> int:
    name = arguments.name.lower()
    registry = get_registry()
    if name not in registry and name in LIGHTNING_BUILTIN_NAMES:
        entry_points = " and ".join(lightning_builtin_entry_points(name))
        print(f"{name}: a Lightning built-in strategy of {entry_points} (see Lightning's documentation).")
        return 0
    entry = registry.entry(name)
    print(f"{entry.name}: {entry.description}")
    # (label, value); a row whose value is None does not apply to this entry.
    rows = [
        ("provider", entry.provider),
        (
            "entry point",
            f"{entry.plugin} (LIGHTNING_STRATEGIES_DISABLE={entry.plugin} skips it)" if entry.plugin else None,
        ),
        ("install", f"pip install {entry.pip_name}" if entry.pip_name else None),
        ("class", target_text(entry.target)),
        ("fabric class", target_text(entry.fabric_target) if entry.fabric_target else None),
        ("works with", ", ".join(entry.namespaces())),
        ("replaces", "Lightning's built-in strategy of the same name" if entry.replaces_builtin else None),
        ("accelerators", ", ".join(entry.accelerators) if entry.accelerators else "any"),
        ("precisions", ", ".join(entry.precisions) if entry.precisions else "any"),
        ("optimizers", ", ".join(entry.optimizers) if entry.optimizers else None),
        ("grad. accum.", "yes" if entry.gradient_accumulation else "no"),
    ]
    for label, value in rows:
        if value is not None:
            print(f"  {label + ':':<15}{value}")
    if entry.init_params:
        print("  defaults for this name:")
        for key, value in entry.init_params.items():
            print(f"    {key}={value!r}")
    _print_parameters(entry)
    return 0


def _print_parameters(entry: StrategyEntry) -> None:
    from lightning_strategies.describe import ParameterDoc, parameter_docs

    documented = parameter_docs(target_text(entry.target))
    meanings = dict(entry.parameters or {})
    # Parameters the plugin documents beyond the signature, such as keywords passed through **kwargs.
    documented += [ParameterDoc(name, None, "") for name in meanings if name not in {p.name for p in documented}]
    if not documented:
        return
    print("  parameters:")
    for parameter in documented:
        default = repr(entry.init_params[parameter.name]) if parameter.name in entry.init_params else parameter.default
        shown = f"{parameter.name}={default}" if default is not None else parameter.name
        print(f"    {shown}")
        meaning = meanings.get(parameter.name) or parameter.meaning
        if meaning:
            print(f"        {meaning}")


def command_doctor(arguments: argparse.Namespace) -> int:
    from lightning_strategies.doctor import backend_findings, machine_findings, strategy_findings

    findings = machine_findings() + strategy_findings(get_registry()) + backend_findings(get_registry())
    for finding in findings:
        print(f"{'ok ' if finding.ok else 'NO '} {finding.what:<44} {finding.detail}")
    problems = get_registry().problems
    for problem in problems:
        print(f"NO  plugin {problem.plugin!r:<37} {problem.reason}")
    for message in get_registry().disable_problems:
        print(f"NO  {'LIGHTNING_STRATEGIES_DISABLE':<44} {message}")
    return 0


def command_check(arguments: argparse.Namespace) -> int:
    from lightning_strategies.conformance import TIERS, run_check

    name = arguments.name.lower()
    registry = get_registry()
    if name in registry:
        registry.entry(name).check_capabilities(accelerator=arguments.accelerator, precision=arguments.precision)
    elif name not in LIGHTNING_BUILTIN_NAMES:
        registry.entry(name)  # raises with close matches or the install line
    _check_devices(arguments.accelerator, arguments.devices)
    print(
        f"Running the conformance suite for {name!r} ({arguments.devices} x {arguments.accelerator}) ...",
        flush=True,
    )
    report = run_check(
        name,
        accelerator=arguments.accelerator,
        devices=arguments.devices,
        precision=arguments.precision,
        timeout=arguments.timeout,
        tiers=TIERS if arguments.tier == "all" else (arguments.tier,),
    )
    print(report)
    return 0 if report.passed else 1


def command_plan(arguments: argparse.Namespace) -> int:
    from lightning_strategies.planning import GIB, plan
    from lightning_strategies.planning.advice import settings_text
    from lightning_strategies.planning.machine import INTER_NODE_ASSUMPTION

    # Each option's dest is the name of plan()'s parameter it sets.
    given = vars(arguments)
    result = plan(**{name: given[name] for name in inspect.signature(plan).parameters if name in given})
    if arguments.json:
        json.dump(result.to_dict(), sys.stdout, indent=1)
        print()
        return 0 if result.fitting else 1
    workload, machine, shape = result.workload, result.machine, result.workload.shape
    detected = f" (detected: {', '.join(machine.detected)})" if machine.detected else ""
    print(
        f"Model: {workload.parameters / 1e9:.2f}B parameters, {shape.layers} layers x {shape.hidden} wide, "
        f"vocabulary {shape.vocabulary}; micro-batch {workload.micro_batch} x {workload.sequence_length} tokens, "
        f"{workload.precision}, {workload.optimizer}"
        + (", activation checkpointing" if workload.activation_checkpointing else "")
    )
    gpus = f"{machine.gpus} GPU(s) x {machine.gpu_memory_bytes / GIB:.1f} GiB" if machine.gpus else "no GPU (the CPU)"
    if machine.nodes > 1:
        gpus = f"{machine.nodes} node(s) x {machine.gpus_per_node} GPU(s) x {machine.gpu_memory_bytes / GIB:.1f} GiB"
    print(
        f"Machine: {gpus}, host {machine.host_memory_bytes / GIB:.1f} GiB per node"
        + (f", NVMe {machine.nvme_bytes / GIB:.0f} GiB per node" if machine.nvme_bytes else "")
        + detected
    )
    if machine.nodes > 1:
        print(f"Network: {INTER_NODE_ASSUMPTION}.")
    print(
        "Predictions are estimates; how far they were from GPU measurements: docs, Which strategy?. GPU PEAK is "
        "each GPU's, HOST PEAK one node's processes together.\n"
    )
    if result.candidates:
        width = max(len(candidate.strategy) for candidate in result.candidates) + 2
        print(f"{'FITS':<6}{'STRATEGY':<{width}}{'GPU PEAK':>10}{'HOST PEAK':>11}{'OFFLOAD':>9}  SETTINGS")
        for candidate in result.candidates:
            print(
                f"{'yes' if candidate.fits else 'no':<6}{candidate.strategy:<{width}}"
                f"{candidate.gpu_peak_gib:>6.1f} GiB{candidate.host_peak_gib:>7.1f} GiB"
                f"{candidate.offloaded_fraction:>8.0%}  {settings_text(candidate)}"
            )
            for note in candidate.notes:
                print(f"{'':<{6 + width}}{note}")
    for problem in result.problems:
        print(f"\nSKIPPED {problem}")
    if not result.fitting:
        print("\n" + "\n".join(result.advice))
        return 1
    best = result.fitting[0]
    print(
        f"\nBest: {best.strategy} ({settings_text(best)}). From Python, "
        "lightning_strategies.plan(...).best_strategy() builds it for Trainer(strategy=...)."
    )
    return 0


ACCELERATORS = ("cpu", "cuda", "gpu", "tpu", "mps")


def _check_devices(accelerator: str, devices: int) -> None:
    """Refuse, before any process starts, what this machine cannot give the suite.

    A suite run with impossible arguments would fail every test and blame the strategy.
    """
    if devices < 1:
        raise ValueError(f"--devices {devices}: the suite needs at least 1 device (one process each).")
    if accelerator not in ACCELERATORS:
        raise ValueError(f"--accelerator {accelerator!r} is not one of: {', '.join(ACCELERATORS)}.")
    if accelerator in ("cuda", "gpu"):
        import torch

        available = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if available < devices:
            raise ValueError(
                f"--accelerator {accelerator} --devices {devices}: this machine has {available} CUDA device(s) "
                f"(torch {torch.__version__}). Pass --devices {available} or fewer, or --accelerator cpu."
                if available
                else f"--accelerator {accelerator}: this machine has no CUDA device (torch {torch.__version__}). "
                "Use --accelerator cpu, or run the check on a machine with a GPU."
            )


def command_export(arguments: argparse.Namespace) -> int:
    """Any strategy's checkpoint as a Hugging Face folder (or a PEFT adapter), which from_pretrained loads."""
    from lightning_strategies.errors import CheckpointError
    from lightning_strategies.hugging_face import export

    try:
        written = export(
            arguments.checkpoint, arguments.out, config=arguments.config, prefix=arguments.prefix,
            weights_only=arguments.weights_only, max_shard_size=arguments.max_shard_size,
        )  # fmt: skip
    except CheckpointError as error:
        print(f"error: {error}", file=sys.stderr)
        if "weights_only" in str(error):
            print("With this command: add --no-weights-only, for a checkpoint you trust.", file=sys.stderr)
        return 2
    except ModuleNotFoundError as error:  # export builds the model with transformers (and peft for an adapter)
        print(f"error: export needs {error.name}: pip install {error.name}", file=sys.stderr)
        return 2
    if os.path.isfile(os.path.join(written, "adapter_config.json")):
        print(f"wrote {written}, a PEFT adapter: load it with PeftModel.from_pretrained(base_model, {str(written)!r}), "
              "with is_trainable=True to train it on")  # fmt: skip
    else:
        print(f"wrote {written}: load it with from_pretrained({str(written)!r})")
    return 0


def command_convert(arguments: argparse.Namespace) -> int:
    """A checkpoint of one layout written in another (one full file, a DCP folder, ...), through the packages that
    know each layout; nothing is written over, and nothing is dropped unless asked."""
    from lightning_strategies.checkpoints.convert import convert
    from lightning_strategies.errors import CheckpointError

    def report(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    try:
        done = convert(
            arguments.source, arguments.out, arguments.to, weights_only=arguments.weights_only,
            drop_optimizer_states=arguments.drop_optimizer_states, report=report,
        )  # fmt: skip
    except (CheckpointError, IsADirectoryError) as error:
        print(f"error: {error}", file=sys.stderr)
        if "weights_only" in str(error):
            print("With this command: add --no-weights-only, for a checkpoint you trust.", file=sys.stderr)
        return 2
    if done.written is None:
        print(f"nothing to convert: {done.notes[0]} Use it as it is; {arguments.out} was not written.")
        return 0
    print(f"wrote {done.written}")
    for note in done.notes:
        print(note)
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lightning-strategies",
        description="Training strategies for PyTorch Lightning, installed as plugins.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="every strategy name Lightning accepts, and broken plugins")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    listing.set_defaults(handler=command_list)
    info = commands.add_parser("info", help="one strategy: description, defaults, capabilities, provider")
    info.add_argument("name", help="a strategy name, in any case")
    info.set_defaults(handler=command_info)
    doctor = commands.add_parser("doctor", help="what this machine can run")
    doctor.set_defaults(handler=command_doctor)
    check = commands.add_parser("check", help="run the conformance suite against an installed strategy")
    check.add_argument("name", help="the strategy name to check, in any case")
    check.add_argument("--accelerator", default="cpu", help="Lightning's accelerator flag: cpu, cuda (or gpu), tpu")
    check.add_argument(
        "--devices", type=int, default=1, help="devices, one process each; collectives are checked when above 1"
    )
    check.add_argument(
        "--precision", default="32-true", help="Lightning's precision flag; it sets the comparison tolerance"
    )
    check.add_argument(
        "--tier",
        choices=("basic", "reliability", "all"),
        default="basic",
        help="basic: stages, collectives, checkpoints; reliability: saves killed mid-way, resume after kills, "
        "failed-rank exit (minutes: it trains many short runs)",
    )
    check.add_argument("--timeout", type=float, default=900, help="seconds before all ranks are killed")
    check.set_defaults(handler=command_check)
    _add_plan_parser(commands)
    _add_export_parser(commands)
    _add_convert_parser(commands)
    return parser


def _add_convert_parser(commands: argparse._SubParsersAction) -> None:
    converting = commands.add_parser(
        "convert",
        help="a checkpoint of any strategy in another layout: one full file, or the folder another strategy resumes",
    )
    converting.add_argument(
        "source", help="what a strategy saved: a DCP folder, a ZeRO folder, Gemini shards, a full file"
    )
    converting.add_argument("out", help="the file or folder to write (it must not exist)")
    converting.add_argument(
        "--to",
        required=True,
        choices=CONVERT_TARGETS,
        help="full: one Lightning checkpoint file with everything a resume restores, which every strategy reads; "
        "fsdp: a DCP folder; deepspeed: DeepSpeed's universal layout, which ZeRO 1, 2 and 3 resume; colossalai: one "
        "full file, which those strategies load as it is",
    )
    converting.add_argument(
        "--drop-optimizer-states",
        action="store_true",
        help="agree to a result without the optimizer states, where the source's layout cannot be read with them "
        "(a ZeRO folder of an optimizer without Adam's moments, which DeepSpeed's universal layout cannot carry); "
        "with --to full from a full file, a copy without them",
    )
    converting.add_argument(
        "--weights-only",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="read pickled data as torch.load(weights_only=...) does (default: torch's default, True)",
    )
    converting.set_defaults(handler=command_convert)


def _add_export_parser(commands: argparse._SubParsersAction) -> None:
    exporting = commands.add_parser(
        "export", help="a checkpoint of any strategy as a Hugging Face folder that from_pretrained loads"
    )
    exporting.add_argument(
        "checkpoint", help="what a strategy saved: a DCP folder, a ZeRO folder, Gemini shards, a file"
    )
    exporting.add_argument("out", help="the folder to write (it must not exist)")
    exporting.add_argument(
        "--config", help="a folder with the model's config.json, for checkpoints saved without a record of the model"
    )
    exporting.add_argument("--prefix", help="the LightningModule attribute holding the model, where there are several")
    exporting.add_argument(
        "--weights-only",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="read pickled data as torch.load(weights_only=...) does (default: torch's default, True)",
    )
    exporting.add_argument("--max-shard-size", default="5GB", help="the largest safetensors file written")
    exporting.set_defaults(handler=command_export)


def _add_plan_parser(commands: argparse._SubParsersAction) -> None:
    planning = commands.add_parser(
        "plan",
        help="which strategy fits a model on this machine (the installed ones, and Lightning's own auto and ddp), "
        "with predicted GPU and host peaks",
    )
    planning.add_argument("--params", help="parameter count, e.g. 13B, 6.7B, 350M (or give --layers and --hidden)")
    planning.add_argument("--layers", type=int, help="decoder blocks (default: a GPT-3 shape for --params)")
    planning.add_argument("--hidden", type=int, help="model width (default: a GPT-3 shape for --params)")
    planning.add_argument("--vocabulary", type=int, default=50304, help="vocabulary size")
    planning.add_argument("--seq-len", type=int, default=1024, help="tokens per sequence")
    planning.add_argument("--micro-batch", type=int, default=8, help="sequences per GPU and step")
    planning.add_argument("--precision", default="bf16-mixed", help="Lightning's precision flag")
    planning.add_argument("--optimizer", default="adam", choices=("adam", "sgd"), help="optimizer state to plan for")
    planning.add_argument(
        "--activation-checkpointing", action="store_true", help="blocks recompute their activations in backward"
    )
    planning.add_argument(
        "--gpus",
        type=int,
        help="GPUs to train on in all, 0 or more (0: on the CPU); on one node unless --nodes says how many "
        "(default: those detected, or torchrun's or SLURM's layout; none here: give --gpu-memory)",
    )
    planning.add_argument(
        "--nodes", type=int, help="nodes the GPUs are spread over, 1 or more (default: 1, or torchrun's or SLURM's)"
    )
    planning.add_argument(
        "--gpus-per-node",
        type=int,
        help="GPUs on each node; with --nodes, --gpus is their product (default: --gpus / --nodes, or detected)",
    )
    planning.add_argument(
        "--gpu-memory",
        dest="gpu_memory_gib",
        metavar="GIB",
        type=float,
        help="GiB per GPU, more than 0 (default: detected; needed with --gpus where no GPU is detected)",
    )
    planning.add_argument(
        "--host-memory",
        dest="host_memory_gib",
        metavar="GIB",
        type=float,
        help="GiB of host memory of each node (default: this one's, detected, cgroup limit)",
    )
    planning.add_argument(
        "--nvme",
        dest="nvme_gib",
        metavar="GIB",
        type=float,
        default=0.0,
        help="GiB of NVMe space for offloading on each node (default: none)",
    )
    planning.add_argument(
        "--json",
        action="store_true",
        help="the plan as a JSON object: workload, machine, ranked candidates, best, advice, suggestions, problems",
    )
    planning.set_defaults(handler=command_plan)


def main(argv: Sequence[str] | None = None) -> int:
    arguments = build_parser().parse_args(argv)
    try:
        status = arguments.handler(arguments)
        sys.stdout.flush()  # a closed pipe shows up here, where it is handled, not at exit
        return status
    except (StrategyLookupError, StrategyConflictError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader left early (`lightning-strategies list | head`): stop quietly, and point
        # stdout at /dev/null so the interpreter's final flush does not raise again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, what a shell reports for a command cut off this way


if __name__ == "__main__":
    raise SystemExit(main())
