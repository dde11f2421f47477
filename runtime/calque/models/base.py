"""The base every calque model derives from: strict about unknown fields, friendly to JSON."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class CalqueModel(BaseModel):
    """Forbid unknown fields so a typo in a spec or a message from a newer version fails loudly."""

    model_config = ConfigDict(extra="forbid", frozen=False, validate_assignment=True)
