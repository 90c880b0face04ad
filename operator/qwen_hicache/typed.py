"""Shared base for the typed API: camelCase on the wire, snake_case in Python, unknown fields refused."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class ApiModel(BaseModel):
    """Base of every spec/status model so the CRD schema and Python agree on names and strictness."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        frozen=True,
        use_attribute_docstrings=True,
    )

    def wire(self) -> dict[str, Any]:
        """The object as the API server stores it (camelCase, unset optionals left out)."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")

    def explicit(self) -> dict[str, Any]:
        """camelCase, every field its builder set (None included): what a report shows, unknown as null."""
        return self.model_dump(by_alias=True, exclude_unset=True, mode="json")


def cel(rule: str, message: str) -> dict[str, str]:
    """One CEL rule for `x-kubernetes-validations`; the same rule is enforced in pydantic validators."""
    return {"rule": rule, "message": message}
