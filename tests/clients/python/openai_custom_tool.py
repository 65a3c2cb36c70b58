"""The official `openai` Python SDK with a `custom` tool (free-text input, as Codex declares
`apply_patch`), the processor with its defaults, against a scripted Chat upstream (run by
tests/e2e/clients.rs) that answers, in order:
  1. a stream calling the function that stands for the tool, its arguments in pieces;
  2. the same call as one JSON chat completion;
  3. JSON text "Patched." (the upstream request, with the replayed history, is checked by the
     Rust test).

* every streamed event parses into the SDK's typed model for its `type` (the
  `response.custom_tool_call_input.*` events included) and validates;
* the call is a typed ResponseCustomToolCall whose `input` is the patch text, not JSON;
* stateless round trip: the call and a `custom_tool_call_output` go back as input.
"""

from openai import OpenAI
from openai.types.responses import ResponseCustomToolCall

from _common import MODEL, check, check_eq, check_event, check_response, main

PATCH = '*** Begin Patch\n*** Add File: hello.txt\n+Hello, "world"!\n*** End Patch\n'
APPLY_PATCH = {
    "type": "custom",
    "name": "apply_patch",
    "description": "Use the `apply_patch` tool to edit files.",
    "format": {"type": "grammar", "syntax": "lark", "definition": "start: begin_patch hunk+ end_patch"},
}
EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.custom_tool_call_input.delta",
    "response.custom_tool_call_input.done",
    "response.output_item.done",
    "response.completed",
]


def check_call(item, what):
    check(isinstance(item, ResponseCustomToolCall), f"{what}: typed custom tool call", type(item).__name__)
    check_eq((item.name, item.call_id, item.input), ("apply_patch", "call_patch_1", PATCH), f"{what}: call")
    check(item.id.startswith("ctc_"), f"{what}: id", item.id)


def run() -> None:
    client = OpenAI(max_retries=0, timeout=30)

    # 1. Streamed.
    events = list(client.responses.create(model=MODEL, input="add hello.txt", tools=[APPLY_PATCH], stream=True))
    check_eq([check_event(e, i) for i, e in enumerate(events)], EVENTS, "stream: event types")
    check_eq(events[3].delta, PATCH, "stream: input delta")
    check_eq(events[4].input, PATCH, "stream: input done")
    terminal = events[-1].response
    check_response(terminal, "stream: terminal")
    check_eq(len(terminal.output), 1, "stream: one output item")
    check_call(terminal.output[0], "stream")

    # 2. JSON.
    resp = client.responses.create(model=MODEL, input="add hello.txt", tools=[APPLY_PATCH], store=False)
    check_response(resp, "json")
    check_call(resp.output[0], "json")

    # 3. The result goes back, statelessly.
    resp = client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "add hello.txt"},
            resp.output[0],
            {"type": "custom_tool_call_output", "call_id": "call_patch_1", "output": "Done!"},
        ],
        tools=[APPLY_PATCH],
        store=False,
    )
    check_response(resp, "turn 2")
    check_eq(resp.output_text, "Patched.", "turn 2: output_text")


if __name__ == "__main__":
    main(run)
