"""Checks of a file against the catalog entries it names (GPU types, LLMs).

A schema checks each field alone; these need the catalog: a current clock
within the GPU type's range, a prompt that fits the model's context, tensor-
parallel sizes the model and the nodes allow, MIG profiles the GPU types have,
and plans whose GPU types, MIG profiles and sharing mode match. Every function
returns 'source: field: message' lines (empty when all is well), so that
``validate`` reports exactly what ``solve``, ``compile``, ``evaluate``,
``verify`` and ``apply`` would refuse.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping

from energyopt.spec.hardware import GpuType
from energyopt.spec.instance import Instance
from energyopt.spec.llm import LlmModel
from energyopt.spec.plan import Plan


def _close(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.4)
    return f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""


def instance_problems(
    instance: Instance,
    gpus: Mapping[str, GpuType],
    models: Mapping[str, LlmModel],
    source: str,
) -> list[str]:
    """Problems of a serving instance with its resolved catalog (names it does not
    resolve are reported by the resolver and skipped here)."""
    problems: list[str] = []
    for n, node in enumerate(instance.cluster.nodes):
        for e, entry in enumerate(node.gpus):
            gtype = gpus.get(entry.type)
            state = entry.state
            if gtype is None or state is None or state.clock_mhz is None:
                continue
            if not gtype.min_sm_clock_mhz <= state.clock_mhz <= gtype.max_sm_clock_mhz:
                problems.append(
                    f"{source}: cluster.nodes[{n}]({node.name}).gpus[{e}].state.clock_mhz: "
                    f"{state.clock_mhz} MHz is outside {gtype.name}'s range "
                    f"{gtype.min_sm_clock_mhz}..{gtype.max_sm_clock_mhz} MHz"
                )
    largest_node = max(sum(e.count for e in node.gpus) for node in instance.cluster.nodes)
    for w, wl in enumerate(instance.workloads):
        where = f"{source}: workloads[{w}]({wl.name})"
        model = models.get(wl.model)
        if model is None:
            continue
        prompt, output = wl.prompt_tokens, wl.output_tokens
        longest = (prompt.max or prompt.mean) + (output.max or output.mean)
        if longest > model.max_context:
            problems.append(
                f"{where}.prompt_tokens: prompt + output of up to {longest:g} tokens exceed "
                f"{model.name}'s context of {model.max_context} tokens"
            )
        sizes = wl.tensor_parallel or ()
        for size in sizes:
            if model.heads % size:
                problems.append(
                    f"{where}.tensor_parallel: size {size} does not divide {model.name}'s "
                    f"{model.heads} attention heads"
                )
        if sizes and min(sizes) > largest_node:
            problems.append(
                f"{where}.tensor_parallel: every size needs more GPUs than the largest node "
                f"has ({largest_node})"
            )
    sharing = instance.options.sharing
    if sharing.mode == "mig" or sharing.mig_profiles is not None:
        types = {e.type for node in instance.cluster.nodes for e in node.gpus}
        known = sorted({p.name for t in types if t in gpus for p in gpus[t].mig_profiles})
        if sharing.mode == "mig" and not known:
            problems.append(
                f"{source}: options.sharing.mode: mig, but no GPU type of the cluster "
                f"({', '.join(sorted(types))}) has MIG profiles"
            )
        for i, name in enumerate(sharing.mig_profiles or ()):
            if known and name not in known:
                problems.append(
                    f"{source}: options.sharing.mig_profiles[{i}]: no GPU type of the cluster "
                    f"has MIG profile {name!r}{_close(name, known)} (known: {', '.join(known)})"
                )
    if instance.options.latency_margin == "calibrated":
        used = sorted({e.type for node in instance.cluster.nodes for e in node.gpus})
        problems.extend(calibrated_margin_problems(used, gpus, f"{source}: options"))
    return problems


def calibrated_margin_problems(
    types: list[str], gpus: Mapping[str, GpuType], where: str
) -> list[str]:
    """``latency_margin: calibrated`` plans each GPU type with its measured
    ``efficiency.latency_error``; a type whose error is 0 (the default: never measured)
    would be planned with no margin at all, so it is a problem naming ``where``."""
    return [
        f"{where}.latency_margin: calibrated, but GPU type {name} has no measured latency "
        f"error (its efficiency.latency_error is 0); give it one, or a number for "
        "latency_margin"
        for name in types
        if name in gpus and gpus[name].efficiency.latency_error <= 0
    ]


def plan_problems(
    plan: Plan,
    gpus: Mapping[str, GpuType],
    source: str,
    sharing_mode: str | None = None,
) -> list[str]:
    """Problems of a plan that no check of its numbers can get past: GPU types the
    catalog lacks, MIG profiles the type does not have, MIG profiles in a plan for
    an instance that shares by MPS (``sharing_mode``, when the instance is known)."""
    problems: list[str] = []
    for i, gp in enumerate(plan.gpus):
        where = f"{source}: gpus[{i}]({gp.gpu})"
        gtype = gpus.get(gp.type)
        if gtype is None:
            problems.append(
                f"{where}.type: unknown GPU type {gp.type!r}{_close(gp.type, sorted(gpus))} "
                f"(add it with --catalog)"
            )
            continue
        profiles = {p.name for p in gtype.mig_profiles}
        for k, placement in enumerate(gp.placements):
            name = placement.mig_profile
            if name is None:
                continue
            field = f"{where}.placements[{k}].mig_profile"
            if sharing_mode is not None and sharing_mode != "mig":
                problems.append(
                    f"{field}: {name} is a MIG profile, but the instance shares GPUs by "
                    f"{sharing_mode}"
                )
            elif name not in profiles:
                known = ", ".join(sorted(profiles)) or "none"
                problems.append(
                    f"{field}: {gtype.name} has no MIG profile {name!r} (known: {known})"
                )
    return problems
