"""Independent plan checker: instance + plan -> every violated constraint."""

from energyopt.verify.serving import PlanEvaluation, Violation, evaluate_plan, verify_plan

__all__ = ["PlanEvaluation", "Violation", "evaluate_plan", "verify_plan"]
