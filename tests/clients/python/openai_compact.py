"""The official `openai` Python SDK's `client.responses.compact()`, then a new chain from its
output. Run by tests/e2e/clients.rs against a scripted upstream that answers, in order:
  1. JSON text SUMMARY (the summarising request; checked by the Rust test);
  2. JSON text "Done." (the next turn; the Rust test checks that the summary reached it).

* the answer parses into the SDK's CompactedResponse: object "response.compaction", the latest
  user message kept verbatim, then one compaction item (validated as ResponseCompactionItem)
  whose encrypted_content is opaque (the summary is not readable in it);
* a new `responses.create` with that output plus a new user message works (store=False);
* an altered encrypted_content is a 400 `invalid_encrypted_content`, raised by the SDK as
  BadRequestError (the upstream is never asked).
"""

import openai
from openai import OpenAI
from openai.types.responses import CompactedResponse, ResponseCompactionItem

from _common import MODEL, check, check_eq, check_response, check_sealed, main

SUMMARY = "Ada wants the number 42 remembered."
WINDOW = [
    {"role": "user", "content": "My name is Ada."},
    {
        "type": "message",
        "role": "assistant",
        "content": [{"type": "output_text", "text": "Hello Ada.", "annotations": []}],
    },
    {"role": "user", "content": "Remember 42."},
]


def run() -> None:
    client = OpenAI(max_retries=0, timeout=30)

    compacted = client.responses.compact(model=MODEL, input=WINDOW, instructions="Be brief.")
    check(isinstance(compacted, CompactedResponse), "compact: typed CompactedResponse", type(compacted).__name__)
    check_eq(compacted.object, "response.compaction", "compact: object")
    check(compacted.id.startswith("resp_"), "compact: id", compacted.id)
    check(isinstance(compacted.created_at, int) and compacted.created_at > 0, "compact: created_at", compacted.created_at)
    check_eq(compacted.usage.input_tokens, 5, "compact: usage.input_tokens")
    check_eq(compacted.usage.total_tokens, 11, "compact: usage.total_tokens")
    raw = compacted.to_dict(mode="json", warnings=False)
    check_eq(len(raw["output"]), 2, "compact: two output items")
    kept = raw["output"][0]
    check_eq(
        (kept["type"], kept["role"], kept["content"]),
        ("message", "user", [{"type": "input_text", "text": "Remember 42."}]),
        "compact: the latest user message, verbatim",
    )
    item = compacted.output[1]
    check(isinstance(item, ResponseCompactionItem), "compact: typed compaction item", type(item).__name__)
    ResponseCompactionItem.model_validate(raw["output"][1])
    check_eq(item.type, "compaction", "compaction: type")
    check_sealed(item.encrypted_content, [SUMMARY], "compaction")

    # A new chain from the compacted window.
    items = [o.to_dict(mode="json", exclude_none=True, warnings=False) for o in compacted.output]
    resp = client.responses.create(
        model=MODEL, input=items + [{"role": "user", "content": "Which number?"}], store=False
    )
    check_response(resp, "next turn")
    check_eq(resp.output_text, "Done.", "next turn: output_text")

    # An altered blob is refused before the upstream is asked.
    bad = dict(items[1])
    blob = bad["encrypted_content"]
    bad["encrypted_content"] = blob[:-4] + ("AAAA" if not blob.endswith("AAAA") else "BBBB")
    try:
        client.responses.create(model=MODEL, input=[bad, {"role": "user", "content": "hi"}], store=False)
    except openai.BadRequestError as e:
        check_eq(e.status_code, 400, "tampered: status")
        check_eq(e.code, "invalid_encrypted_content", "tampered: code")
        check_eq(e.param, "input[0].encrypted_content", "tampered: param")
    else:
        raise AssertionError("tampered: a compaction item that does not open was accepted")


if __name__ == "__main__":
    main(run)
