"""The `openai-agents` SDK with a reasoning upstream (scripted by tests/e2e/clients.rs): an
Agent with one @function_tool, run to the end of its loop, stateless, first with Runner.run
(JSON answers), then with Runner.run_streamed. Each model turn 1 reasons ("Checking the
weather.") then calls get_weather; turn 2 answers "It is sunny.".

Checks: every streamed raw event is typed by the SDK (reasoning events included); the run's
items hold the reasoning item, the call, its output and the message; the tool ran with the
arguments; and the second request of each run carried the reasoning item back (the Rust test
checks that it reached the upstream as reasoning_content).
"""

import asyncio
import json

from agents import Agent, ModelSettings, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from _common import MODEL, BASE_URL, check, check_eq, check_event, check_response, main

REASONING = "Checking the weather."
ANSWER = "It is sunny."
tool_calls: list[str] = []
sent: list[dict] = []


@function_tool
def get_weather(location: str) -> str:
    """The current weather at a location.

    Args:
        location: City and region.
    """
    tool_calls.append(location)
    return "sunny"


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
        instructions="Use the tool.",
        tools=[get_weather],
        model=OpenAIResponsesModel(model=MODEL, openai_client=client),
        model_settings=ModelSettings(store=False),
    )


def check_run(result, what: str) -> None:
    check_eq(tool_calls, ["Paris"], f"{what}: the tool ran once")
    check_eq(result.final_output, ANSWER, f"{what}: final_output")
    check_eq(
        [item.type for item in result.new_items],
        ["reasoning_item", "tool_call_item", "tool_call_output_item", "message_output_item"],
        f"{what}: run items",
    )
    reasoning = result.new_items[0].raw_item
    check_eq([c.text for c in reasoning.content or []], [REASONING], f"{what}: reasoning text")
    check_eq(len(sent), 2, f"{what}: requests")
    check_eq(
        [item.get("type", "message") for item in sent[1]["input"]],
        ["message", "reasoning", "function_call", "function_call_output"],
        f"{what}: the second request's input",
    )


async def run_async() -> None:
    set_tracing_disabled(True)
    result = await Runner.run(make_agent(), "Weather in Paris?")
    check_run(result, "run")

    tool_calls.clear()
    sent.clear()
    streamed = Runner.run_streamed(make_agent(), "Weather in Paris?")
    per_turn: list[list[str]] = [[]]
    async for event in streamed.stream_events():
        if event.type != "raw_response_event":
            continue
        check_event(event.data, len(per_turn[-1]))
        per_turn[-1].append(event.data.type)
        if event.data.type == "response.completed":
            check_response(event.data.response, "run_streamed: completed")
            per_turn.append([])
    check("response.reasoning_text.delta" in per_turn[0], "run_streamed: turn 1 streams reasoning", per_turn[0])
    check("response.function_call_arguments.done" in per_turn[0], "run_streamed: turn 1 is a call", per_turn[0])
    check_run(streamed, "run_streamed")


if __name__ == "__main__":
    main(lambda: asyncio.run(run_async()))
