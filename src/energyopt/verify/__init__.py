"""Independent plan checkers: problem + plan -> every violated constraint."""

from energyopt.verify.serving import PlanEvaluation, evaluate_plan, verify_plan
from energyopt.verify.violation import Violation

__all__ = ["PlanEvaluation", "Violation", "evaluate_plan", "verify_plan"]
