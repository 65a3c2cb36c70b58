"""The official `openai` Python SDK backs off as the upstream asked, through the gateway.

The scripted upstream (tests/e2e/clients.rs) answers the first Chat request 429 with
`retry-after: 1` and the second with a completion. With `max_retries=1` the SDK reads the
`retry-after` header of the translated 429 envelope, waits that second, and retries; the
create succeeds. The test then checks, in the upstream's own log, that the retry came at
least a second after the first request.
"""

from openai import OpenAI

from _common import check_eq, main


def run() -> None:
    client = OpenAI(max_retries=1, timeout=30)
    raw = client.responses.with_raw_response.create(model="m", input="hi")
    check_eq(raw.retries_taken, 1, "retries taken")
    resp = raw.parse()
    check_eq(resp.status, "completed", "status after the retry")
    check_eq(resp.output_text, "Hi after the wait.", "output_text after the retry")


if __name__ == "__main__":
    main(run)
