"""Token-level replay of MoE routing on a placement, with an expert cache on the
dense GPU for the experts kept in host memory and fetched on use.

Routing. There are no public per-token routing traces with an open licence for
these models (../shared/data/README-new-families.md), so sequences are sampled: in
every layer each token selects ``top-k`` distinct experts by systematic sampling in
a random order, whose inclusion probabilities are exactly the measured per-layer
shares. Tokens and layers are drawn independently (the measured cross-layer
co-occurrence is not used, and tokens carry no temporal locality), which is the
setting in which recency-based caching has the least to work with; say so with
any figure.

Caches (``policy``): ``lru`` (evict the least recently used), ``lfu`` (evict the
least used so far) and ``sparsity`` (sparsity-aware: admit a fetched expert only if
its measured share is above that of the least-share cached one, and evict that
one). Each decode step runs the dense part, then every layer's distinct selected
experts at their placement; the step's time is the sum (no overlap of fetch and
compute). Times ms, energies J.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from energyopt.families.moe_edge.formulations.model import (
    FloatArray,
    IntArray,
    MoeEdgeProblem,
    use_costs,
)
from energyopt.families.moe_edge.spec import MoeEdgePlan

CachePolicy = Literal["lru", "lfu", "sparsity"]
POLICIES: tuple[CachePolicy, ...] = ("lru", "lfu", "sparsity")


def sample_routing(freq: FloatArray, k: int, tokens: int, seed: int) -> IntArray:
    """(tokens, L, k) selected experts; P(token selects e in layer l) = freq[l, e]."""
    rng = np.random.default_rng(seed)
    n_l, n_e = freq.shape
    out = np.zeros((tokens, n_l, k), dtype=np.int64)
    for layer in range(n_l):
        f = np.clip(freq[layer] * (k / freq[layer].sum()), 0.0, 1.0)
        order = np.argsort(rng.random((tokens, n_e)), axis=1)
        cum = np.cumsum(f[order], axis=1)
        points = rng.random((tokens, 1)) + np.arange(k)[None, :]
        pos = (cum[:, None, :] > points[:, :, None]).argmax(axis=2)
        out[:, layer, :] = np.take_along_axis(order, pos, axis=1)
    return out


class ExpertCache:
    """Expert slots on the dense GPU under one policy."""

    def __init__(self, slots: int, policy: CachePolicy, share: FloatArray) -> None:
        self.slots = slots
        self.policy = policy
        self.share = share
        self.held: OrderedDict[int, None] = OrderedDict()
        self.uses = np.zeros(len(share))

    def lookup(self, item: int) -> bool:
        """Whether ``item`` is cached (and record the use)."""
        self.uses[item] += 1
        if item in self.held:
            self.held.move_to_end(item)
            return True
        return False

    def admit(self, item: int) -> None:
        """Offer a just-fetched ``item`` to the cache."""
        if self.slots <= 0:
            return
        if len(self.held) < self.slots:
            self.held[item] = None
            return
        if self.policy == "lru":
            victim = next(iter(self.held))
        elif self.policy == "lfu":
            victim = min(self.held, key=lambda i: (self.uses[i], i))
        else:
            victim = min(self.held, key=lambda i: (self.share[i], i))
            if self.share[item] <= self.share[victim]:
                return
        del self.held[victim]
        self.held[item] = None


@dataclass
class MoeSim:
    """Outcome of one replay."""

    steps: int = 0
    tokens: int = 0
    time_s: float = 0.0
    energy_j: float = 0.0
    step_ms: list[float] = field(default_factory=list)
    pcie_bytes: float = 0.0
    routed: int = 0
    """Token-expert selections replayed."""
    on_gpu: int = 0
    cached: int = 0
    fetched: int = 0
    on_cpu: int = 0
    """Token-expert selections served resident, from the cache, by a fetch, on the CPU."""

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.time_s if self.time_s > 0 else 0.0

    @property
    def energy_per_token_j(self) -> float:
        return self.energy_j / self.tokens if self.tokens else 0.0

    def tbt_percentile_ms(self, q: float) -> float:
        return float(np.percentile(self.step_ms, q)) if self.step_ms else 0.0

    def attainment(self, tbt_ms: float) -> float:
        """Share of decode steps within ``tbt_ms``."""
        return float(np.mean(np.asarray(self.step_ms) <= tbt_ms)) if self.step_ms else 0.0


def simulate(
    p: MoeEdgeProblem,
    plan: MoeEdgePlan,
    routing: IntArray,
    policy: CachePolicy,
    cache_slots: int | None = None,
    fetch_from_tokens: int | None = None,
) -> MoeSim:
    """Replay ``routing`` ((tokens, L, k), tokens in steps of the file's batch) on
    ``plan`` with a ``cache_slots``-expert cache (default the file's ``cache_experts``).

    ``fetch_from_tokens`` (Fiddler's rule): an expert the plan keeps in host memory
    (``fetch`` or ``cpu``) runs on the CPU when fewer tokens than this use it in a
    step and is fetched (not cached) otherwise; Fiddler's cost ratio (7 per CPU
    token vs 70 per fetch) gives 10."""
    config, choice = p.choice_of(plan)
    b = p.spec.batch
    costs = p.costs(config)
    use = use_costs(p, config, b)
    dense_dyn_j = costs.dense_j - costs.static_w * costs.dense_ms / 1e3
    slots = p.spec.cache_experts if cache_slots is None else cache_slots
    cache = ExpertCache(slots, policy, p.freq.ravel())
    n_e = p.n_experts
    out = MoeSim()
    n_tokens = routing.shape[0] - routing.shape[0] % b
    for start in range(0, n_tokens, b):
        step = routing[start : start + b]
        ms = costs.dense_ms
        dyn = dense_dyn_j
        for layer in range(p.n_layers):
            experts, counts = np.unique(step[:, layer, :], return_counts=True)
            for e, n in zip(experts.tolist(), counts.tolist(), strict=True):
                item = layer * n_e + e
                where = int(choice[item])
                out.routed += n
                if fetch_from_tokens is not None and where in (p.fetch, p.cpu):
                    if n < fetch_from_tokens:
                        where = p.cpu
                    else:
                        out.fetched += n
                        out.pcie_bytes += use.fetch_bytes
                        ms += float(use.ms[p.fetch, n])
                        dyn += float(use.dyn_j[p.fetch, n])
                        continue
                if where == p.fetch:
                    if cache.lookup(item):
                        ms += float(use.cached_ms[n])
                        dyn += float(use.cached_j[n])
                        out.cached += n
                        continue
                    cache.admit(item)
                    out.fetched += n
                    out.pcie_bytes += use.fetch_bytes
                elif where == p.cpu:
                    out.on_cpu += n
                else:
                    out.on_gpu += n
                ms += float(use.ms[where, n])
                dyn += float(use.dyn_j[where, n])
        out.steps += 1
        out.tokens += b
        out.step_ms.append(ms)
        out.time_s += ms / 1e3
        out.energy_j += dyn + costs.static_w * ms / 1e3
    return out
