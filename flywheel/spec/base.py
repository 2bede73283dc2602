"""The base of every TrainingJob schema model: camelCase aliases, unknown fields rejected, defaults validated."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              validate_default=True)
