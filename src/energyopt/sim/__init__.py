"""The simulator core shared by the families' simulators: a discrete-event
simulator of a GPU fleet serving LLM requests under a changing plan, arrivals,
traces, forecasts and metrics. The planning loop and its baseline planners are
the serving family's (``energyopt.families.serving.loop``). See docs/evaluation.md."""

from energyopt.sim.arrivals import Arrivals
from energyopt.sim.engine import SimResult, Simulator

__all__ = ["Arrivals", "SimResult", "Simulator"]
