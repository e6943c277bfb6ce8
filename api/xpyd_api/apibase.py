"""The base every API model shares (camelCase aliases, unknown fields refused) and the CEL helper."""

from __future__ import annotations

from typing import Any, Final

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel

# A Kubernetes quantity (resource.Quantity's serialized forms): 16Gi, 500m, 1.5e3, 2.
QUANTITY: Final = r"^[0-9]+(\.[0-9]+)?(e[0-9]+|[numkKMGTPE]|[KMGTPE]i)?$"


class ApiModel(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, validate_by_name=True, validate_by_alias=True, extra="forbid")


def cel(rules: list[dict[str, str]]) -> dict[str, Any]:
    """json_schema_extra putting CEL rules (x-kubernetes-validations) on a model's schema."""
    return {"x-kubernetes-validations": rules}


# A field the API server stores as written (a pod template patch, an affinity): put on dict[str, Any] fields.
FREE_FORM: Final[dict[str, Any]] = {"x-kubernetes-preserve-unknown-fields": True}
