"""Immutable pydantic base class shared by every spec."""

from __future__ import annotations

import math
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator

MAX_MAGNITUDE = 1e18
"""Largest magnitude of any number in a spec: beyond every physical quantity the
files describe (FLOPs of one task, bytes, watts, rates), and far below the point
where float arithmetic on it overflows."""


def _check_magnitude(value: Any) -> None:
    if isinstance(value, bool | BaseModel):
        return
    if isinstance(value, int | float):
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"must be a finite number, got {value}")
        if abs(value) > MAX_MAGNITUDE:
            raise ValueError(
                f"{value:.3g} is beyond any physical value (magnitude at most {MAX_MAGNITUDE:g})"
            )
    elif isinstance(value, tuple | list | frozenset | set):
        for item in value:
            _check_magnitude(item)
    elif isinstance(value, dict):
        for item in value.values():
            _check_magnitude(item)


class Spec(BaseModel):
    """Frozen model that rejects unknown fields, so typos in files are caught, every
    infinite or NaN number wherever a float is taken, and every number of magnitude
    above ``MAX_MAGNITUDE`` (``1e308``, a 40-digit integer) in any field."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", str_strip_whitespace=True, allow_inf_nan=False
    )

    UNCHECKED_NUMBERS: ClassVar[frozenset[str]] = frozenset()
    """Fields that report a figure rather than describe the input (a solver's
    objective or bound, which may be infinite); they skip the magnitude check."""

    @field_validator("*", mode="after")
    @classmethod
    def _finite_and_bounded(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name not in cls.UNCHECKED_NUMBERS:
            _check_magnitude(value)
        return value
