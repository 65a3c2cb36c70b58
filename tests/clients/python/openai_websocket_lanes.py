"""Lanes (`stream_id`) and steering (`connection.response.steer`) of openai-python's WebSocket
transport, `client.responses.connect()`, through Envoy. Run by tests/e2e/clients.rs against a
scripted upstream that answers, in order:
  1. SSE "A", held after its first chunk  (lane a; released by this script)
  2. SSE "B"                              (lane b, while lane a is held)
  3. SSE "one", 4. SSE "two"              (lane c, two creates back to back)
  5. SSE "forked"                         (lane d, continuing lane a's response)
  6. SSE "Roses.", held after its first chunk (lane s; steered while held)
  7. SSE "And the sea."                   (its successor, with the steer's input)
  8. a call to `lookup` ("call_1"), held after its first chunk (lane t; steered while held)
  9. SSE "Quarante-deux."                 (the client's continuation with the tool's output)

* two lanes run side by side: lane b completes while lane a's response is still in flight;
* one lane is FIFO; a lane continues a response of another lane;
* every event of a lane carries its `stream_id`, parsed into the SDK's event models;
* a steer during a streamed answer: `response.steer.accepted`, the response completes, and a
  successor continuing it starts by itself (the Rust test checks its input ends with the
  steer's text);
* a steer of a response that stops for the client's tool: `response.steer.pending` with the
  `required_input` stub after `response.completed`, then the explicit continuation;
* failures: `response_not_found`, `invalid_input`, `response_already_completed`.
"""

import os

import httpx2 as httpx
from openai import OpenAI

from _common import MODEL, check, check_eq, main

TERMINAL = {"response.completed", "response.failed", "response.incomplete"}
LOOKUP = {"type": "function", "name": "lookup", "parameters": {"type": "object", "properties": {}}}


def release() -> None:
    """Lets the scripted upstream's next held reply go on."""
    answer = httpx.post(os.environ["SCRIPTED_UPSTREAM_URL"] + "/__release", timeout=10)
    check_eq(answer.status_code, 204, "release a held reply")


def typed(event) -> None:
    check(not type(event).__name__.startswith("Unknown"), "an SDK model", type(event).__name__)


def next_on(conn, lane: str, seen: dict):
    """The next event of `lane`; events of other lanes are kept in `seen` until asked for."""
    if seen.get(lane):
        event = seen[lane].pop(0)
        if not seen[lane]:
            del seen[lane]
        return event
    for event in conn:
        typed(event)
        check(event.stream_id is not None, "every event of a lane names it", event.type)
        if event.stream_id == lane:
            return event
        seen.setdefault(event.stream_id, []).append(event)
    raise AssertionError("the connection ended")


def response_on(conn, lane: str, what: str, seen: dict, first=None) -> list:
    """The events of one response on `lane` (`first` already read), to its terminal event."""
    events = [first] if first is not None else []
    while not events or events[-1].type not in TERMINAL:
        event = next_on(conn, lane, seen)
        check(event.type != "error", f"{what}: no error", event)
        events.append(event)
    numbers = [e.sequence_number for e in events if not e.type.startswith("response.steer.")]
    check_eq(numbers, sorted(numbers), f"{what}: in order")
    return events


def completed(events: list, what: str, text: str):
    response = events[-1].response
    check_eq((events[-1].type, response.status), ("response.completed", "completed"), f"{what}: terminal")
    check_eq(response.output_text, text, f"{what}: output_text")
    return response


def steer_failed(conn, what: str, code: str, steer_input) -> None:
    event = conn.recv()
    typed(event)
    check_eq(event.type, "response.steer.failed", f"{what}: event")
    check_eq(event.error.code, code, f"{what}: code")
    given = event.steer.input
    if isinstance(given, list):
        given = [i.to_dict() if hasattr(i, "to_dict") else i for i in given]
    check_eq(given, steer_input, f"{what}: the input given back")


def run() -> None:
    client = OpenAI(max_retries=0, timeout=30)
    seen: dict = {}
    with client.responses.connect() as conn:
        # Two lanes side by side: lane a is held upstream while lane b runs to its end.
        conn.response.create(model=MODEL, input="slow", stream_id="a", store=False)
        created_a = next_on(conn, "a", seen)
        check_eq(created_a.type, "response.created", "lane a: created")
        conn.response.create(model=MODEL, input="fast", stream_id="b", store=False)
        b = completed(response_on(conn, "b", "lane b", seen), "lane b", "B")
        release()
        a = completed(response_on(conn, "a", "lane a", seen, first=created_a), "lane a", "A")
        check(a.id != b.id, "two responses")

        # One lane is FIFO.
        conn.response.create(model=MODEL, input="first", stream_id="c", store=False)
        conn.response.create(model=MODEL, input="second", stream_id="c", store=False)
        one = completed(response_on(conn, "c", "lane c, first", seen), "lane c, first", "one")
        two = completed(response_on(conn, "c", "lane c, second", seen), "lane c, second", "two")
        check(one.id != two.id, "lane c: two responses")

        # A lane continues a response of another.
        conn.response.create(model=MODEL, input="and?", stream_id="d", previous_response_id=a.id, store=False)
        forked = completed(response_on(conn, "d", "fork", seen), "fork", "forked")
        check_eq(forked.previous_response_id, a.id, "fork: previous_response_id")

        # A steer during a streamed answer.
        conn.response.create(model=MODEL, input="Write about roses.", stream_id="s", instructions="Be brief.", store=False)
        created = next_on(conn, "s", seen)
        check_eq(created.type, "response.created", "steered: created")
        conn.response.steer(input="Also mention the sea.", previous_response_id=created.response.id)
        accepted = next_on(conn, "s", seen)
        while accepted.type != "response.steer.accepted":
            accepted = next_on(conn, "s", seen)
        check_eq(accepted.steer.previous_response_id, created.response.id, "accepted: its target")
        check(accepted.steer.id.startswith("steer_"), "accepted: an id", accepted.steer.id)
        release()
        first = completed(response_on(conn, "s", "steered", seen), "steered", "Roses.")
        successor = response_on(conn, "s", "successor", seen)
        check_eq(successor[0].type, "response.created", "successor: created (the commit point)")
        second = completed(successor, "successor", "And the sea.")
        check_eq(second.previous_response_id, first.id, "successor: continues the steered response")
        check_eq(second.instructions, "Be brief.", "successor: inherits the settings")

        # A steer of a response that stops for the client's tool output.
        conn.response.create(model=MODEL, input="Look it up.", stream_id="t", tools=[LOOKUP], store=False)
        created = next_on(conn, "t", seen)
        conn.response.steer(input=[{"type": "message", "role": "user", "content": "In French, please."}],
                            previous_response_id=created.response.id)
        accepted = next_on(conn, "t", seen)
        while accepted.type != "response.steer.accepted":
            accepted = next_on(conn, "t", seen)
        release()
        called = response_on(conn, "t", "tool call", seen)
        check_eq(called[-1].type, "response.completed", "tool call: completed")
        call = called[-1].response.output[-1]
        check_eq((call.type, call.call_id, call.name), ("function_call", "call_1", "lookup"), "tool call")
        pending = next_on(conn, "t", seen)
        check_eq(pending.type, "response.steer.pending", "pending after completed")
        check_eq(pending.reason, "waiting_for_required_input", "pending: reason")
        check_eq(pending.steer.id, accepted.steer.id, "pending: the accepted steer")
        stubs = [s.to_dict() for s in pending.required_input]
        check_eq(stubs, [{"type": "function_call_output", "call_id": "call_1", "name": "lookup"}], "pending: stubs")
        conn.response.create(
            model=MODEL, stream_id="t", tools=[LOOKUP], previous_response_id=called[-1].response.id, store=False,
            input=[{"type": "function_call_output", "call_id": "call_1", "output": "42"}],
        )
        completed(response_on(conn, "t", "continuation", seen), "continuation", "Quarante-deux.")
        check(not seen, "no event left unread on another lane", seen)

        # What cannot steer.
        conn.response.steer(input="x", previous_response_id="resp_missing")
        steer_failed(conn, "unknown response", "response_not_found", "x")
        bad = [{"type": "message", "role": "assistant", "content": "x"}]
        conn.response.steer(input=bad, previous_response_id=a.id)
        steer_failed(conn, "assistant input", "invalid_input", bad)
        conn.response.steer(input="late", previous_response_id=two.id)
        steer_failed(conn, "ended response", "response_already_completed", "late")


if __name__ == "__main__":
    main(run)
