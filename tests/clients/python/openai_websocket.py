"""The official `openai` Python SDK's WebSocket transport, `client.responses.connect()`,
through Envoy. Run by tests/e2e/clients.rs against a scripted upstream that answers, in order:
  1. SSE "Hello Ada."      (a create)
  2. SSE "You are Ada."    (its continuation; the Rust test checks the context it was sent)
  3. JSON 500              (a continuation that fails upstream)
  4. SSE "one", 5. SSE "two"  (two creates sent back to back)
  6. JSON SUMMARY          (`responses.compact()` over HTTP)
  7. SSE "Done."           (a new chain from the compaction, over a new socket)

* events parse into the SDK's WebSocket event models, numbered from 0 per response;
* `previous_response_id` with only the new items continues the last response (store=False);
* an unknown id and an id evicted by a failed continuation are `previous_response_not_found`
  error events with status 400; the upstream's 500 is an error event with status 500;
* responses sent back to back are answered in order, one at a time;
* a compaction item from `responses.compact()` starts a new chain on a socket.
"""

from openai import OpenAI

from _common import MODEL, check, check_eq, main

TERMINAL = {"response.completed", "response.failed", "response.incomplete"}


def until_terminal(conn, what: str) -> list:
    """The events of one response, to its terminal event (or a lone error event)."""
    events = []
    for event in conn:
        events.append(event)
        if event.type in TERMINAL or (event.type == "error" and len(events) == 1):
            break
    check(events, f"{what}: events")
    if events[-1].type != "error":
        numbers = [e.sequence_number for e in events]
        check_eq(numbers, list(range(len(events))), f"{what}: sequence numbers")
        check(
            all(not type(e).__name__.startswith("Unknown") for e in events),
            f"{what}: every event has an SDK model",
            [type(e).__name__ for e in events],
        )
    return events


def completed(conn, what: str, text: str):
    events = until_terminal(conn, what)
    response = events[-1].response
    check_eq((events[-1].type, response.status), ("response.completed", "completed"), f"{what}: terminal")
    check_eq(response.output_text, text, f"{what}: output_text")
    return response


def error(conn, what: str, status: int, code: str | None) -> None:
    event = conn.recv()
    check_eq(event.type, "error", f"{what}: an error event")
    check_eq(event.status, status, f"{what}: status")
    if code is not None:
        check_eq(event.error.code, code, f"{what}: code")


def run() -> None:
    client = OpenAI(max_retries=0, timeout=30)
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input="I am Ada.", instructions="Be brief.", store=False)
        first = completed(conn, "create", "Hello Ada.")
        check(first.id.startswith("resp_"), "create: id", first.id)

        conn.response.create(
            model=MODEL,
            previous_response_id=first.id,
            input=[{"role": "user", "content": "Who am I?"}],
            store=False,
        )
        second = completed(conn, "continuation", "You are Ada.")
        check_eq(second.previous_response_id, first.id, "continuation: previous_response_id")

        conn.response.create(model=MODEL, previous_response_id="resp_missing", input="x")
        error(conn, "unknown id", 400, "previous_response_not_found")

        conn.response.create(model=MODEL, previous_response_id=second.id, input="again")
        error(conn, "failed continuation", 500, None)
        conn.response.create(model=MODEL, previous_response_id=second.id, input="again")
        error(conn, "evicted id", 400, "previous_response_not_found")

        conn.response.create(model=MODEL, input="one")
        conn.response.create(model=MODEL, input="two")
        completed(conn, "first of two", "one")
        completed(conn, "second of two", "two")

    compacted = client.responses.compact(
        model=MODEL,
        input=[{"role": "user", "content": "My name is Ada."}, {"role": "user", "content": "Remember 42."}],
    )
    check_eq(compacted.object, "response.compaction", "compact: object")
    items = [o.to_dict(mode="json", exclude_none=True, warnings=False) for o in compacted.output]
    with client.responses.connect() as conn:
        conn.response.create(model=MODEL, input=items + [{"role": "user", "content": "Which number?"}])
        completed(conn, "new chain from the compaction", "Done.")


if __name__ == "__main__":
    main(run)
