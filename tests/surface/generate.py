"""Generates tests/surface/cases.json: every field path of the create-response request, from
the installed SDKs' own request types and the OpenResponses schema, and for each path the
requests that carry it (a plausible value, each enum value, and `null` where the type allows
leaving it out). tests/e2e/surface.rs sends every case through Envoy + the processor + the
demo upstream and checks the answer against the path table of docs/request-mapping.md.

Sources (one type tree each, format in tests/clients/python/surface_types.py):
  * openai-python, as pinned (tests/clients/python/requirements.txt): its TypedDicts;
  * openai-node, as pinned (tests/clients/node/package.json): its .d.ts, read with the
    TypeScript compiler API (tests/clients/node/surface_types.mjs);
  * the OpenResponses schema (tests/fixtures/openresponses/openapi.json, CreateResponseBody);
and, typed by no SDK, the bookkeeping field Codex puts on items (source `codex`, see
CODEX_BOOKKEEPING below).

Run with the repository's .venv python (deploy/install-clients.sh installs the SDKs):
  .venv/bin/python tests/surface/generate.py            rewrites cases.json
  .venv/bin/python tests/surface/generate.py --check    exits 1 if cases.json is stale
  .venv/bin/python tests/surface/generate.py --node-package DIR
        prints the field paths of another openai-node package (an unpacked `npm pack`) that
        the pinned one lacks

Path notation: `a.b` a field, `a[]` an element of an array, and after a union of objects
told apart by their `type`, that type as a step: `input[].function_call.caller`,
`tools[].custom.format.grammar.syntax`, `tool_choice.allowed_tools.mode`.

Each case: `path`, `value` (JSON; null for a null case), `request` (the whole body),
`without` (the same body without the field: what the answer is compared with), `param` (the
field's place in `request`, as a 400 names it: `input[1].caller`) and `sources`.
Placeholders the test replaces before sending: "$SEALED_REASONING", "$SEALED_COMPACTION"
(blobs sealed with the processor's test key).
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "tests/surface/cases.json"
SCHEMA = ROOT / "tests/fixtures/openresponses/openapi.json"
NODE_DIR = ROOT / "tests/clients/node"

MODEL = "demo-model"
BASE = {"model": MODEL, "input": "Say hi."}
USER = {"role": "user", "content": "Say hi."}
PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR4nGNgYGD4DwABBAEAwS2OUAAAAABJRU5ErkJggg=="
)
PARAMETERS = {
    "type": "object",
    "properties": {"location": {"type": "string"}},
    "required": ["location"],
}

# Plausible values, by the last key of the path (a regular expression on the whole path
# wins: the first that matches).
BY_PATH: list[tuple[str, object]] = [
    (r"\.compaction\.encrypted_content$", "$SEALED_COMPACTION"),
    (r"encrypted_content$", "$SEALED_REASONING"),
    (r"^tool_choice\.[a-z_]+\.name$", "get_weather"),
    (r"^tool_choice\.allowed_tools\.tools\[\]$", {"type": "function", "name": "get_weather"}),
    (r"\.custom_tool_call\.input$", "*** Begin Patch\n*** End Patch\n"),
    # The one entry type there is (openai-python: "Currently only 'compaction' is supported").
    (r"^context_management\[\]\.type$", "compaction"),
    (r"\.reasoning\.content\[\]\.reasoning_text\.text$", "Thinking it over."),
    (r"\.parameters$", PARAMETERS),
    (r"\.(schema|input_schema|output_schema)$", {"type": "object", "properties": {}}),
]
BY_KEY: dict[str, object] = {
    "model": MODEL,
    "instructions": "Be brief.",
    "text": "Say hi.",
    "refusal": "I cannot help with that.",
    "call_id": "call_1",
    "name": "get_weather",
    "namespace": "mcp_fs",
    "arguments": '{"location":"Paris"}',
    "output": "sunny",
    "image_url": PNG,
    "file_data": "data:application/pdf;base64,JVBERi0xLjQK",
    "file_url": "https://example.com/a.pdf",
    "video_url": "https://example.com/a.mp4",
    "filename": "a.pdf",
    "url": "https://example.com/",
    "file_id": "file-abc123",
    "id": "item_1",
    "metadata": {"team": "a"},
    "prompt_cache_key": "k1",
    "safety_identifier": "user-1",
    "user": "user-1",
    "description": "A description.",
    "max_output_tokens": 64,
    "max_tool_calls": 2,
    "top_logprobs": 2,
    "temperature": 0.5,
    "top_p": 0.9,
}


def value_for(path: str, key: str, kind: str) -> object:
    for pattern, v in BY_PATH:
        if re.search(pattern, path) and v is not None:
            return copy.deepcopy(v)
    if key in BY_KEY:
        v = BY_KEY[key]
        ok = {
            "str": isinstance(v, str),
            "int": isinstance(v, int) and not isinstance(v, bool),
            "num": isinstance(v, (int, float)) and not isinstance(v, bool),
            "map": isinstance(v, dict),
            "any": True,
        }.get(kind, False)
        if ok:
            return copy.deepcopy(v)
    # Numbers: 1 fits integer fields too (openai-node types every number `number`).
    return {"str": "x", "int": 1, "num": 1, "bool": True, "map": {"k": "v"}, "any": {}}[kind]


# ---- the three type trees ----


def python_tree() -> dict:
    sys.path.insert(0, str(ROOT / "tests/clients/python"))
    import surface_types  # noqa: E402

    return surface_types.request_tree()


def node_tree(package: str | None = None) -> dict:
    args = ["node", str(NODE_DIR / "surface_types.mjs")] + ([package] if package else [])
    return json.loads(subprocess.run(args, check=True, capture_output=True, text=True, cwd=NODE_DIR).stdout)


def schema_tree() -> dict:
    doc = json.loads(SCHEMA.read_text())
    schemas = doc["components"]["schemas"]

    def conv(s: dict, stack: tuple) -> dict:
        if "$ref" in s:
            name = s["$ref"].rsplit("/", 1)[1]
            if name in stack:
                return {"k": "any"}
            return conv(schemas[name], stack + (name,))
        if "const" in s:
            return {"k": "enum", "v": [s["const"]]}
        if "enum" in s:
            vals = [v for v in s["enum"] if v is not None]
            n = {"k": "enum", "v": vals}
            return {"k": "union", "of": [n, {"k": "null"}]} if None in s["enum"] else n
        if "allOf" in s:
            parts = [conv(x, stack) for x in s["allOf"]]
            parts = [p for p in parts if p["k"] != "any" or len(s["allOf"]) == 1]
            if len(parts) == 1:
                return parts[0]
            fields = {}
            for p in parts:
                fields.update(p.get("f", {}))
            return {"k": "obj", "f": fields}
        for key in ("anyOf", "oneOf"):
            if key in s:
                return union([conv(x, stack) for x in s[key]])
        t = s.get("type")
        if isinstance(t, list):
            return union([conv({**s, "type": x}, stack) for x in t])
        if t == "string":
            return {"k": "str"}
        if t == "integer":
            return {"k": "int"}
        if t == "number":
            return {"k": "num"}
        if t == "boolean":
            return {"k": "bool"}
        if t == "null":
            return {"k": "null"}
        if t == "array":
            return {"k": "arr", "of": conv(s.get("items", {}), stack)}
        if t == "object" or "properties" in s:
            props = s.get("properties", {})
            if not props and isinstance(s.get("additionalProperties"), dict):
                return {"k": "map", "of": conv(s["additionalProperties"], stack)}
            if not props:
                return {"k": "any"}
            req = set(s.get("required", []))
            return {"k": "obj", "f": {k: {"t": conv(v, stack), "req": k in req} for k, v in props.items()}}
        return {"k": "any"}

    return conv(schemas["CreateResponseBody"], ("CreateResponseBody",))


def union(members: list[dict]) -> dict:
    out: list[dict] = []
    for m in members:
        for x in m["of"] if m["k"] == "union" else [m]:
            e = next((o for o in out if o["k"] == "enum"), None)
            if x["k"] == "enum" and e is not None:
                e["v"] += [v for v in x["v"] if v not in e["v"]]
            elif x not in out:
                out.append(x)
    return out[0] if len(out) == 1 else {"k": "union", "of": out}


# ---- paths and cases ----


def members(t: dict) -> list[dict]:
    return t["of"] if t["k"] == "union" else [t]


def nullable(t: dict) -> bool:
    return any(m["k"] == "null" for m in members(t))


def discriminator(obj: dict) -> str | None:
    """The single `type` literal of an object type, if it has one."""
    t = obj["f"].get("type")
    if t is None:
        return None
    vals = [v for m in members(t["t"]) if m["k"] == "enum" for v in m["v"]]
    # Several values (`web_search`, `web_search_2025_08_26`): the first names the variant.
    return vals[0] if vals and isinstance(vals[0], str) else None


def minimal(t: dict, path: str, key: str) -> object:
    """A small valid value of type `t` (required fields only)."""
    ms = [m for m in members(t) if m["k"] != "null"]
    if not ms:
        return None
    # Strings first (content, input), then objects, then the rest.
    order = {"str": 0, "obj": 1, "enum": 2, "arr": 3}
    m = sorted(ms, key=lambda m: order.get(m["k"], 4))[0]
    if m["k"] == "enum":
        return m["v"][0]
    if m["k"] == "obj":
        return minimal_obj(m, path)
    if m["k"] == "arr":
        return [minimal(m["of"], path + "[]", key)]
    return value_for(path, key, m["k"])


# Fields that carry an item's content: in its minimal form even where a source makes them
# optional (openai-node's `call_id?` on tool outputs, an image's `image_url`).
CONTENT_KEYS = {
    "call_id", "role", "name", "arguments", "output", "input",
    "text", "refusal", "image_url", "file_data", "summary", "tools", "schema",
}


def minimal_obj(obj: dict, path: str) -> dict:
    d = discriminator(obj)
    p = f"{path}.{d}" if d else path
    out = {}
    for k, f in obj["f"].items():
        if f["req"] or k == "type" and d or k in CONTENT_KEYS:
            out[k] = minimal(f["t"], f"{p}.{k}", k)
    return out


# Keys that stand for another: setting one drops the other from the minimal form.
EXCLUSIVE = {"file_url": ("file_data",), "file_id": ("file_data", "image_url")}


class Cases:
    def __init__(self) -> None:
        self.cases: dict[tuple, dict] = {}
        self.paths: dict[str, set] = {}

    def add(self, source: str, path: str, value: object, request: dict, without: dict, param: str) -> None:
        self.paths.setdefault(path, set()).add(source)
        key = (path, json.dumps(request, sort_keys=True))
        case = self.cases.setdefault(
            key,
            {"path": path, "value": value, "param": param, "request": request, "without": without, "sources": []},
        )
        if source not in case["sources"]:
            case["sources"].append(source)


def item_context(item: object) -> list:
    """What goes before an input item: a user message, and for a tool output the call it
    answers (so that its call_id matches a call)."""
    ctx: list = [dict(USER)]
    if isinstance(item, dict) and isinstance(item.get("type"), str) and item["type"].endswith("_output"):
        call = item["type"][: -len("_output")]
        # A local_shell_call_output names its call by `id`.
        call_id = item.get("id" if call == "local_shell_call" else "call_id", "call_1")
        calls = {
            "function_call": {"type": "function_call", "call_id": call_id, "name": "get_weather", "arguments": "{}"},
            "custom_tool_call": {"type": "custom_tool_call", "call_id": call_id, "name": "apply_patch", "input": "x"},
            "shell_call": {"type": "shell_call", "call_id": call_id, "action": {"commands": ["ls"]}, "status": "completed"},
            "local_shell_call": {
                "type": "local_shell_call", "id": "lsc_1", "call_id": call_id, "status": "completed",
                "action": {"type": "exec", "command": ["ls"], "env": {}},
            },
            "apply_patch_call": {
                "type": "apply_patch_call", "call_id": call_id, "status": "completed",
                "operation": {"type": "delete_file", "path": "a.txt"},
            },
            "computer_call": None,
        }
        if calls.get(call):
            ctx.append(calls[call])
    return ctx


def item_after(item: object) -> list:
    """What follows an input item: reasoning goes with the assistant message after it."""
    if isinstance(item, dict) and item.get("type") == "reasoning":
        return [{"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hello."}]}]
    return []


# The tools a `tool_choice` may name (function, custom, and the built-ins it can pick).
CHOICE_TOOLS = [
    {"type": "function", "name": "get_weather", "parameters": PARAMETERS},
    {"type": "custom", "name": "apply_patch_text"},
]


def walk(out: Cases, source: str, tree: dict) -> None:
    """Every path of the request tree, with its cases."""

    def root_wrap(key: str):
        def wrap(x):
            req = dict(BASE)
            if key == "tool_choice":
                tools = list(CHOICE_TOOLS)
                kind = x.get("type") if isinstance(x, dict) else None
                # The tool the choice names, declared (computer tools are refused on their own).
                if kind and kind not in ("function", "custom", "allowed_tools", "computer", "computer_use_preview"):
                    tools.append({"type": kind})
                req["tools"] = tools
            if x is _DROP:
                req.pop(key, None)
            else:
                req[key] = x
            return req, key

        return wrap

    def field_cases(t: dict, req_flag: bool, path: str, key: str, wrap, parent: dict | None, drop=None) -> None:
        """Cases for one field at `path` whose value goes through `wrap`; `parent` is the
        containing object's minimal instance; `drop` makes the request to compare with
        (default: without the field)."""

        def emit(value):
            request, param = wrap(value)
            without = drop() if drop and value is not None else wrap(_DROP)[0]
            out.add(source, path, value, request, without, param)

        ms = members(t)
        if path == "model":
            # Model names are open strings (the SDKs list known ones): one name stands for all.
            emit(MODEL)
        else:
            for m in ms:
                if m["k"] in ("str", "int", "num", "bool", "any", "map"):
                    emit(value_for(path, key, m["k"]))
                elif m["k"] == "enum":
                    for v in m["v"]:
                        emit(v)
        if nullable(t) or not req_flag:
            emit(None)
        for m in ms:
            if m["k"] == "obj":
                obj_cases(m, path, wrap)
            elif m["k"] == "arr":
                arr_cases(m["of"], path + "[]", wrap, key)
            elif m["k"] == "map" and any(x["k"] == "obj" for x in members(m["of"])):
                for x in members(m["of"]):
                    if x["k"] == "obj":
                        obj_cases(x, path + ".*", lambda v, w=wrap: w({} if v is _DROP else {"k": v}))

    def obj_cases(obj: dict, path: str, wrap) -> None:
        d = discriminator(obj)
        p = f"{path}.{d}" if d else path
        base = minimal_obj(obj, path)
        for k, f in obj["f"].items():
            def child(x, k=k):
                o = dict(base)
                if x is _DROP:
                    o.pop(k, None)
                else:
                    # One source per file or image: a case of one replaces the other.
                    for other in EXCLUSIVE.get(k, ()):
                        if x is not None:
                            o.pop(other, None)
                    o[k] = x
                req, param = wrap(o)
                return req, f"{param}.{k}"

            # A variant's `type` stands for the whole object: compared with the request
            # without that object (an item, a tool, a format), not with a typeless one.
            drop = (lambda: wrap(_DROP)[0]) if k == "type" and d else None
            field_cases(f["t"], f["req"], f"{p}.{k}", k, child, base, drop)

    def arr_cases(item: dict, path: str, wrap, key: str) -> None:
        def elem(x):
            if x is _DROP:
                # The array without the item (input keeps its user message).
                return wrap([dict(USER)] if path == "input[]" else [])
            ctx = item_context(x) if path == "input[]" else []
            after = item_after(x) if path == "input[]" else []
            req, param = wrap(ctx + [x] + after)
            return req, f"{param}[{len(ctx)}]"

        for m in members(item):
            if m["k"] == "obj":
                obj_cases(m, path, elem)
            elif m["k"] == "arr":
                arr_cases(m["of"], path + "[]", elem, key)
            elif m["k"] == "enum":
                for v in m["v"]:
                    req, param = elem(v)
                    out.add(source, path, v, req, elem(_DROP)[0], param)
            elif m["k"] != "null":
                v = value_for(path, key, m["k"])
                req, param = elem(v)
                out.add(source, path, v, req, elem(_DROP)[0], param)

    for key, f in tree["f"].items():
        wrap = root_wrap(key)

        field_cases(f["t"], f["req"], key, key, wrap, None)


# What Codex 0.171 (openai/codex, codex-rs/protocol/src/models.rs) puts on every item it sends
# when it believes it talks to OpenAI (`openai_base_url`), as recorded in
# tests/fixtures/codex/0.171-openai/: its turn id, the item's creation time and the kinds of
# its content parts. It carries it on these item kinds among those this server reads (also on
# web_search_call, tool_search_call, tool_search_output and image_generation_call, items of
# hosted tools refused here whatever they carry).
CODEX_BOOKKEEPING = "internal_chat_message_metadata_passthrough"
CODEX_ITEMS = [
    "message", "reasoning", "function_call", "function_call_output", "custom_tool_call",
    "custom_tool_call_output", "local_shell_call", "compaction",
]
CODEX_VALUE = {
    "turn_id": "01a21b8c-437f-7051-8a23-ace6c2af39c2",
    "create_time": 1795758507.0166,
    "content_item_kinds": ["user.text"],
}


def codex_cases(out: Cases, tree: dict) -> None:
    """The bookkeeping field Codex sends, on one minimal item of each kind it sends it on."""
    items = next(m["of"] for m in members(tree["f"]["input"]["t"]) if m["k"] == "arr")
    seen = set()
    for variant in members(items):
        d = discriminator(variant) if variant["k"] == "obj" else None
        if d not in CODEX_ITEMS or d in seen:
            continue
        seen.add(d)
        base = minimal_obj(variant, "input[]")
        ctx, after = item_context(base), item_after(base)
        for value in (CODEX_VALUE, None):
            item = {**base, CODEX_BOOKKEEPING: copy.deepcopy(value)}
            out.add("codex", f"input[].{d}.{CODEX_BOOKKEEPING}", value,
                    dict(BASE, input=ctx + [item] + after), dict(BASE, input=ctx + [base] + after),
                    f"input[{len(ctx)}].{CODEX_BOOKKEEPING}")
    assert seen == set(CODEX_ITEMS), f"item kinds missing from openai-python: {set(CODEX_ITEMS) - seen}"


class _Drop:
    def __repr__(self) -> str:
        return "<drop>"


_DROP = _Drop()


def versions() -> dict:
    import openai

    node = json.loads((NODE_DIR / "node_modules/openai/package.json").read_text())["version"]
    return {"openai-python": openai.__version__, "openai-node": node, "openresponses": "tests/fixtures/openresponses/openapi.json",
            "codex": "0.171.0 (its item bookkeeping)"}


def generate() -> dict:
    cases = Cases()
    python = python_tree()
    walk(cases, "openai-python", python)
    walk(cases, "openai-node", node_tree())
    walk(cases, "openresponses", schema_tree())
    codex_cases(cases, python)
    listed = sorted(cases.cases.values(), key=lambda c: (c["path"], json.dumps(c["request"], sort_keys=True)))
    return {
        "generated_by": "tests/surface/generate.py",
        "sources": versions(),
        "paths": {p: sorted(s) for p, s in sorted(cases.paths.items())},
        "cases": listed,
    }


def dump(doc: dict) -> str:
    """One case per line, so that a diff shows which cases changed."""
    lines = ["{", f' "generated_by": {json.dumps(doc["generated_by"])},', f' "sources": {json.dumps(doc["sources"])},']
    lines.append(' "paths": {')
    paths = list(doc["paths"].items())
    for i, (p, s) in enumerate(paths):
        lines.append(f"  {json.dumps(p)}: {json.dumps(s)}" + ("," if i < len(paths) - 1 else ""))
    lines.append(" },")
    lines.append(' "cases": [')
    for i, c in enumerate(doc["cases"]):
        lines.append("  " + json.dumps(c, separators=(",", ":")) + ("," if i < len(doc["cases"]) - 1 else ""))
    lines.append(" ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--node-package")
    args = ap.parse_args()
    if args.node_package:
        pinned, other = Cases(), Cases()
        walk(pinned, "pinned", node_tree())
        walk(other, "other", node_tree(args.node_package))
        extra = sorted(set(other.paths) - set(pinned.paths))
        print(json.dumps(extra, indent=1))
        return 0
    text = dump(generate())
    if args.check:
        old = OUT.read_text() if OUT.exists() else ""
        if old != text:
            old_lines, new_lines = set(old.splitlines()), set(text.splitlines())
            print(f"{OUT.relative_to(ROOT)} is stale: {len(new_lines - old_lines)} lines new, "
                  f"{len(old_lines - new_lines)} gone; run .venv/bin/python tests/surface/generate.py")
            for line in sorted(new_lines - old_lines)[:10]:
                print("+ " + line[:300])
            for line in sorted(old_lines - new_lines)[:10]:
                print("- " + line[:300])
            return 1
        print(f"{OUT.relative_to(ROOT)} is up to date")
        return 0
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(text)
    doc = json.loads(text)
    print(f"wrote {OUT.relative_to(ROOT)}: {len(doc['paths'])} paths, {len(doc['cases'])} cases")
    return 0


if __name__ == "__main__":
    sys.exit(main())
