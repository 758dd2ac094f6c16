"""A fleet instance bound to its catalog: names resolved, GPUs enumerated (the shared
fleet model that the serving family, the performance model and the simulator read)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from energyopt.catalog.loader import Catalog, bind_catalog
from energyopt.catalog.profiles import MeasuredProfile, read_profile
from energyopt.spec.checks import instance_problems
from energyopt.spec.cluster import Gpu
from energyopt.spec.errors import SpecError
from energyopt.spec.hardware import GpuType
from energyopt.spec.instance import Instance
from energyopt.spec.io import load
from energyopt.spec.llm import LlmModel
from energyopt.spec.workload import Workload


@dataclass(frozen=True)
class Problem:
    """A validated instance with every GPU type and model it names."""

    instance: Instance
    catalog: Catalog
    source: str
    profiles: dict[tuple[str, str], MeasuredProfile] = field(default_factory=dict)

    @property
    def gpus(self) -> list[Gpu]:
        """Every GPU of the cluster, in file order (a new list each call)."""
        return list(self._gpus)

    @cached_property
    def _gpus(self) -> tuple[Gpu, ...]:
        """The cluster's GPUs, expanded once per problem: ``Cluster.gpus`` validates a
        ``Gpu`` for each, and solvers and the verifier ask for them dozens of times
        (a mutated fleet of thousands of GPUs took a minute). The instance is frozen."""
        return tuple(self.instance.cluster.gpus())

    def gpu_type(self, name: str) -> GpuType:
        """Catalog GPU type ``name``."""
        return self.catalog.gpu(name)

    def model_of(self, workload: Workload) -> LlmModel:
        """Catalog model of ``workload``."""
        return self.catalog.model(workload.model)

    def with_instance(self, instance: Instance) -> Problem:
        """A problem derived from this one (rates, options, cluster changed), bound to
        the same catalog and measured profiles: entries from ``--catalog`` and the
        instance's own catalog files, and their overrides of built-in ones, stay.
        SpecError naming ``source`` if the derived instance names what the catalog lacks."""
        types = {e.type for n in instance.cluster.nodes for e in n.gpus}
        models = {w.model for w in instance.workloads}
        missing = [f"GPU type {t!r}" for t in sorted(types - set(self.catalog.gpus))]
        missing += [f"model {m!r}" for m in sorted(models - set(self.catalog.models))]
        if missing:
            raise SpecError([f"{self.source}: not in the bound catalog: {', '.join(missing)}"])
        return Problem(instance, self.catalog, self.source, self.profiles)

    def gpu_types_used(self) -> list[str]:
        """Names of the GPU types present in the cluster, in first-seen order."""
        seen: dict[str, None] = {}
        for gpu in self.gpus:
            seen.setdefault(gpu.type, None)
        return list(seen)


def resolve(
    instance: Instance,
    source: str = "<instance>",
    base_dir: Path | None = None,
    extra_catalogs: Sequence[str | Path] = (),
) -> Problem:
    """Bind ``instance`` to the embedded catalog plus its own catalog files and entries.

    Later sources override earlier ones by name: the embedded catalog, the
    instance's ``catalog:`` files, its inline ``gpu_types``/``models``, then
    ``extra_catalogs`` (the command line's ``--catalog``). Raises SpecError
    naming ``source`` and the field of every unknown name.
    """
    files = []
    for i, rel in enumerate(instance.catalog):
        path = Path(rel)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        files.append((f"{source}: catalog[{i}]", path))
    catalog, problems = bind_catalog(files, instance.gpu_types, instance.models, extra_catalogs)
    for n, node in enumerate(instance.cluster.nodes):
        for e, entry in enumerate(node.gpus):
            if entry.type not in catalog.gpus:
                try:
                    catalog.gpu(entry.type)
                except KeyError as exc:
                    field = f"cluster.nodes[{n}]({node.name}).gpus[{e}].type"
                    problems.append(f"{source}: {field}: {exc.args[0]}")
    for w, wl in enumerate(instance.workloads):
        field = f"workloads[{w}]({wl.name})"
        if wl.model not in catalog.models:
            try:
                catalog.model(wl.model)
            except KeyError as exc:
                problems.append(f"{source}: {field}.model: {exc.args[0]}")
    phases = {w.name: w.phases() for w in instance.workloads}
    for gpu in instance.cluster.gpus():
        if gpu.state is None:
            continue
        for placement in gpu.state.placements:
            where = f"{source}: GPU {gpu.id} state.placements"
            if placement.workload not in phases:
                problems.append(f"{where}: unknown workload {placement.workload!r}")
            elif placement.phase not in phases[placement.workload]:
                problems.append(
                    f"{where}: workload {placement.workload!r} has phases "
                    f"{', '.join(phases[placement.workload])}, not {placement.phase!r}"
                )
    if instance.options.clocks_mhz:
        for type_name, clocks in instance.options.clocks_mhz.items():
            if type_name not in catalog.gpus:
                problems.append(f"{source}: options.clocks_mhz: unknown GPU type {type_name!r}")
                continue
            problems.extend(
                f"{source}: {p}"
                for p in _unsupported_clocks(catalog.gpus[type_name], clocks, type_name)
            )
    for n, node in enumerate(instance.cluster.nodes):
        for e, entry in enumerate(node.gpus):
            gtype = catalog.gpus.get(entry.type)
            if gtype is None or entry.power_cap_w is None:
                continue
            if entry.power_cap_w < gtype.power_limit_min_w:
                field = f"cluster.nodes[{n}]({node.name}).gpus[{e}].power_cap_w"
                problems.append(
                    f"{source}: {field}: {entry.power_cap_w:g} W is below the lowest power "
                    f"limit of {gtype.name} ({gtype.power_limit_min_w:g} W); such a GPU cannot "
                    "be held under its cap"
                )
    profiles: dict[tuple[str, str], MeasuredProfile] = {}
    for i, ref in enumerate(instance.profiles):
        where = f"{source}: profiles[{i}]"
        if ref.gpu not in catalog.gpus or ref.model not in catalog.models:
            problems.append(f"{where}: unknown GPU type {ref.gpu!r} or model {ref.model!r}")
            continue
        path = Path(ref.file)
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        clock = ref.clock_mhz or catalog.gpus[ref.gpu].default_sm_clock_mhz
        try:
            profiles[(ref.gpu, ref.model)] = read_profile(path, ref.gpu, ref.model, clock)
        except SpecError as exc:
            problems.extend(f"{where}: {p}" for p in exc.problems)
    # The catalog-dependent ranges (context length, TP sizes, MIG names, current
    # clocks) hold for library callers exactly as for the command line.
    problems.extend(instance_problems(instance, catalog.gpus, catalog.models, source))
    if problems:
        raise SpecError(problems)
    return Problem(instance, catalog, source, profiles)


def _unsupported_clocks(gtype: GpuType, clocks: Sequence[int], type_name: str) -> list[str]:
    """Problems with the candidate clocks given for one GPU type (MHz)."""
    field = f"options.clocks_mhz.{type_name}"
    if not clocks:
        return [f"{field}: no clock given"]
    supported = set(gtype.sm_clocks_mhz())
    return [
        f"{field}: {clock} MHz is not a supported SM clock of {gtype.name}; nearest supported: "
        f"{', '.join(str(c) for c in gtype.nearest_clocks_mhz(clock))} MHz"
        for clock in clocks
        if clock not in supported
    ]


def load_problem(path: str | Path, extra_catalogs: Sequence[str | Path] = ()) -> Problem:
    """Read, validate and resolve an instance file (see ``resolve`` for catalogs)."""
    p = Path(path)
    instance = load(Instance, p)
    return resolve(instance, str(p), p.parent, extra_catalogs)
