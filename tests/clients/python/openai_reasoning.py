"""The official `openai` Python SDK with a reasoning upstream, the processor with its defaults
(`--reasoning-events auto`: the SDK's headers get it the event names OpenAI's SDKs know). Run by tests/e2e/clients.rs
against a scripted upstream that answers, in order:
  1. and 2. a stream: reasoning "Let me think." in two chunks, then text "Hi there.";
  3. the same as one JSON chat completion;
  4. JSON text "Done." (the upstream request is checked by the Rust test).

* every streamed event, reasoning ones included, parses into the SDK's typed model for its
  `type` and validates (with the spec's names, `response.reasoning.delta`, the SDK would build
  a wrong model: it has no such type);
* the reasoning item (typed ResponseReasoningItem) carries the reasoning text, and, when
  `include: ["reasoning.encrypted_content"]` asks for it, an opaque `encrypted_content`;
* stateless multi-turn: the reasoning item goes back as input with store=False.
"""

from openai import OpenAI
from openai.types.responses import ResponseReasoningItem

from _common import MODEL, check, check_eq, check_event, check_response, main

REASONING = "Let me think."
TEXT = "Hi there."
EVENTS = [
    "response.created",
    "response.in_progress",
    "response.output_item.added",
    "response.content_part.added",
    "response.reasoning_text.delta",
    "response.reasoning_text.delta",
    "response.reasoning_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.output_item.added",
    "response.content_part.added",
    "response.output_text.delta",
    "response.output_text.delta",
    "response.output_text.done",
    "response.content_part.done",
    "response.output_item.done",
    "response.completed",
]


def check_reasoning(item, what, sealed):
    check(isinstance(item, ResponseReasoningItem), f"{what}: typed reasoning item", type(item).__name__)
    check(item.id.startswith("rs_"), f"{what}: id", item.id)
    check_eq([(c.type, c.text) for c in item.content or []], [("reasoning_text", REASONING)], f"{what}: content")
    if sealed:
        check(isinstance(item.encrypted_content, str) and len(item.encrypted_content) > 20, f"{what}: encrypted_content", item.encrypted_content)
    else:
        check_eq(item.encrypted_content, None, f"{what}: no encrypted_content unless included")


def run() -> None:
    client = OpenAI(max_retries=0, timeout=30)

    # 1. The streaming helper.
    with client.responses.stream(model=MODEL, input="hi", reasoning={"effort": "low"}) as stream:
        types = [check_event(e, i) for i, e in enumerate(stream)]
        final = stream.get_final_response()
    check_eq(types, EVENTS, "helper: event types")
    check_response(final, "helper: final")
    check_eq(final.output_text, TEXT, "helper: output_text")
    check_reasoning(final.output[0], "helper", sealed=False)
    check_eq(final.reasoning.effort, "low", "helper: reasoning echoed")

    # 2. create(stream=True), with encrypted reasoning.
    events = list(
        client.responses.create(
            model=MODEL, input="hi", stream=True, store=False, include=["reasoning.encrypted_content"]
        )
    )
    check_eq([check_event(e, i) for i, e in enumerate(events)], EVENTS, "create: event types")
    check_eq(
        "".join(e.delta for e in events if e.type == "response.reasoning_text.delta"), REASONING, "create: reasoning deltas"
    )
    terminal = events[-1].response
    check_response(terminal, "create: terminal")
    check_reasoning(terminal.output[0], "create", sealed=True)

    # 3. Non-streaming, with encrypted reasoning.
    resp = client.responses.create(model=MODEL, input="hi", store=False, include=["reasoning.encrypted_content"])
    check_response(resp, "json")
    check_eq([i.type for i in resp.output], ["reasoning", "message"], "json: output items")
    check_reasoning(resp.output[0], "json", sealed=True)
    check_eq(resp.output_text, TEXT, "json: output_text")

    # 4. Stateless multi-turn: everything goes back, the sealed reasoning included.
    resp = client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": "hi"}, *resp.output, {"role": "user", "content": "and now?"}],
        store=False,
        include=["reasoning.encrypted_content"],
    )
    check_response(resp, "turn 2")
    check_eq(resp.output_text, "Done.", "turn 2: output_text")


if __name__ == "__main__":
    main(run)
