"""The `openai-agents` SDK: an Agent with one @function_tool, run to the end of its loop
(model -> function_call -> the tool runs -> function_call_output -> final text), stateless
(ModelSettings(store=False)), through OpenAIResponsesModel on an AsyncOpenAI client pointed at
Envoy. Tracing is disabled; nothing but loopback is contacted.

Checks: the tool ran exactly once with the demo's arguments; the final output is the demo's
answer to the tool result; the run's items and raw responses; usage summed over both turns;
and on the wire, both requests said store=false, the second carried the function_call (as the
first response returned it) and its function_call_output. Then the same with
Runner.run_streamed (every streamed raw event of the SDK checked like the openai scripts do).
"""

import asyncio
import json

from agents import (
    Agent,
    ModelSettings,
    OpenAIResponsesModel,
    Runner,
    function_tool,
    set_tracing_disabled,
)
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from _common import (
    BASE_URL,
    FIXED_STRING_ARG,
    MODEL,
    TOOL_ANSWER,
    TOOL_CALL_ID,
    TOOL_RESULT,
    check,
    check_eq,
    check_event,
    check_response,
    main,
    words,
)

QUESTION = "What is the weather in Paris?"
INSTRUCTIONS = "You answer weather questions with the get_weather tool."

tool_calls: list[str] = []
sent: list[dict] = []


@function_tool
def get_weather(location: str) -> str:
    """The current weather at a location.

    Args:
        location: City and region.
    """
    tool_calls.append(location)
    return TOOL_RESULT


async def record(request) -> None:
    if request.method == "POST" and request.url.path.endswith("/responses"):
        sent.append(json.loads(request.content))


def make_agent() -> Agent:
    client = AsyncOpenAI(
        base_url=BASE_URL,
        api_key="x",
        max_retries=0,
        timeout=30,
        http_client=DefaultAsyncHttpxClient(event_hooks={"request": [record]}),
    )
    return Agent(
        name="weather",
        instructions=INSTRUCTIONS,
        tools=[get_weather],
        model=OpenAIResponsesModel(model=MODEL, openai_client=client),
        model_settings=ModelSettings(store=False),
    )


def check_requests(what: str) -> None:
    check_eq(len(sent), 2, f"{what}: requests to /responses")
    for i, body in enumerate(sent):
        check_eq(body.get("store"), False, f"{what}: request {i} store")
        check_eq(body.get("instructions"), INSTRUCTIONS, f"{what}: request {i} instructions")
        check_eq([t.get("name") for t in body.get("tools", [])], ["get_weather"], f"{what}: request {i} tools")
        check("previous_response_id" not in body, f"{what}: request {i} is stateless", body.get("previous_response_id"))
    second = sent[1]["input"]
    types = [item.get("type", "message") for item in second]
    check_eq(types, ["message", "function_call", "function_call_output"], f"{what}: second request's input items")
    check_eq(second[1].get("call_id"), TOOL_CALL_ID, f"{what}: function_call call_id")
    check_eq(second[2].get("call_id"), TOOL_CALL_ID, f"{what}: function_call_output call_id")
    check_eq(second[2].get("output"), TOOL_RESULT, f"{what}: function_call_output output")


def check_result(result, what: str) -> None:
    check_eq(tool_calls, [FIXED_STRING_ARG], f"{what}: the tool ran once with the demo's arguments")
    check_eq(result.final_output, TOOL_ANSWER, f"{what}: final_output")
    check_eq(
        [item.type for item in result.new_items],
        ["tool_call_item", "tool_call_output_item", "message_output_item"],
        f"{what}: run items",
    )
    check_eq(len(result.raw_responses), 2, f"{what}: model turns")
    usage = result.context_wrapper.usage
    check_eq(usage.requests, 2, f"{what}: usage.requests")
    # Turn 1: instructions + question in, the arguments out; turn 2: the demo's answer out.
    check_eq(usage.output_tokens, words('{"location":"San Francisco, CA"}') + words(TOOL_ANSWER), f"{what}: output_tokens")
    check(usage.input_tokens > 0 and usage.total_tokens == usage.input_tokens + usage.output_tokens, f"{what}: usage", usage)
    check_requests(what)


async def run_async() -> None:
    set_tracing_disabled(True)

    result = await Runner.run(make_agent(), QUESTION)
    for i, raw in enumerate(result.raw_responses):
        check_eq(raw.response_id is not None and raw.response_id.startswith("resp_"), True, f"run: response {i} id")
    check_result(result, "run")

    tool_calls.clear()
    sent.clear()
    streamed = Runner.run_streamed(make_agent(), QUESTION)
    per_turn: list[list[str]] = [[]]
    async for event in streamed.stream_events():
        if event.type != "raw_response_event":
            continue
        data = event.data
        check_event(data, len(per_turn[-1]))
        per_turn[-1].append(data.type)
        if data.type == "response.completed":
            check_response(data.response, "run_streamed: completed")
            per_turn.append([])
    check_eq(len(per_turn), 3, f"run_streamed: two streamed model turns {per_turn}")
    check_eq(per_turn[0][-1], "response.completed", "run_streamed: turn 1 ends")
    check("response.function_call_arguments.done" in per_turn[0], "run_streamed: turn 1 is a call", per_turn[0])
    check("response.output_text.done" in per_turn[1], "run_streamed: turn 2 is text", per_turn[1])
    check_result(streamed, "run_streamed")


if __name__ == "__main__":
    main(lambda: asyncio.run(run_async()))
