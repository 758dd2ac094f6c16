"""Immutable pydantic base class shared by every spec."""

from pydantic import BaseModel, ConfigDict


class Spec(BaseModel):
    """Frozen model that rejects unknown fields, so typos in files are caught."""

    model_config = ConfigDict(frozen=True, extra="forbid", str_strip_whitespace=True)
