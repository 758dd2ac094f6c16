"""Reconcile the GPUs with the agent's state directory when the agent starts.

* An apply that was cut short (the agent died between writing the apply marker and
  recording its end): if its checkpoint exists, some settings may have been written,
  so every setting the checkpoint records is put back (the chained checkpoint leads
  back to the GPUs before the first apply) and the checkpoints are retired; without
  its checkpoint nothing had been written.
* A restore that was cut short is finished (no plan is in force afterwards).
* Otherwise the plan in force (if any) is applied again with the executor's transaction:
  a setting the GPU still holds is not written, one that differs (a driver reload, an
  online change that was in force when the agent died) is set to the plan's value.
  Online changes are not kept over a restart: the GPUs come back at the plan's settings.
  A plan in force that the policy no longer allows (the operator narrowed it) is not
  applied again: every original is restored and no plan is in force.
  A clock or power limit that the newest checkpoint already records is first written
  back to the plan's value directly, so the new checkpoint does not take an online
  change that was in force when the agent died for an original.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from energyopt.agent.protocol import Refused
from energyopt.nvml.actions import Action, LockClocks, SetPowerLimit
from energyopt.nvml.errors import ExecutorError
from energyopt.nvml.planner import plan_actions
from energyopt.nvml.transaction import Transaction, earlier_checkpoints, restore
from energyopt.spec.plan import Plan

if TYPE_CHECKING:
    from energyopt.agent.service import Agent


def reconcile(agent: Agent) -> list[str]:
    """Bring the GPUs in line with ``agent.state``; what was done, one line each."""
    notes: list[str] = []
    state = agent.state
    if state.applying is not None:
        checkpoint = Path(state.applying_checkpoint or "")
        if state.applying_checkpoint and checkpoint.exists():
            count, errors = restore(agent.ctx, checkpoint)
            if errors:
                notes.append(
                    f"apply of {state.applying.plan_id} was cut short; restoring from "
                    f"{checkpoint} left {len(errors)} setting(s) differing: " + "; ".join(errors)
                )
            else:
                agent.dirs.retire_checkpoints()
                notes.append(
                    f"apply of {state.applying.plan_id} was cut short; {count} setting(s) "
                    f"put back as they were before the first apply (from {checkpoint})"
                )
        else:
            notes.append(
                f"apply of {state.applying.plan_id} was cut short before its checkpoint "
                "was written: nothing had been changed"
            )
        state.applying, state.applying_checkpoint = None, None
        agent.dirs.save(state)
    if state.restoring:
        return [*notes, *_withdraw(agent, "a restore was cut short: finished now")]
    pif = state.in_force
    if pif is not None:
        plan = Plan.model_validate(pif.plan)
        try:
            host = plan_actions(plan, agent.nvml, agent.catalog, dict(pif.devices), pif.mps_dir)
            agent.check_policy(plan, host)
            notes.extend(_online_back(agent, host.actions))
            report = Transaction(
                agent.ctx, host.actions, agent.dirs.new_checkpoint("reconcile")
            ).run()
        except Refused as exc:  # the operator narrowed the policy since the apply
            why = f"plan {pif.plan_id} is outside the policy now: {exc.reason}"
            notes.extend(_withdraw(agent, why))
        except ExecutorError as exc:
            state.in_force = None
            agent.dirs.save(state)
            notes.append(
                f"plan {pif.plan_id} could not be applied again ({exc}); no plan is in force"
            )
        else:
            if report.applied:
                done = "; ".join(f"{a.where()}: {a.describe()}" for a in report.applied)
                notes.append(
                    f"plan {pif.plan_id}: {len(report.applied)} setting(s) differed and were "
                    f"set again: {done}"
                )
            else:
                notes.append(f"plan {pif.plan_id}: every setting is in place")
    agent._persist_sim()
    return notes


def _online_back(agent: Agent, actions: list[Action]) -> list[str]:
    """Write the plan's clock and power limit where they differ and the newest checkpoint
    records the setting's original (an online change the agent made before it died)."""
    found = earlier_checkpoints(agent.dirs.checkpoints, agent.nvml.kind)
    covered = {(a.uuid, a.kind) for a, _ in found[0][1]} if found else set()
    done = []
    for action in actions:
        if not isinstance(action, LockClocks | SetPowerLimit):
            continue
        if (action.uuid, action.kind) not in covered or action.is_noop(action.read(agent.ctx)):
            continue
        action.apply(agent.ctx)
        action.verify(agent.ctx)
        done.append(f"{action.where()}: online change returned to the plan: {action.describe()}")
    return done


def _withdraw(agent: Agent, why: str) -> list[str]:
    """Restore every original (the newest checkpoint) and leave no plan in force."""
    try:
        result = agent.restore()
    except Refused as exc:
        return [f"{why}; restoring the originals failed: {exc.reason}"]
    return [f"{why}; {result['checked']} setting(s) restored, no plan is in force"]
