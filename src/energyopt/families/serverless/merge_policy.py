"""The online decode-merge policy of the serverless simulator and the record of
one decision it takes.

``MergePolicy`` holds the policy's settings: how often it looks (s), how full it
fills a target (share of its batch at SLO capacity), the headroom over the
observed rate (share), the windows the rates are observed over (s), the prices
of a migrated GB and of a second a migrated request stalls (in the objective's
unit: GPU-s for the GPU-seconds objective), the largest candidate set the merge
MILP decides ((request, destination) pairs) and its time limit (s), and the
in-epoch prefill scaling. It poses the merge problem
(``formulations.merge.merge_problem``) and decides it
(``solvers.merge.decide_merge``). ``MergeRecord`` is one decision of a replay:
its time (s), its inputs (rates in requests/s, seconds left in the epoch) and
what it decided. The simulator (``sim``) applies the decisions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from energyopt.families.serverless.formulations.merge import (
    DecodeFigures,
    MergeProblem,
    Snapshot,
    merge_problem,
)
from energyopt.families.serverless.solvers.merge import (
    MAX_PAIRS,
    MILP_TIME_LIMIT_S,
    MergeOutcome,
    decide_merge,
)
from energyopt.perf.kvtransfer import Link


@dataclass(frozen=True)
class MergePolicy:
    """Online decode merging: how often it looks, how full it fills a target (share
    of its batch at SLO capacity), the headroom it keeps over the observed rate
    (mean over the last ``rate_window_s``), the prices of a migrated GB and of a
    second a migrated request stalls (in the objective's unit: GPU-s for the
    GPU-seconds objective) and the largest candidate set, in (request, destination)
    pairs, that the merge MILP decides (``max_pairs`` 0: the greedy always).

    A negative ``headroom`` (above -1) keeps decode instances at more than their
    planned capacity: ``load_fraction - 1`` keeps them at their modelled SLO
    capacity (the planned capacity / load fraction) for both the observed rate and,
    at an epoch boundary, the epoch's forecast.

    With ``prefill_headroom`` set, the policy also scales prefill inside an epoch:
    the prefill instances kept must cover the rate observed over the last
    ``prefill_window_s`` times (1 + ``prefill_headroom``); spare ones are released
    when idle, and short capacity is met by taking back one that is still up or by
    starting one of the plan's prefill pools (cold), also at once when a prompt
    would wait more than ``prefill_wait_s``. An instance goes only where the others
    cover the need with ``prefill_release_margin`` to spare (hysteresis: a start
    costs a cold load, so instances do not flap). It releases prefill below the plan
    only while the epoch's forecast is at most ``surge_ratio`` times the need
    observed: a larger forecast announces a surge within the epoch that a cold
    start could not follow, so the plan's instances stay. ``None``: prefill
    follows the plan.

    With ``forecast_ceiling``, the epoch's forecast (the file's demand, the rate the
    plan is made for) bounds the need from above: decode instances are kept for at
    most the forecast (at the capacity the headroom keeps them at), always; prefill
    instances at an epoch boundary for at most the forecast, with no release margin
    on it, so that what a burst that has ended leaves goes when the next epoch's
    forecast says the burst is over (inside an epoch prefill keeps its margin: a
    prompt queue feels rate spikes shorter than the forecast's window).

    With ``prefill_attainment`` set as well, the prefill instances kept are sized at
    their modelled SLO capacity (the planned capacity / the file's load fraction)
    while the share of prompts whose first token came out within the TTFT SLO over
    the last ``attainment_window_s`` is at least ``prefill_attainment``, and at their
    planned capacity otherwise (and while no prompt has come out in the window): the
    load fraction's reserve covers the prompt-length spread that the queueing model
    leaves out, and what that spread costs on a given load shows in the TTFTs
    observed (a first token's time is known when it is sent). The surge gate's test
    reads the need at planned capacity either way."""

    merge_interval_s: float = 5.0
    fill: float = 0.9
    headroom: float = 0.25
    rate_window_s: float = 20.0
    price_per_gb: float = 0.01
    price_per_stall_s: float = 1.0
    max_pairs: int = MAX_PAIRS
    milp_time_limit_s: float = MILP_TIME_LIMIT_S
    prefill_headroom: float | None = None
    prefill_window_s: float = 20.0
    prefill_wait_s: float = 0.25
    prefill_release_margin: float = 0.0
    surge_ratio: float = 1.5
    forecast_ceiling: bool = False
    prefill_attainment: float | None = None
    attainment_window_s: float = 60.0

    def __post_init__(self) -> None:
        if self.headroom <= -1:
            raise ValueError(f"headroom {self.headroom} is -1 or less")
        if self.prefill_headroom is not None and self.prefill_headroom < 0:
            raise ValueError(f"prefill_headroom {self.prefill_headroom} is negative")
        if self.surge_ratio < 1:
            raise ValueError(f"surge_ratio {self.surge_ratio} is below 1")
        if self.prefill_window_s <= 0 or self.prefill_wait_s < 0:
            raise ValueError("prefill_window_s must be positive, prefill_wait_s not negative")
        if self.prefill_attainment is not None and not 0 < self.prefill_attainment <= 1:
            raise ValueError(f"prefill_attainment {self.prefill_attainment} is not in (0, 1]")
        if self.attainment_window_s <= 0:
            raise ValueError(f"attainment_window_s {self.attainment_window_s} is not positive")

    def problem(
        self,
        snapshots: tuple[Snapshot, ...],
        figures: Mapping[int, DecodeFigures],
        *,
        need_rps: float,
        other_capacity_rps: float,
        remaining_s: float,
        max_batch: int,
        links: tuple[Link, Link],
    ) -> MergeProblem:
        """The merge problem this policy poses on a model's decode instances
        (``snapshots``) from their options' decode figures (by option index)."""
        return merge_problem(
            snapshots,
            figures,
            need_rps=need_rps,
            other_capacity_rps=other_capacity_rps,
            remaining_s=remaining_s,
            fill=self.fill,
            max_batch=max_batch,
            price_per_gb=self.price_per_gb,
            price_per_stall_s=self.price_per_stall_s,
            links=links,
        )

    def decide(self, prob: MergeProblem) -> MergeOutcome:
        """The decision this policy takes: the merge MILP within ``max_pairs``, else the
        priced greedy."""
        return decide_merge(prob, max_pairs=self.max_pairs, time_limit_s=self.milp_time_limit_s)


@dataclass(frozen=True)
class MergeRecord:
    """One merge decision of a replay: when, for which model, the inputs the decision
    read (candidates, the need and the capacity still loading, the seconds left in
    the epoch), what it decided (names released, request id -> name) and whose
    decision it took (``milp`` or ``greedy``)."""

    time_s: float
    model: int
    snapshots: tuple[Snapshot, ...]
    need_rps: float
    other_capacity_rps: float
    remaining_s: float
    released: frozenset[str]
    moves: Mapping[int, str]
    method: str
