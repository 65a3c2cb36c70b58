"""The official `openai` Python SDK, non-streaming: `client.responses.create(...)`.

* plain text: typed Response, output_text, status, usage (the demo counts words);
* instructions reach the upstream (they count as input tokens);
* a function tool round trip, stateless (store=False): the demo calls the tool, the script
  sends the whole conversation back with a function_call_output, the demo answers with text;
* the stateless rules surface as typed SDK errors (previous_response_id -> 400).
"""

import openai
from openai import OpenAI

from _common import (
    GREETING,
    MODEL,
    TOOL_ANSWER,
    TOOL_CALL_ID,
    TOOL_RESULT,
    WEATHER_TOOL,
    check,
    check_eq,
    check_response,
    check_weather_call,
    main,
    words,
)


def run() -> None:
    client = OpenAI(max_retries=0, timeout=30)

    # Plain text.
    resp = client.responses.create(model=MODEL, input="hi")
    check_response(resp, "text")
    text = GREETING + "hi"
    check_eq(resp.output_text, text, "text: output_text")
    check_eq(resp.status, "completed", "text: status")
    check_eq(resp.model, MODEL, "text: model")
    check_eq(resp.store, False, "text: store")
    check_eq(resp.error, None, "text: error")
    check_eq(len(resp.output), 1, "text: one output item")
    msg = resp.output[0]
    check_eq((msg.type, msg.role, msg.status), ("message", "assistant", "completed"), "text: message item")
    check(msg.id.startswith("msg_"), "text: message id", msg.id)
    check_eq([p.type for p in msg.content], ["output_text"], "text: content parts")
    check_eq(msg.content[0].annotations, [], "text: annotations")
    u = resp.usage
    check(u is not None, "text: usage present")
    check_eq((u.input_tokens, u.output_tokens, u.total_tokens), (1, words(text), 1 + words(text)), "text: usage")
    check_eq(u.input_tokens_details.cached_tokens, 0, "text: cached_tokens")
    check_eq(u.output_tokens_details.reasoning_tokens, 0, "text: reasoning_tokens")

    # Instructions become the leading system message: counted by the demo as input.
    resp = client.responses.create(
        model=MODEL, instructions="Answer briefly.", input="hi", max_output_tokens=64, temperature=0.5
    )
    check_response(resp, "instructions")
    check_eq(resp.output_text, text, "instructions: output_text")
    check_eq(resp.usage.input_tokens, 3, "instructions: input_tokens (2 instruction words + 1)")
    check_eq(resp.instructions, "Answer briefly.", "instructions: echoed")
    check_eq(resp.max_output_tokens, 64, "instructions: max_output_tokens echoed")
    check_eq(resp.temperature, 0.5, "instructions: temperature echoed")

    # max_output_tokens cuts the answer: status incomplete.
    resp = client.responses.create(model=MODEL, input="hi", max_output_tokens=3)
    check_response(resp, "incomplete")
    check_eq(resp.status, "incomplete", "incomplete: status")
    check_eq(resp.incomplete_details.reason, "max_output_tokens", "incomplete: reason")
    check_eq(resp.output_text, "Hello! This is", "incomplete: output_text")

    # A function tool round trip, stateless.
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first = client.responses.create(model=MODEL, input=[question], tools=[WEATHER_TOOL], store=False)
    check_response(first, "tool call")
    check_eq(first.status, "completed", "tool call: status")
    check_eq(len(first.output), 1, "tool call: one output item")
    call = first.output[0]
    check_weather_call(call, "tool call")
    check_eq(first.output_text, "", "tool call: no text")
    check_eq([t.name for t in first.tools], ["get_weather"], "tool call: tools echoed")
    check_eq(first.tool_choice, "auto", "tool call: tool_choice")

    second = client.responses.create(
        model=MODEL,
        input=[
            question,
            *first.output,  # the typed function_call item, sent back as is
            {"type": "function_call_output", "call_id": call.call_id, "output": TOOL_RESULT},
        ],
        tools=[WEATHER_TOOL],
        store=False,
    )
    check_response(second, "tool answer")
    check_eq(second.status, "completed", "tool answer: status")
    check_eq(second.output_text, TOOL_ANSWER, "tool answer: output_text")
    check_eq(call.call_id, TOOL_CALL_ID, "tool answer: call id")

    # Stateless: previous_response_id is a typed 400 with the spec's code and param.
    try:
        client.responses.create(model=MODEL, input="again", previous_response_id=first.id)
    except openai.BadRequestError as e:
        check_eq(e.status_code, 400, "previous_response_id: status")
        check_eq(e.code, "previous_response_not_found", "previous_response_id: code")
        check_eq(e.param, "previous_response_id", "previous_response_id: param")
    else:
        check(False, "previous_response_id: expected a 400")


if __name__ == "__main__":
    main(run)
