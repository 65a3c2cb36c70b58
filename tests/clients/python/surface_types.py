"""The request surface of the installed openai-python: its create-response request type
(`ResponseCreateParamsBase` and `stream`) as a small JSON type tree, read from the SDK's own
TypedDicts with `typing` introspection. Used by tests/surface/generate.py; prints the tree.

Tree nodes (the same as tests/clients/node/surface_types.mjs prints for openai-node):
  {"k": "str" | "int" | "num" | "bool" | "any" | "null"}
  {"k": "enum", "v": [literal, ...]}
  {"k": "arr", "of": node}            a list / Iterable / SequenceNotStr
  {"k": "map", "of": node}            a Dict[str, X]
  {"k": "obj", "f": {wire key: {"t": node, "req": bool}}}
  {"k": "union", "of": [node, ...]}   Optional[X] is a union with {"k": "null"}
A type met again inside itself (a recursive type) is {"k": "any"}.
"""

from __future__ import annotations

import json
import sys
import typing

import typing_extensions
from openai._utils._transform import PropertyInfo
from openai.types.responses import response_create_params

_REQUIRED = {typing_extensions.Required, getattr(typing, "Required", None)} - {None}
_NOT_REQUIRED = {typing_extensions.NotRequired, getattr(typing, "NotRequired", None)} - {None}


def _alias(metadata: tuple) -> str | None:
    for m in metadata:
        if isinstance(m, PropertyInfo) and m.alias:
            return m.alias
    return None


def node(tp: object, stack: tuple = ()) -> dict:
    origin = typing_extensions.get_origin(tp)
    args = typing_extensions.get_args(tp)
    if origin is typing_extensions.Annotated or origin is getattr(typing, "Annotated", None):
        return node(args[0], stack)
    if origin in _REQUIRED or origin in _NOT_REQUIRED:
        return node(args[0], stack)
    if tp is type(None) or tp is None:
        return {"k": "null"}
    if tp is str:
        return {"k": "str"}
    if tp is bool:
        return {"k": "bool"}
    if tp is int:
        return {"k": "int"}
    if tp is float:
        return {"k": "num"}
    if tp is object or tp is typing.Any:
        return {"k": "any"}
    if origin is typing_extensions.Literal or origin is getattr(typing, "Literal", None):
        return {"k": "enum", "v": list(args)}
    if origin is typing.Union or type(tp).__name__ == "UnionType":
        members = []
        for a in args:
            n = node(a, stack)
            # Flatten nested unions and merge literal members into one enum.
            for m in n["of"] if n["k"] == "union" else [n]:
                if m["k"] == "enum" and any(x["k"] == "enum" for x in members):
                    e = next(x for x in members if x["k"] == "enum")
                    e["v"] += [v for v in m["v"] if v not in e["v"]]
                elif m not in members:
                    members.append(m)
        return members[0] if len(members) == 1 else {"k": "union", "of": members}
    if origin in (list, typing.List) or (
        origin is not None and getattr(origin, "__name__", "") in ("Iterable", "Sequence", "SequenceNotStr")
    ):
        return {"k": "arr", "of": node(args[0], stack) if args else {"k": "any"}}
    if getattr(tp, "__name__", "") == "SequenceNotStr":
        return {"k": "arr", "of": {"k": "any"}}
    if origin in (dict, typing.Dict) or getattr(origin, "__name__", "") == "Mapping":
        return {"k": "map", "of": node(args[1], stack) if len(args) == 2 else {"k": "any"}}
    if typing_extensions.is_typeddict(tp):
        if tp in stack:
            return {"k": "any"}
        hints = typing_extensions.get_type_hints(tp, include_extras=True)
        required = getattr(tp, "__required_keys__", frozenset())
        fields = {}
        for key, hint in hints.items():
            meta = getattr(hint, "__metadata__", ())
            wire = _alias(meta) or key
            # `Required[...]` in a string annotation (`from __future__ import annotations`) is
            # not always in __required_keys__: the hint itself says it.
            origin = typing_extensions.get_origin(hint)
            req = origin in _REQUIRED or (key in required and origin not in _NOT_REQUIRED)
            fields[wire] = {"t": node(hint, stack + (tp,)), "req": req}
        return {"k": "obj", "f": fields}
    raise TypeError(f"surface_types.py: no rule for the type {tp!r}")


def request_tree() -> dict:
    """The create-response request: the base params plus `stream`."""
    tree = node(response_create_params.ResponseCreateParamsBase)
    tree["f"]["stream"] = {"t": {"k": "union", "of": [{"k": "bool"}, {"k": "null"}]}, "req": False}
    return tree


if __name__ == "__main__":
    json.dump(request_tree(), sys.stdout, indent=None, sort_keys=True)
    sys.stdout.write("\n")
