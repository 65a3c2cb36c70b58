"""The official `openai` Python SDK's typed `responses.create(context_management=...)`:
automatic compaction. Run by tests/e2e/clients.rs against a scripted upstream that answers,
in order:
  1. JSON text SUMMARY (the summarising request of the first turn);
  2. JSON text "Dogs are loyal." (the first turn, on the compacted window);
  3. JSON text "Birds fly." (the second turn: its window is under the threshold);
  4. JSON text SUMMARY, then 5. an SSE stream saying "Streamed." (a streamed compacting turn).

* the first answer parses into the SDK's Response, its output a ResponseCompactionItem then
  the message; usage counts both upstream requests;
* the history sent back the SDK's own way (`model_dump()`: null for every unset field), with
  the same context_management, is accepted and answered;
* streamed, the compaction item's added and done events come before the message's.
"""

from openai import OpenAI
from openai.types.responses import ResponseCompactionItem, ResponseOutputMessage

from _common import MODEL, check, check_eq, check_response, main

HISTORY = [
    {"role": "user", "content": "Tell me about cats, at length, with every detail you know."},
    {"role": "assistant", "content": "Cats are small carnivorous mammals."},
    {"role": "user", "content": "And their whiskers?"},
    {"role": "assistant", "content": "Whiskers sense the air around them."},
    {"role": "user", "content": "Now dogs."},
]
COMPACT = [{"type": "compaction", "compact_threshold": 50}]


def run() -> None:
    client = OpenAI(max_retries=0, timeout=30)

    first = client.responses.create(model=MODEL, input=HISTORY, context_management=COMPACT, store=False)
    check_response(first, "compacted turn")
    check_eq(len(first.output), 2, "compacted turn: two output items")
    item = first.output[0]
    check(isinstance(item, ResponseCompactionItem), "compacted turn: typed compaction item", type(item).__name__)
    check(len(item.encrypted_content) > 40, "compacted turn: sealed", item.encrypted_content)
    check(isinstance(first.output[1], ResponseOutputMessage), "compacted turn: then the message", first.output[1])
    check_eq(first.output_text, "Dogs are loyal.", "compacted turn: output_text")
    check_eq(first.usage.input_tokens, 5 + 5, "compacted turn: usage counts both requests")

    # The client's habit: its history plus the output, dumped with nulls, and a new message.
    dumped = [o.model_dump() for o in first.output]
    second = client.responses.create(
        model=MODEL,
        input=HISTORY + dumped + [{"role": "user", "content": "And birds?"}],
        context_management=[{"type": "compaction", "compact_threshold": 100000}],
        store=False,
    )
    check_response(second, "next turn")
    check_eq(second.output_text, "Birds fly.", "next turn: output_text")
    check_eq(second.output[0].type, "message", "next turn: no compaction under the threshold")

    order = []
    with client.responses.stream(model=MODEL, input=HISTORY, context_management=COMPACT, store=False) as stream:
        for event in stream:
            item = getattr(event, "item", None)
            order.append(f"{event.type} {item.type if item is not None else ''}".strip())
        final = stream.get_final_response()
    check_eq(
        order[:6],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added compaction",
            "response.compaction.compacting",
            "response.output_item.done compaction",
            "response.output_item.added message",
        ],
        "stream: the compaction item leads",
    )
    check_eq(final.output_text, "Streamed.", "stream: output_text")
    check(isinstance(final.output[0], ResponseCompactionItem), "stream: final output starts with the item", final.output[0])


if __name__ == "__main__":
    main(run)
