"""Round trips with openai-python: every output kind, from every source, fed back in every way
a client dumps it, over HTTP (JSON), SSE and the WebSocket (`client.responses.connect()`):
the continuation must complete. Run by tests/e2e/clients.rs against Envoy + the processor
(with the WebSocket transport and a reasoning key) + the demo upstream with its test triggers
(tests/common/upstream.rs: `refuse` in the last user message → a refusal, `think` → reasoning).

* every message a source gives carries `phase: "final_answer"` (the demo never writes text
  before a call);
* kinds: message, refusal, function call, custom tool call, reasoning, sealed reasoning
  (`include: ["reasoning.encrypted_content"]`), the items of `responses.compact()`, the
  client-executed built-in calls (shell, local_shell, apply_patch) and the `compaction` item a
  `compaction_trigger` makes;
* sources: the JSON response, the `response.completed` event, the `output_item.done` events,
  the stream helper's final response (`responses.stream()`), `responses.parse()`;
* dumps: the objects themselves, `model_dump()` and its variants, `to_dict()`, `to_json()`,
  `model_dump_json()`;
* transports of the continuation: HTTP JSON, SSE, WebSocket.

A round trip fails when the source does not give the kind, or the continuation is refused or
does not complete. Every failure is listed; the script exits 1 if any. Every body and event is
read for duplicate keys (`_common.py`).
"""

from __future__ import annotations

import json
import os
import time
import traceback
import warnings
from typing import Callable

import pydantic
from openai import OpenAI, pydantic_function_tool

from _common import MODEL, WEATHER_TOOL, check, main

TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
# `model_dump()` of the compaction's kept user message (typed as an output message) warns on
# every dump; the dump itself is what is tested.
warnings.filterwarnings("ignore", message="Pydantic serializer warnings", category=UserWarning)


class Weather(pydantic.BaseModel):
    location: str


CUSTOM_TOOL = {"type": "custom", "name": "apply_patch_text", "description": "Applies a patch."}

# kind → (request arguments, the output item type that must be there, whether it is a call)
KINDS: dict[str, dict] = {
    "message": {"input": "Say hi.", "want": "message"},
    "refusal": {"input": "Please refuse this.", "want": "refusal"},
    "function_call": {"input": "Weather in Paris?", "tools": [WEATHER_TOOL], "want": "function_call"},
    "custom_tool_call": {"input": "Patch it.", "tools": [CUSTOM_TOOL], "want": "custom_tool_call"},
    "reasoning": {"input": "Please think, then answer.", "want": "reasoning"},
    "sealed_reasoning": {
        "input": "Please think, then answer.",
        "include": ["reasoning.encrypted_content"],
        "want": "reasoning",
    },
    "shell_call": {"input": "List the files.", "tools": [{"type": "shell"}], "want": "shell_call"},
    "local_shell_call": {"input": "List the files.", "tools": [{"type": "local_shell"}], "want": "local_shell_call"},
    "apply_patch_call": {"input": "Fix the typo.", "tools": [{"type": "apply_patch"}], "want": "apply_patch_call"},
    "compaction_trigger": {
        "input": [{"role": "user", "content": "My name is Ada."}, {"type": "compaction_trigger"}],
        "want": "compaction",
    },
}
SOURCES = ["json", "completed_event", "item_done_events", "stream_helper", "parse"]

DUMPS: dict[str, Callable[[object], object]] = {
    "object": lambda o: o,
    "model_dump()": lambda o: o.model_dump(),
    "model_dump(mode='json')": lambda o: o.model_dump(mode="json"),
    "model_dump(exclude_unset=True)": lambda o: o.model_dump(exclude_unset=True),
    "model_dump(exclude_none=True)": lambda o: o.model_dump(exclude_none=True),
    "model_dump(by_alias=True)": lambda o: o.model_dump(by_alias=True),
    "model_dump(mode='json', by_alias=True)": lambda o: o.model_dump(mode="json", by_alias=True),
    "to_dict()": lambda o: o.to_dict(),
    "to_dict(mode='python')": lambda o: o.to_dict(mode="python"),
    "to_json()": lambda o: json.loads(o.to_json()),
    "model_dump_json()": lambda o: json.loads(o.model_dump_json()),
}
TRANSPORTS = ["http", "sse", "websocket"]


def request_args(kind: str, source: str) -> dict:
    spec = KINDS[kind]
    args = {"model": MODEL, "input": spec["input"], "store": False}
    tools = spec.get("tools")
    if tools:
        # The SDK's helpers parse arguments of pydantic tools (`parsed_arguments`).
        if kind == "function_call" and source in ("stream_helper", "parse"):
            tools = [pydantic_function_tool(Weather, name="get_weather")]
        args["tools"] = tools
    if "include" in spec:
        args["include"] = spec["include"]
    return args


def output_of(client: OpenAI, kind: str, source: str) -> list:
    """The output items of one response of `kind`, as `source` gives them."""
    args = request_args(kind, source)
    if source == "json":
        return list(client.responses.create(**args).output)
    if source in ("completed_event", "item_done_events"):
        items, completed = [], None
        for event in client.responses.create(stream=True, **args):
            if event.type == "response.output_item.done":
                items.append(event.item)
            if event.type in TERMINAL:
                completed = event.response
        check(completed is not None, f"{kind}/{source}: no terminal event")
        return list(completed.output) if source == "completed_event" else items
    if source == "stream_helper":
        with client.responses.stream(**args) as stream:
            for _ in stream:
                pass
            return list(stream.get_final_response().output)
    if source == "parse":
        return list(client.responses.parse(**args).output)
    raise ValueError(source)


def has_kind(items: list, want: str) -> bool:
    for item in items:
        if want == "refusal":
            if item.type == "message" and any(c.type == "refusal" for c in item.content):
                return True
        elif item.type == want:
            return True
    return False


def answers(items: list) -> list[dict]:
    """What a client sends after the items: an output for every call."""
    out: list[dict] = []
    for item in items:
        t = item.type
        if t == "function_call":
            out.append({"type": "function_call_output", "call_id": item.call_id, "output": "sunny, 21 C"})
        elif t == "custom_tool_call":
            out.append({"type": "custom_tool_call_output", "call_id": item.call_id, "output": "Done!"})
        elif t == "shell_call":
            out.append({
                "type": "shell_call_output", "call_id": item.call_id,
                "output": [{"stdout": "a.txt\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}],
            })
        elif t == "local_shell_call":
            out.append({"type": "local_shell_call_output", "id": item.call_id, "output": "a.txt\n"})
        elif t == "apply_patch_call":
            out.append({"type": "apply_patch_call_output", "call_id": item.call_id, "status": "completed", "output": "Done!"})
    return out


def continuation_input(kind: str, items: list, dump: Callable[[object], object]) -> list:
    first = KINDS[kind]["input"]
    head = [{"role": "user", "content": first}] if isinstance(first, str) else list(first)
    if kind == "compaction_trigger":
        head = []  # the compaction item stands for what came before
    return head + [dump(i) for i in items] + answers(items) + [{"role": "user", "content": "Continue."}]


def tools_of(kind: str) -> dict:
    tools = KINDS[kind].get("tools")
    return {"tools": tools} if tools else {}


def continue_over(client: OpenAI, conn, transport: str, kind: str, input_items: list) -> None:
    """Sends the continuation; raises unless it completes."""
    args = {"model": MODEL, "input": input_items, "store": False, **tools_of(kind)}
    if KINDS[kind].get("include"):
        args["include"] = KINDS[kind]["include"]
    if transport == "http":
        resp = client.responses.create(**args)
        check(resp.status == "completed", "status", resp.status)
        return
    if transport == "sse":
        last = None
        for event in client.responses.create(stream=True, **args):
            last = event
        check(last is not None and last.type == "response.completed", "terminal event", last)
        return
    conn.response.create(**args)
    for event in conn:
        if event.type == "error":
            raise AssertionError(f"error event: {getattr(event, 'error', event)}")
        if event.type in TERMINAL:
            check(event.type == "response.completed", "terminal event", event.type)
            return


def run() -> None:
    client = OpenAI(max_retries=0, timeout=30)
    only = os.environ.get("ROUND_TRIP_KINDS")
    kinds = [k for k in KINDS if not only or k in only.split(",")]
    results: list[tuple[str, bool, str]] = []
    started = time.monotonic()
    with client.responses.connect() as conn:
        # Sources: each kind from each source once; the compact items from compact().
        origins: list[tuple[str, str, list | None, str]] = []
        for kind in kinds:
            for source in SOURCES:
                try:
                    items = output_of(client, kind, source)
                    phases = {getattr(i, "phase", None) for i in items if i.type == "message"}
                    if not has_kind(items, KINDS[kind]["want"]):
                        origins.append((kind, source, None, f"no {KINDS[kind]['want']} item in {[i.type for i in items]}"))
                    elif phases - {"final_answer"}:
                        # The demo's messages never come before a call: each is the final answer.
                        origins.append((kind, source, None, f"message phase {phases}, not final_answer"))
                    else:
                        origins.append((kind, source, items, ""))
                except Exception as e:  # noqa: BLE001 - every failure is reported
                    origins.append((kind, source, None, f"{type(e).__name__}: {e}"[:300]))
        if not only or "compact" in only.split(","):
            try:
                compacted = client.responses.compact(
                    model=MODEL,
                    input=[{"role": "user", "content": "My name is Ada."}, {"role": "user", "content": "Remember 42."}],
                )
                items = list(compacted.output)
                ok = any(i.type == "compaction" for i in items)
                origins.append(("compact", "compact()", items if ok else None, "" if ok else "no compaction item"))
            except Exception as e:  # noqa: BLE001
                origins.append(("compact", "compact()", None, f"{type(e).__name__}: {e}"[:300]))
            KINDS.setdefault("compact", {"input": [], "want": "compaction"})
        for kind, source, items, why in origins:
            for dump_name, dump in DUMPS.items():
                for transport in TRANSPORTS:
                    name = f"{kind} | {source} | {dump_name} | {transport}"
                    if items is None:
                        results.append((name, False, f"source: {why}"))
                        continue
                    try:
                        body = continuation_input(kind, items, dump)
                        if kind == "compact":
                            body = [dump(i) for i in items] + [{"role": "user", "content": "Which number?"}]
                        continue_over(client, conn, transport, kind, body)
                        results.append((name, True, ""))
                    except Exception as e:  # noqa: BLE001
                        detail = getattr(e, "body", None) or str(e)
                        results.append((name, False, f"{type(e).__name__}: {detail}"[:400]))
                        if os.environ.get("ROUND_TRIP_TRACE"):
                            traceback.print_exc()
    failed = [r for r in results if not r[1]]
    # One line per kind, source and reason (the dumps and transports it failed in counted).
    groups: dict[tuple[str, str], list[str]] = {}
    for name, _, why in failed:
        kind, source, dump, transport = name.split(" | ")
        groups.setdefault((f"{kind} | {source}", why[:160]), []).append(f"{dump}/{transport}")
    for (origin, why), where in groups.items():
        print(f"FAILED {origin}: {len(where)} round trips ({', '.join(where[:4])}{', ...' if len(where) > 4 else ''}): {why}", flush=True)
    print(
        f"round trips: {len(results)} run, {len(results) - len(failed)} passed, {len(failed)} failed "
        f"({time.monotonic() - started:.1f} s)",
        flush=True,
    )
    check(not failed, f"{len(failed)} of {len(results)} round trips failed")


if __name__ == "__main__":
    main(run)
