"""MIG layouts: which sets of GPU-instance profiles one GPU can hold, by placement.

A MIG-capable GPU has ``mig_memory_slices`` memory slices (8 on A100, H100 and H200)
and ``mig_total_slices`` compute slices (7). A GPU instance of a profile occupies
``memory_slices`` consecutive memory slices starting at one of the profile's allowed
``placements`` (NVML ``nvmlGpuInstancePlacement_t``: start = first memory slice,
size = memory slices); the driver refuses an instance whose memory slices overlap
an existing one. A layout is feasible when every instance gets a start of its own
with no overlap, within each profile's ``max_instances``. The performance model, the
verifier and the executor's planner all decide MIG feasibility here, so a layout the
verifier accepts is one the driver can create.

For the solvers, whose SM-share constraint is one knapsack per GPU, each profile is
given ``share_units`` with a ``capacity`` such that the knapsack holds exactly when
both the memory and the compute slices fit; ``aggregate_is_exact`` checks, by
enumerating every multiset, that this equals placement feasibility for a GPU type.
"""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Iterable, Sequence

from energyopt.spec.hardware import GpuType, MigProfile

#: (profile name, start memory slice) of one GPU instance.
Placed = tuple[str, int]


def memory_slices(gpu: GpuType, profile: MigProfile) -> int:
    """Memory slices one instance of ``profile`` occupies (its data, else its memory share)."""
    if profile.memory_slices is not None:
        return profile.memory_slices
    share = profile.memory_gb / gpu.memory_gb * gpu.mig_memory_slices
    return max(1, min(gpu.mig_memory_slices, round(share)))


def starts(gpu: GpuType, profile: MigProfile) -> tuple[int, ...]:
    """Allowed start memory slices of ``profile`` (its data, else aligned to its size)."""
    size = memory_slices(gpu, profile)
    if profile.placements:
        return tuple(
            s for s in sorted(set(profile.placements)) if s + size <= gpu.mig_memory_slices
        )
    return tuple(range(0, gpu.mig_memory_slices - size + 1, size))


def place(gpu: GpuType, names: Sequence[str], fixed: Sequence[Placed] = ()) -> list[Placed] | None:
    """A start for every instance of ``names`` beside the ``fixed`` ones, or None.

    Instances are placed largest first, each at the lowest free allowed start
    (backtracking over the alternatives), so the result is deterministic. The
    returned list is in creation order and holds only the new instances. Raises
    KeyError for a profile the GPU does not have.
    """
    profiles = {p.name: p for p in gpu.mig_profiles}
    for name in list(names) + [n for n, _ in fixed]:
        if name not in profiles:
            raise KeyError(name)
    used = [False] * gpu.mig_memory_slices
    for name, start in fixed:
        for s in range(start, start + memory_slices(gpu, profiles[name])):
            if s >= len(used) or used[s]:
                return None
            used[s] = True
    order = sorted(
        names,
        key=lambda n: (-memory_slices(gpu, profiles[n]), -profiles[n].compute_slices, n),
    )
    out: list[Placed] = []

    def search(i: int) -> bool:
        if i == len(order):
            return True
        prof = profiles[order[i]]
        size = memory_slices(gpu, prof)
        lowest = out[-1][1] + 1 if i > 0 and order[i - 1] == order[i] else 0
        for start in starts(gpu, prof):
            if start < lowest or any(used[start : start + size]):
                continue
            used[start : start + size] = [True] * size
            out.append((prof.name, start))
            if search(i + 1):
                return True
            out.pop()
            used[start : start + size] = [False] * size
        return False

    return out if search(0) else None


def layout_problem(gpu: GpuType, names: Iterable[str]) -> str | None:
    """Why the MIG layout ``names`` (profile names, repeats allowed) cannot be created.

    None when it can. The reason names the first unknown profile, a profile with
    more instances than the GPU takes, or the compute and memory slices used.
    """
    names = list(names)
    known = {p.name: p for p in gpu.mig_profiles}
    for name in names:
        if name not in known:
            listed = ", ".join(known) or "none"
            return f"{gpu.name} has no MIG profile {name!r} (profiles: {listed})"
    counts = Counter(names)
    for name, count in sorted(counts.items()):
        if count > known[name].max_instances:
            return (
                f"{count} instances of {name}, but a {gpu.name} takes at most "
                f"{known[name].max_instances}"
            )
    if sum(1 for n in names if known[n].media_extensions) > 1:
        return "more than one +me instance: a GPU has one set of media engines"
    compute = sum(known[n].compute_slices for n in names)
    memory = sum(memory_slices(gpu, known[n]) for n in names)
    if (
        compute > gpu.mig_total_slices
        or memory > gpu.mig_memory_slices
        or (place(gpu, names) is None)
    ):
        return (
            f"the MIG layout {' + '.join(sorted(names))} uses {compute} of "
            f"{gpu.mig_total_slices} compute slices and {memory} of {gpu.mig_memory_slices} "
            "memory slices; no placement of these instances fits the GPU (NVIDIA's allowed "
            "start positions)"
        )
    return None


def share_base(gpu: GpuType) -> int:
    """Weight of one memory slice in ``share_units`` (one more than the compute slices)."""
    return gpu.mig_total_slices + 1


def share_units(gpu: GpuType, profile: MigProfile) -> int:
    """Knapsack weight of one instance: ``base * memory slices + compute slices``."""
    return share_base(gpu) * memory_slices(gpu, profile) + profile.compute_slices


def share_capacity(gpu: GpuType) -> int:
    """Knapsack capacity: ``base * memory slices + compute slices`` of the whole GPU.

    With every profile's compute slices at most its memory slices, a set of
    instances fits this capacity exactly when its memory slices fit and its
    compute slices fit.
    """
    return share_base(gpu) * gpu.mig_memory_slices + gpu.mig_total_slices


def aggregate_is_exact(gpu: GpuType, names: Sequence[str] | None = None) -> tuple[str, ...] | None:
    """None when the knapsack of ``share_units`` equals placement feasibility.

    Checked over every multiset of the profiles ``names`` (default all) within
    their instance limits (and at most one +me instance); otherwise the first
    layout on which the two disagree.
    """
    profiles = [p for p in gpu.mig_profiles if names is None or p.name in names]
    ranges = [range(p.max_instances + 1) for p in profiles]
    cap = share_capacity(gpu)
    for counts in itertools.product(*ranges):
        pairs = list(zip(profiles, counts, strict=True))
        if sum(c for p, c in pairs if p.media_extensions) > 1:
            continue
        layout = [p.name for p, c in pairs for _ in range(c)]
        if not layout:
            continue
        fits = sum(share_units(gpu, p) * c for p, c in pairs) <= cap
        if fits != (layout_problem(gpu, layout) is None):
            return tuple(layout)
    return None
