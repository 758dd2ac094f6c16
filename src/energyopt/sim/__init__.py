"""Trace-driven evaluation: a discrete-event simulator of a GPU fleet serving LLM
requests under a changing plan, the planning loop and the baseline planners.
See docs/evaluation.md."""

from energyopt.sim.arrivals import Arrivals
from energyopt.sim.engine import SimResult, Simulator
from energyopt.sim.loop import EvaluationResult, PlannerRun, evaluate, run_planner

__all__ = [
    "Arrivals",
    "EvaluationResult",
    "PlannerRun",
    "SimResult",
    "Simulator",
    "evaluate",
    "run_planner",
]
