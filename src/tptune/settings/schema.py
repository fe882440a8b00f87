"""Validation of plain data against the JSON-Schema subset tptune's config schema uses.

(jsonschema itself costs ~1.2 s to import, paid by every Snakemake job, and is absent on the GPU
machines.) Supported: type (a name or a list of names), properties, required, additionalProperties
(false, or the schema of every other key's value), propertyNames, enum, minimum, maximum, minItems, items,
pattern, anyOf.

Whatever the schema says, a number must be finite: NaN and infinities are refused in every field, those of
blocks the schema leaves open (``search.knobs``, ``faults``) included (issue 54: ``.nan`` passed every check,
then the run's decisions could not be written as JSON).
"""
from __future__ import annotations

import difflib
import math
import re

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "number": (int, float), "integer": int,
          "null": type(None)}


def problems(data, schema: dict, path: str = "") -> list[str]:
    where = path or "(top level)"
    out: list[str] = []
    if isinstance(data, float) and not math.isfinite(data):
        return [f"field '{where}': {data!r} is not a finite number"]
    if "anyOf" in schema:
        alts = [problems(data, alt, path) for alt in schema["anyOf"]]
        # the one form of the data's own type (ops: a list, not "auto") names the item that is wrong
        typed = [a for alt, a in zip(schema["anyOf"], alts) if "type" in alt and _is(data, alt["type"])]
        if all(alts) and len(typed) == 1:
            return typed[0]
        if all(alts):
            why = "; ".join(a[0].split(": ", 1)[-1] for a in alts)
            return [f"field '{where}': matches none of its forms ({why})"]
    t = schema.get("type")
    if t:
        if not _is(data, t):
            return [f"field '{where}': {data!r} is not of type {_names(t)}"]
    if "enum" in schema and data not in schema["enum"]:
        out.append(f"field '{where}': {data!r} is not one of {schema['enum']}")
    if "minimum" in schema and isinstance(data, (int, float)) and data < schema["minimum"]:
        out.append(f"field '{where}': {data!r} is less than the minimum of {schema['minimum']}")
    if "maximum" in schema and isinstance(data, (int, float)) and data > schema["maximum"]:
        out.append(f"field '{where}': {data!r} is more than the maximum of {schema['maximum']}"
                   + (f" ({schema['description']})" if schema.get("description") else ""))
    if "pattern" in schema and isinstance(data, str) and not re.search(schema["pattern"], data):
        out.append(f"field '{where}': {data!r} does not match {schema['pattern']!r}"
                   + (f" ({schema['description']})" if schema.get("description") else ""))
    if isinstance(data, list):
        if len(data) < schema.get("minItems", 0):
            out.append(f"field '{where}': {data!r} should have at least {schema['minItems']} item(s)")
        for i, item in enumerate(data):
            out += problems(item, schema.get("items", {}), f"{path}.{i}" if path else str(i))
    if isinstance(data, dict):
        props = schema.get("properties", {})
        other = schema.get("additionalProperties", {})
        for key in schema.get("required", []):
            if key not in data:
                out.append(f"field '{path + '.' if path else ''}{key}': required but missing")
        for key, value in data.items():
            sub = f"{path}.{key}" if path else str(key)
            if "propertyNames" in schema:
                out += [p.replace(f"field '{sub}': ", f"field '{sub}': the name ", 1)
                        for p in problems(key, schema["propertyNames"], sub)]
            if key in props:
                out += problems(value, props[key], sub)
            elif other is False:
                near = difflib.get_close_matches(str(key), list(props), n=1, cutoff=0.6)
                out.append(f"field '{sub}': unknown key ({f'did you mean {near[0]!r}? ' if near else ''}"
                           f"expected one of {', '.join(props)})")
            else:   # the value's own schema, or none (an open block): still no NaN or infinity in it
                out += problems(value, other if isinstance(other, dict) else {}, sub)
    return out


def _is(data, t) -> bool:
    if isinstance(t, list):
        return any(_is(data, x) for x in t)
    return isinstance(data, _TYPES[t]) and not (t in ("integer", "number") and isinstance(data, bool))


def _names(t) -> str:
    return " or ".join(f"'{x}'" for x in (t if isinstance(t, list) else [t]))
