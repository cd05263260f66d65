"""The OpenAPI document FastAPI builds, with two things put right that its generator gets wrong for us.

* Integer bounds: FastAPI's OpenAPI model types ``minimum``/``maximum`` as float, so the ingest bound 2^63 − 1
  is published as 9.223372036854776e18 (= 2^63) and a client may send 2^63, which the server refuses. Bounds of
  integer schemas are written back as integers (2^63 rounds back to 2^63 − 1, the only bound that large).
* Map keys: a ``dict[Slug, …]`` comes out as ``patternProperties`` with the slug pattern, which still allows any
  other key; the key pattern goes into ``propertyNames`` (and other keys are closed off), as the server checks it.
"""

from __future__ import annotations

from typing import Any

from trimtab.api.schemas_base import MAX_INT64

_BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")


def fix_document(node: Any) -> Any:
    """Fix ``node`` (an OpenAPI document or any part of it) in place; returns it."""
    if isinstance(node, dict):
        if node.get("type") == "integer":
            for key in _BOUNDS:
                value = node.get(key)
                if isinstance(value, float) and value.is_integer():
                    node[key] = max(-MAX_INT64 - 1, min(MAX_INT64, int(value)))
        patterns = node.get("patternProperties")
        if isinstance(patterns, dict) and len(patterns) == 1:
            (pattern,) = patterns
            node.setdefault("propertyNames", {})["pattern"] = pattern
            node["additionalProperties"] = False
        for value in node.values():
            fix_document(value)
    elif isinstance(node, list):
        for value in node:
            fix_document(value)
    return node
