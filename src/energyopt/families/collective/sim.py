"""Collectives running while the cluster's health changes: the hot-swap rule.

A trace of collectives runs in order (sequence numbers 0, 1, ...), back to back.
Health changes at given times; each rank learns of a change after its own
delay. Rules for when a rank switches to the schedule the policy gives for the
new state:

- ``agreed``: the first rank to learn of a change stamps it with sequence number
  s + ``lag`` where s is the collective running when it learns; the stamp travels
  with the next collective's launch (every rank has it once that collective has
  started), and every rank switches at the stamped number (the earliest stamp of
  a change, should two ranks stamp it). With ``lag`` 2 every rank has every stamp
  that applies to a collective before that collective starts.
- ``eager``: each rank switches as soon as it learns (ranks disagree for a while:
  a collective run with different schedules on different ranks is a mismatch;
  in a real system it hangs or corrupts data);
- ``static``: never switches (the schedule for the healthy state);
- ``oracle``: every rank switches at once when health changes (a bound, not a rule).

Each collective costs the cost model's time of the schedule it runs under the
health in force when it starts (collective.md, section 6).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from energyopt.families.collective.formulations.model import CollectiveProblem
from energyopt.families.collective.solvers.select import Evaluator, Structure
from energyopt.families.collective.spec import Choice, Collective, Health
from energyopt.families.collective.tables import Policy, localize, summarize

Rule = Literal["agreed", "eager", "static", "oracle"]
AGREED_LAG = 2


@dataclass(frozen=True)
class HealthEvent:
    """Health becomes ``health`` at ``time_us``; rank r learns of it ``delay_us[r]`` later."""

    time_us: float
    health: Health
    delay_us: tuple[float, ...]


@dataclass
class SwapRun:
    """What one rule did over the trace."""

    rule: Rule
    total_us: float = 0.0
    mismatches: int = 0
    """Collectives that ranks ran with different schedules."""
    switches: int = 0
    per_collective_us: list[float] = field(default_factory=list)
    switch_seq: list[int] = field(default_factory=list)
    """Sequence numbers where rank 0 moves to the policy of another health state."""
    acting: int = 0
    """The health state rank 0 acts on."""
    changed: int = 0
    """Collectives whose schedule differs from the one for the healthy state."""


def _key(c: Choice) -> tuple[object, ...]:
    return (c.algorithm, c.protocol, c.chunks, c.channels, c.order, c.leaves, c.rail_weights)


def simulate(
    p: CollectiveProblem,
    policy: Policy,
    trace: list[Collective],
    events: list[HealthEvent],
    rule: Rule,
) -> SwapRun:
    """Run ``trace`` under ``events`` with one rule."""
    run = SwapRun(rule)
    states = [Health()] + [e.health for e in events]
    evs = {i: Evaluator(p.with_health(h)) for i, h in enumerate(states)}
    n = p.n
    now = 0.0
    # per rank: the index of the health state it acts on
    known = [0] * n
    stamped: list[tuple[int, int]] = []  # (sequence number, state index)
    stamped_states: set[int] = set()
    cost_cache: dict[tuple[int, tuple[object, ...], str, int], float] = {}
    for s, c in enumerate(trace):
        actual = sum(1 for e in events if e.time_us <= now)
        learned = [
            max([0] + [i + 1 for i, e in enumerate(events) if e.time_us + e.delay_us[r] <= now])
            for r in range(n)
        ]
        if rule == "oracle":
            acting = [actual] * n
        elif rule == "static":
            acting = [0] * n
        elif rule == "eager":
            acting = learned
        else:
            first = max(learned)  # what the rank that knows most has learned
            for i in range(1, len(states)):
                if i not in stamped_states and first >= i:
                    stamped_states.add(i)
                    stamped.append((s + AGREED_LAG, i))
            for r in range(n):
                for seq, i in stamped:
                    if seq <= s:
                        known[r] = max(known[r], i)
            acting = list(known)
        choices = [
            localize(policy.lookup(c.op, c.bytes, summarize(states[a])), evs[a].p) for a in acting
        ]
        keys = {_key(ch) for ch in choices}
        if len(keys) > 1:
            run.mismatches += 1
        ch = choices[0]
        if _key(ch) != _key(policy.lookup(c.op, c.bytes, summarize(Health()))):
            run.changed += 1
        if acting[0] != run.acting:
            run.switches += 1
            run.switch_seq.append(s)
            run.acting = acting[0]
        ck = (actual, _key(ch), c.op, c.bytes)
        if ck not in cost_cache:
            ev = evs[actual]
            st = Structure(
                ch.algorithm, ch.channels, ch.chunks, ch.order, ch.leaves, ch.rail_weights
            )
            cost_cache[ck] = ev.score(c, st, ch.protocol, ch.clock_mhz, f"{c.op}:{c.bytes}").time_us
        t = cost_cache[ck]
        run.per_collective_us.append(t)
        run.total_us += t
        now += t
    return run
