"""The official `openai` Python SDK, streaming.

* `client.responses.stream(...)` (the helper with a context manager): every event parses into
  the SDK's typed model for its `type` and validates; the event sequence is exactly the one of
  a one-message answer; the helper's text snapshot and `get_final_response()` hold the demo's
  answer and usage;
* `client.responses.create(..., stream=True)` iteration: the same checks on the raw events,
  and the terminal event's `response.output` equals the `output_item.done` items;
* a streamed function tool round trip (store=False): the demo's call arrives as
  `function_call_arguments` deltas; the answer to the function_call_output is text;
* `max_output_tokens` cutting a streamed answer ends with `response.incomplete`.
"""

from openai import OpenAI

from _common import (
    as_sent,
    FIXED_STRING_ARG,
    GREETING,
    MODEL,
    TOOL_ANSWER,
    TOOL_RESULT,
    WEATHER_TOOL,
    call_events,
    check,
    check_eq,
    check_event,
    check_response,
    check_weather_call,
    main,
    text_events,
    words,
)

ARGUMENTS = '{"location":"' + FIXED_STRING_ARG + '"}'
# The demo streams arguments in fragments of 8 characters.
ARGUMENT_DELTAS = -(-len(ARGUMENTS) // 8)


def consume(events, what):
    """Checks every event; returns (types, events)."""
    seen = []
    for i, event in enumerate(events):
        check_event(event, i)
        seen.append(event)
    return [e.type for e in seen], seen


def check_consistent(events, what):
    """Deltas add up to the done events; the terminal response holds the done items."""
    done_items = [e.item for e in events if e.type == "response.output_item.done"]
    terminal = events[-1].response
    check_response(terminal, f"{what}: terminal response")
    check_eq(
        [as_sent(i) for i in terminal.output],
        [as_sent(i) for i in done_items],
        f"{what}: terminal output == output_item.done items",
    )
    ids = {e.response.id for e in events if e.type.startswith("response.") and hasattr(e, "response")}
    check_eq(len(ids), 1, f"{what}: one response id across lifecycle events")
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    for e in events:
        if e.type == "response.output_text.done":
            check_eq(e.text, text, f"{what}: output_text.done == deltas")
    args = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    for e in events:
        if e.type == "response.function_call_arguments.done":
            check_eq(e.arguments, args, f"{what}: function_call_arguments.done == deltas")
    return terminal


def run() -> None:
    client = OpenAI(max_retries=0, timeout=30)
    text = GREETING + "hi"

    # The streaming helper.
    with client.responses.stream(model=MODEL, input="hi") as stream:
        types, events = consume(stream, "helper")
        final = stream.get_final_response()
    check_eq(types, text_events(words(text)), "helper: event types")
    deltas = [e for e in events if e.type == "response.output_text.delta"]
    check_eq(deltas[-1].snapshot, text, "helper: text snapshot")
    check_consistent(events, "helper")
    check_response(final, "helper: final")
    check_eq(final.output_text, text, "helper: final output_text")
    check_eq(final.status, "completed", "helper: final status")
    check_eq((final.usage.input_tokens, final.usage.output_tokens), (1, words(text)), "helper: usage")
    created = events[0].response
    check_eq((created.status, created.output, created.usage), ("in_progress", [], None), "helper: response.created")

    # create(stream=True).
    stream = client.responses.create(model=MODEL, input="hi", stream=True)
    types, events = consume(stream, "create")
    check_eq(types, text_events(words(text)), "create: event types")
    terminal = check_consistent(events, "create")
    check_eq(terminal.output_text, text, "create: output_text")
    check_eq(terminal.usage.total_tokens, 1 + words(text), "create: usage")

    # A streamed tool round trip, stateless.
    question = {"role": "user", "content": "What is the weather in Paris?"}
    with client.responses.stream(model=MODEL, input=[question], tools=[WEATHER_TOOL], store=False) as stream:
        types, events = consume(stream, "tool call")
        first = stream.get_final_response()
    check_eq(types, call_events(ARGUMENT_DELTAS), "tool call: event types")
    check_consistent(events, "tool call")
    added = events[2].item
    check_eq((added.type, added.status, added.arguments), ("function_call", "in_progress", ""), "tool call: item added")
    check_eq(len(first.output), 1, "tool call: one output item")
    call = first.output[0]
    check_weather_call(call, "tool call")
    check_eq(first.output_text, "", "tool call: no text")

    stream = client.responses.create(
        model=MODEL,
        input=[question, *first.output, {"type": "function_call_output", "call_id": call.call_id, "output": TOOL_RESULT}],
        tools=[WEATHER_TOOL],
        store=False,
        stream=True,
    )
    types, events = consume(stream, "tool answer")
    check_eq(types, text_events(words(TOOL_ANSWER)), "tool answer: event types")
    terminal = check_consistent(events, "tool answer")
    check_eq(terminal.output_text, TOOL_ANSWER, "tool answer: output_text")

    # Cut by max_output_tokens: response.incomplete.
    stream = client.responses.create(model=MODEL, input="hi", max_output_tokens=3, stream=True)
    types, events = consume(stream, "incomplete")
    check_eq(types[-1], "response.incomplete", "incomplete: terminal event")
    terminal = check_consistent(events, "incomplete")
    check_eq(terminal.status, "incomplete", "incomplete: status")
    check_eq(terminal.incomplete_details.reason, "max_output_tokens", "incomplete: reason")
    check_eq(terminal.output_text, "Hello! This is", "incomplete: text")
    check("response.completed" not in types, "incomplete: no response.completed", types)


if __name__ == "__main__":
    main(run)
