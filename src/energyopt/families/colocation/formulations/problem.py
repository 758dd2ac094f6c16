"""A co-location instance bound to its catalog: GPU types and LLMs resolved."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from energyopt.catalog.loader import Catalog, bind_catalog
from energyopt.families.colocation.spec import ColocationInstance, InferenceJob, TrainingJob
from energyopt.spec.errors import SpecError
from energyopt.spec.hardware import GpuType
from energyopt.spec.io import load
from energyopt.spec.llm import LlmModel


@dataclass(frozen=True)
class ColocationProblem:
    """A validated co-location instance with the GPU types and models it names."""

    instance: ColocationInstance
    catalog: Catalog
    source: str

    @property
    def jobs(self) -> tuple[TrainingJob | InferenceJob, ...]:
        """The jobs in file order."""
        return self.instance.jobs

    def gpu_type(self, name: str) -> GpuType:
        """Catalog GPU type ``name``."""
        return self.catalog.gpu(name)

    def model_of(self, job: TrainingJob | InferenceJob) -> LlmModel:
        """Catalog LLM of ``job``."""
        return self.catalog.model(job.model)

    def type_names(self) -> list[str]:
        """GPU types of the pools, first-seen order."""
        seen: dict[str, None] = {}
        for pool in self.instance.cluster.pools:
            seen.setdefault(pool.type, None)
        return list(seen)

    def gpu_count(self, type_name: str) -> int:
        """GPUs of one type over all pools."""
        return sum(p.count for p in self.instance.cluster.pools if p.type == type_name)

    def idle_power_w(self) -> float:
        """Power of the whole cluster with every GPU idle (W)."""
        return sum(self.gpu_type(p.type).idle_w * p.count for p in self.instance.cluster.pools)

    def usable_memory_gb(self, type_name: str) -> float:
        """Memory per GPU jobs may use, after the reserve (GB)."""
        reserve = self.instance.options.memory_reserve_fraction
        return self.gpu_type(type_name).memory_gb * (1.0 - reserve)


def resolve_colocation(
    instance: ColocationInstance,
    source: str = "<instance>",
    base_dir: Path | None = None,
    extra_catalogs: Sequence[str | Path] = (),
) -> ColocationProblem:
    """Bind ``instance`` to the embedded catalog, its ``catalog:`` files and ``extra_catalogs``.

    Raises SpecError naming ``source`` and the field of every unknown name.
    """
    files = [(f"{source}: catalog[{i}]", Path(rel)) for i, rel in enumerate(instance.catalog)]
    files = [(label, base_dir / p if base_dir and not p.is_absolute() else p) for label, p in files]
    catalog, problems = bind_catalog(files, extra=extra_catalogs)
    for i, pool in enumerate(instance.cluster.pools):
        if pool.type not in catalog.gpus:
            try:
                catalog.gpu(pool.type)
            except KeyError as exc:
                problems.append(f"{source}: cluster.pools[{i}].type: {exc.args[0]}")
    for i, job in enumerate(instance.jobs):
        if job.model not in catalog.models:
            try:
                catalog.model(job.model)
            except KeyError as exc:
                problems.append(f"{source}: jobs[{i}]({job.name}).model: {exc.args[0]}")
    opts = instance.options
    types = {p.type for p in instance.cluster.pools}
    for type_name, clocks in (opts.clocks_mhz or {}).items():
        if type_name not in types:
            problems.append(f"{source}: options.clocks_mhz: GPU type {type_name!r} is in no pool")
        elif type_name in catalog.gpus:
            supported = set(catalog.gpus[type_name].sm_clocks_mhz())
            for clock in clocks:
                if clock not in supported:
                    near = catalog.gpus[type_name].nearest_clocks_mhz(clock)
                    problems.append(
                        f"{source}: options.clocks_mhz.{type_name}: {clock} MHz is not a "
                        f"supported clock (nearest: {', '.join(map(str, near))})"
                    )
    for i, job in enumerate(instance.jobs):
        if not any(job.min_gpus <= n <= job.max_gpus for n in opts.gpu_counts):
            problems.append(
                f"{source}: jobs[{i}]({job.name}): no GPU count of options.gpu_counts "
                f"{list(opts.gpu_counts)} lies in min_gpus..max_gpus "
                f"{job.min_gpus}..{job.max_gpus}"
            )
    if problems:
        raise SpecError(problems)
    return ColocationProblem(instance, catalog, source)


_JOB_TAG = re.compile(r"(jobs\[\d+\](?:\([^)]*\))?)\.(?:training|inference)\b")


def load_colocation(
    path: str | Path, extra_catalogs: Sequence[str | Path] = ()
) -> ColocationProblem:
    """Read, validate and resolve a co-location instance file."""
    p = Path(path)
    try:
        instance = load(ColocationInstance, p)
    except SpecError as exc:
        # the job kind is the union's tag, not a field of the file: leave it out of paths
        raise SpecError([_JOB_TAG.sub(r"\1", line) for line in exc.problems]) from None
    return resolve_colocation(instance, str(p), p.parent, extra_catalogs)
