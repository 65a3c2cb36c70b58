"""The official `openai` Python SDK with the client-executed built-in tools (`shell`,
`local_shell`, `apply_patch`), Codex's remote compaction (`compaction_trigger`) and the
`phase` of output messages, through Envoy and the processor in front of the demo upstream
(run by tests/e2e/clients.rs). The demo calls the built-in's function with runnable
arguments (`echo hello`, create `hello.txt`) and echoes a tool result as
"The tool returned: <result>".

* every streamed event parses into the SDK's typed model for its `type` (the
  `response.shell_call_command.*` events included) and validates;
* each call is the SDK's typed built-in call item; it goes back as `model_dump()` writes it
  (every unset field `null`) with its output item, and the conversation continues;
* a `compaction_trigger` is answered with exactly one `compaction` item, streamed or not, and
  a new chain starts from it;
* output messages say their `phase`, and a dumped message with its `phase` goes back.
"""

import json

from openai import OpenAI
from openai.types.responses import (
    ResponseApplyPatchToolCall,
    ResponseCompactionItem,
    ResponseFunctionShellToolCall,
    ResponseOutputMessage,
)
from openai.types.responses.response_output_item import LocalShellCall

from _common import GREETING, MODEL, TOOL_CALL_ID, check, check_eq, check_event, check_response, check_sealed, main

SHELL_OUTPUT = [{"stdout": "hello\n", "stderr": "", "outcome": {"type": "exit", "exit_code": 0}}]
COMPACTION_EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.compaction.compacting",
    "response.output_item.done",
    "response.completed",
]


def dumped(items):
    """What `input += [o.model_dump() for o in resp.output]` sends back."""
    return [o.model_dump() for o in items]


def run() -> None:
    client = OpenAI(max_retries=0, timeout=30)
    user = {"role": "user", "content": "say hello"}

    # shell, streamed: the call whole once complete, one command event triple per command.
    events = list(client.responses.create(model=MODEL, input=[user], tools=[{"type": "shell"}], stream=True))
    types = [check_event(e, i) for i, e in enumerate(events)]
    check_eq(
        types,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.shell_call_command.added",
            "response.shell_call_command.delta",
            "response.shell_call_command.done",
            "response.output_item.done",
            "response.completed",
        ],
        "shell stream: event types",
    )
    check_eq((events[4].delta, events[5].command, events[5].command_index), ("echo hello", "echo hello", 0), "shell stream: command")
    terminal = events[-1].response
    check_response(terminal, "shell stream: terminal")
    call = terminal.output[0]
    check(isinstance(call, ResponseFunctionShellToolCall), "shell stream: typed shell_call", type(call).__name__)
    check_eq((call.call_id, call.action.commands, call.status), (TOOL_CALL_ID, ["echo hello"], "completed"), "shell call")

    # shell, JSON, then its output goes back with the dumped call.
    resp = client.responses.create(model=MODEL, input=[user], tools=[{"type": "shell"}])
    check_response(resp, "shell json")
    check(isinstance(resp.output[0], ResponseFunctionShellToolCall), "shell json: typed", resp.output[0])
    output = {"type": "shell_call_output", "call_id": TOOL_CALL_ID, "output": SHELL_OUTPUT}
    resp = client.responses.create(model=MODEL, input=[user, *dumped(resp.output), output], tools=[{"type": "shell"}])
    check_response(resp, "shell turn 2")
    check_eq(resp.output_text, "The tool returned: " + json.dumps(SHELL_OUTPUT, separators=(",", ":")), "shell turn 2")

    # local_shell: the output names the call by its id.
    resp = client.responses.create(model=MODEL, input=[user], tools=[{"type": "local_shell"}])
    check_response(resp, "local_shell json")
    call = resp.output[0]
    check(isinstance(call, LocalShellCall), "local_shell: typed", type(call).__name__)
    check_eq((call.action.type, call.action.command, call.action.env), ("exec", ["echo", "hello"], {}), "local_shell action")
    output = {"type": "local_shell_call_output", "id": call.id, "output": '{"output": "hello"}'}
    resp = client.responses.create(model=MODEL, input=[user, *dumped(resp.output), output], tools=[{"type": "local_shell"}])
    check_eq(resp.output_text, 'The tool returned: {"output": "hello"}', "local_shell turn 2")

    # apply_patch, with the SDK's tool_choice for it.
    tools = [{"type": "apply_patch"}, {"type": "shell"}]
    resp = client.responses.create(model=MODEL, input=[user], tools=tools, tool_choice={"type": "apply_patch"})
    check_response(resp, "apply_patch json")
    call = resp.output[0]
    check(isinstance(call, ResponseApplyPatchToolCall), "apply_patch: typed", type(call).__name__)
    check_eq(
        (call.operation.type, call.operation.path, call.operation.diff, call.status),
        ("create_file", "hello.txt", "+hello\n", "completed"),
        "apply_patch operation",
    )
    output = {"type": "apply_patch_call_output", "call_id": call.call_id, "status": "completed", "output": "Created hello.txt"}
    resp = client.responses.create(model=MODEL, input=[user, *dumped(resp.output), output], tools=tools)
    check_eq(resp.output_text, 'The tool returned: {"status":"completed","output":"Created hello.txt"}', "apply_patch turn 2")

    # phase: an answer is final_answer; the dumped message (phase and all) goes back.
    message = resp.output[0]
    check(isinstance(message, ResponseOutputMessage), "turn 2: a message", type(message).__name__)
    check_eq(message.phase, "final_answer", "turn 2: phase")
    events = list(client.responses.create(model=MODEL, input="hi", stream=True))
    added = next(e for e in events if e.type == "response.output_item.added")
    done = next(e for e in events if e.type == "response.output_item.done")
    check_eq((added.item.phase, done.item.phase), (None, "final_answer"), "stream: phase unknown when added, said when done")
    resp = client.responses.create(model=MODEL, input=[{"role": "user", "content": "hi"}, *dumped([done.item]), {"role": "user", "content": "again"}])
    check_eq(resp.output_text, GREETING + "again", "a dumped message with its phase goes back")

    # compaction_trigger: one sealed compaction item, streamed or not; a new chain from it.
    window = [{"role": "user", "content": "My name is Ada."}, {"role": "assistant", "content": "Hello Ada."}]
    trigger = {"type": "compaction_trigger"}
    events = list(client.responses.create(model=MODEL, input=[*window, trigger], stream=True))
    check_eq([check_event(e, i) for i, e in enumerate(events)], COMPACTION_EVENTS, "compaction stream: event types")
    check_eq(len(events[-1].response.output), 1, "compaction stream: one item")
    check_eq(events[2].item.encrypted_content, "", "compaction stream: the item is added empty")
    check_eq(events[3].item_id, events[2].item.id, "compaction stream: the progress names the item")
    # The SDK's stream helper folds the same events into the final response: the done item.
    with client.responses.stream(model=MODEL, input=[*window, trigger]) as stream:
        final = stream.get_final_response()
    check_eq([type(o).__name__ for o in final.output], ["ResponseCompactionItem"], "compaction stream helper: one item")
    check(final.output[0].encrypted_content != "", "compaction stream helper: sealed", final.output[0])
    resp = client.responses.create(model=MODEL, input=[*window, trigger])
    check_response(resp, "compaction json")
    check_eq(len(resp.output), 1, "compaction json: one item")
    item = resp.output[0]
    check(isinstance(item, ResponseCompactionItem), "compaction: typed", type(item).__name__)
    # The demo upstream's summary is its greeting and what it was asked: sealed, not readable.
    check_sealed(item.encrypted_content, [GREETING, "My name is Ada."], "compaction")
    resp = client.responses.create(model=MODEL, input=[*dumped([item]), {"role": "user", "content": "Who am I?"}])
    check_eq(resp.output_text, GREETING + "Who am I?", "a new chain from the compaction")


if __name__ == "__main__":
    main(run)
