"""Files that are not problems but describe work on one: compile specs (``kind:
plans`` / ``oppoints``, for ``energyopt compile``) and evaluation specs (``kind:
evaluate``, for ``energyopt evaluate``). ``validate`` checks them and their base
instance; ``solve`` on one says which command runs it."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from energyopt.spec.errors import SpecError


def validate_compile_spec(path: str, catalogs: Sequence[str]) -> str:
    """One-line summary of a valid compile spec; SpecError naming the file and field.

    A compile spec's base instance names its catalog, so extra catalogs are refused."""
    from energyopt.solvers.presets import load_preset
    from energyopt.tables.spec import load_checked

    if catalogs:
        raise SpecError([f"{path}: --catalog: a compile spec's base instance names its catalog"])
    spec, base, problem = load_checked(path)
    if spec.kind == "oppoints":
        types = len(spec.gpu_types) or len(problem.gpu_types_used())
        return (
            f"oppoints compile spec: base {base.name}, {len(problem.instance.workloads)} "
            f"workloads, {types} GPU types, {max(len(spec.slo_tiers), 1)} SLO tiers, "
            f"{spec.load_points} load points"
        )
    try:
        load_preset(spec.solver)
    except SpecError as exc:
        raise SpecError(
            [f"{path}: solver: {line.removeprefix('--solver: ')}" for line in exc.problems]
        ) from None
    return f"plans compile spec: base {base.name}, {spec.cells()} cells, solver {spec.solver}"


def validate_evaluation(path: str, catalogs: Sequence[str]) -> str:
    """One-line summary of a valid evaluation spec; its base instance is checked too."""
    from energyopt.families.serving.family import load_instance
    from energyopt.sim.trace import read_trace
    from energyopt.solvers.presets import load_preset
    from energyopt.spec.evaluation import load_evaluation, resolve_relative

    ev = load_evaluation(path)
    base = resolve_relative(path, ev.base)
    if not base.is_file():
        raise SpecError([f"{path}: base: no such file {base}"])
    problem = load_instance(str(base), catalogs, check_slos=False)
    if ev.load.kind == "trace":
        trace = resolve_relative(path, ev.load.file)
        if not trace.is_file():
            raise SpecError([f"{path}: load.file: no such file {trace}"])
        read_trace(trace)
    for i, planner in enumerate(ev.planners):
        if planner.latency_margin == "calibrated":
            from energyopt.spec.checks import calibrated_margin_problems

            used = sorted({e.type for node in problem.instance.cluster.nodes for e in node.gpus})
            where = f"{path}: planners[{i}]({planner.name})"
            margin = calibrated_margin_problems(used, problem.catalog.gpus, where)
            if margin:
                raise SpecError(margin)
        if planner.kind == "table":
            continue
        try:
            load_preset(planner.solver)
        except SpecError as exc:
            raise SpecError(
                [f"{path}: planners[{i}]({planner.name}): {p}" for p in exc.problems]
            ) from None
    return (
        f"evaluation spec: base {base.name} ({len(problem.gpus)} GPUs), {ev.load.kind} load, "
        f"{ev.duration_s:g} s, {len(ev.planners)} planners"
    )


def validate_preset(path: str, catalogs: Sequence[str]) -> str:
    """One-line summary of a valid solver preset file (``solvers/*.toml``)."""
    from energyopt.solvers.presets import SolverPreset, load_preset
    from energyopt.spec.io import parse, read_data

    if Path(path).suffix == ".toml":
        preset = load_preset(path)
    else:
        data = read_data(path)
        data.setdefault("name", Path(path).stem)
        preset = parse(SolverPreset, data, path)
    return f"solver preset {preset.name}: backend {preset.backend}, {preset.formulation}"


def validate_catalog_entry(path: str, catalogs: Sequence[str]) -> str:
    """One-line summary of a valid catalog file (top-level ``gpus:`` / ``models:``
    lists) or one catalog entry (a GPU type or an LLM, as in ``models/``)."""
    from energyopt.catalog.loader import load_catalog_file
    from energyopt.spec.hardware import GpuType
    from energyopt.spec.io import parse, read_data
    from energyopt.spec.llm import LlmModel

    data = read_data(path)
    shape = catalog_shape(data)
    if shape == "gpu":
        gpu = parse(GpuType, data, path)
        return f"GPU type {gpu.name}: {gpu.sm_count} SMs, {gpu.memory_gb:g} GB, {gpu.tdp_w:g} W TDP"
    if shape == "llm":
        model = parse(LlmModel, data, path)
        return f"LLM {model.name}: {model.layers} layers, {model.params_total_b:g} B parameters"
    gpus, models = load_catalog_file(path)
    return f"catalog file: {len(gpus)} GPU types, {len(models)} LLMs"


def catalog_shape(data: Mapping[str, Any]) -> str | None:
    """For a file without ``kind:``: ``solver-preset``, ``catalog``, ``gpu`` or ``llm``
    when its top-level keys are those of a solver preset (``backend``), a catalog file
    (only ``gpus`` / ``models``) or a catalog entry (``sm_count``: a GPU type;
    ``hidden_size``: an LLM); None otherwise (a serving instance)."""
    if "backend" in data:
        return "solver-preset"
    if data and set(data) <= {"gpus", "models"}:
        return "catalog"
    if "sm_count" in data:
        return "gpu"
    if "hidden_size" in data:
        return "llm"
    return None


Validator = Callable[[str, Sequence[str]], str]

DOCUMENTS: dict[str, tuple[Validator, str]] = {
    "plans": (
        validate_compile_spec,
        "this is a compile spec; build its table with `energyopt compile {path} -o TABLE.eot` "
        "(--workers N for parallel cells)",
    ),
    "oppoints": (
        validate_compile_spec,
        "this is a compile spec; build its table with `energyopt compile {path} -o TABLE.eot` "
        "(--workers N for parallel cells)",
    ),
    "evaluate": (
        validate_evaluation,
        "this is an evaluation spec; run it with `energyopt evaluate {path}`",
    ),
    "solver-preset": (
        validate_preset,
        "this is a solver preset; use it with `energyopt solve PROBLEM --solver {path}`",
    ),
    "catalog": (
        validate_catalog_entry,
        "this is a catalog file; name it in an instance's `catalog:` or pass `--catalog {path}`",
    ),
    "gpu": (
        validate_catalog_entry,
        "this is a catalog entry (a GPU type); put it in a catalog file's `gpus:` list "
        "and pass that with `--catalog`",
    ),
    "llm": (
        validate_catalog_entry,
        "this is a catalog entry (an LLM); put it in a catalog file's `models:` list "
        "and pass that with `--catalog`",
    ),
}
"""kind -> (validator, what to run instead of solve)."""


def expect_document(path: str, kinds: Sequence[str], command: str) -> None:
    """SpecError naming ``kind`` when ``path`` is not one of the document ``kinds``
    that ``command`` runs, with the command that does take the file: without this, a
    problem file handed to ``energyopt evaluate`` was refused field by field."""
    from energyopt.spec.io import data_kind, read_data

    kind = data_kind(read_data(path), path)
    if kind in kinds:
        return
    wanted = " or ".join(f"kind: {k}" for k in kinds)
    if kind in DOCUMENTS:
        hint = DOCUMENTS[kind][1].format(path=path)
        raise SpecError([f"{path}: kind: `energyopt {command}` takes {wanted}; {hint}"])
    raise SpecError(
        [
            f"{path}: kind: `energyopt {command}` takes {wanted}, and this is a {kind} "
            f"problem file; solve it with `energyopt solve {path}`"
        ]
    )


def not_a_problem(path: str, kind: str, catalogs: Sequence[str]) -> SpecError:
    """The error ``solve``, ``show`` and ``verify`` give for a document (validated first)."""
    validate, hint = DOCUMENTS[kind]
    validate(path, catalogs)
    return SpecError([f"{path}: kind: {hint.format(path=path)}"])
