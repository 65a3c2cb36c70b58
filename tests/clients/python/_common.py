"""Shared helpers of the Python client scripts (run by tests/e2e/clients.rs).

Every script talks to Envoy at $OPENAI_BASE_URL (the processor in front of the built-in demo
upstream, src/demo.rs) and exits non-zero on the first mismatch, printing what it saw.

The demo is deterministic:
* no tools, or the last message is not from the user -> text;
  text for user input U is  "Hello! This is the demo upstream. You said: U";
* tools offered and the last message is from the user -> one call to the first tool, id
  "call_demo_1", every required string argument set to "San Francisco, CA";
* the last message is a tool result R -> "The tool returned: R".
"Tokens" are whitespace-separated words.
"""

from __future__ import annotations

import base64
import json
import os
import sys
import typing

import httpx2 as httpx
import pydantic
from openai.resources.responses.responses import ResponsesConnection
from openai.types.responses import Response, ResponseStreamEvent

BASE_URL = os.environ.get("OPENAI_BASE_URL", "")
MODEL = "demo-model"
GREETING = "Hello! This is the demo upstream. You said: "
TOOL_CALL_ID = "call_demo_1"
FIXED_STRING_ARG = "San Francisco, CA"
TOOL_RESULT = "sunny, 21 C"
TOOL_ANSWER = "The tool returned: " + TOOL_RESULT

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather at a location.",
    "parameters": {
        "type": "object",
        "properties": {"location": {"type": "string", "description": "City and region"}},
        "required": ["location"],
        "additionalProperties": False,
    },
}


class Mismatch(AssertionError):
    pass


# ---- every body and event is read for duplicate keys ----
#
# A JSON object with a key twice is valid to `json.loads` (the last one wins) but fails strict
# readers. Every response body (JSON), SSE event and WebSocket message any script receives
# goes through `strict_loads` here, on top of the SDK's own parsing: the httpx transports
# (sync and async, so openai-agents too) and the SDK's WebSocket connection are wrapped.
DUPLICATE_KEYS: list[str] = []


def _no_duplicates(pairs: list) -> dict:
    seen: dict = {}
    for k, v in pairs:
        if k in seen:
            raise ValueError(f"duplicate key {k!r}")
        seen[k] = v
    return seen


def strict_loads(text: str | bytes, what: str) -> object:
    """`json.loads` that records (in DUPLICATE_KEYS) and raises on a key given twice."""
    try:
        return json.loads(text, object_pairs_hook=_no_duplicates)
    except ValueError as e:
        if "duplicate key" in str(e):
            DUPLICATE_KEYS.append(f"{what}: {e}: {text[:300]!r}")
            # DUPLICATE_KEYS=record: noted (and failing the script at the end) without failing
            # the request, to see what else fails.
            if os.environ.get("DUPLICATE_KEYS") != "record":
                raise Mismatch(f"{what}: {e}") from None
            return json.loads(text)
        raise


class _Checker:
    """Reads a body as it streams by: each SSE `data:` line, or the whole JSON body."""

    def __init__(self, url: str, sse: bool) -> None:
        self.url, self.sse, self.buf = url, sse, b""

    def feed(self, chunk: bytes) -> None:
        self.buf += chunk
        if self.sse:
            *lines, self.buf = self.buf.split(b"\n")
            for line in lines:
                if line.startswith(b"data:") and line[5:].strip() not in (b"[DONE]", b""):
                    strict_loads(line[5:].strip(), f"SSE event of {self.url}")

    def end(self) -> None:
        if not self.sse and self.buf.strip():
            strict_loads(self.buf, f"body of {self.url}")


def _wants_check(response: httpx.Response) -> bool | None:
    ctype = response.headers.get("content-type", "")
    if "event-stream" in ctype:
        return True
    if "json" in ctype:
        return False
    return None


class _SyncStrict(httpx.SyncByteStream):
    def __init__(self, inner, checker: _Checker) -> None:
        self.inner, self.checker = inner, checker

    def __iter__(self):
        for chunk in self.inner:
            self.checker.feed(chunk)
            yield chunk
        self.checker.end()

    def close(self) -> None:
        self.inner.close()


class _AsyncStrict(httpx.AsyncByteStream):
    def __init__(self, inner, checker: _Checker) -> None:
        self.inner, self.checker = inner, checker

    async def __aiter__(self):
        async for chunk in self.inner:
            self.checker.feed(chunk)
            yield chunk
        self.checker.end()

    async def aclose(self) -> None:
        await self.inner.aclose()


_sync_handle = httpx.HTTPTransport.handle_request
_async_handle = httpx.AsyncHTTPTransport.handle_async_request


def _strict_sync(self, request):
    response = _sync_handle(self, request)
    sse = _wants_check(response)
    if sse is not None:
        response.stream = _SyncStrict(response.stream, _Checker(str(request.url), sse))
    return response


async def _strict_async(self, request):
    response = await _async_handle(self, request)
    sse = _wants_check(response)
    if sse is not None:
        response.stream = _AsyncStrict(response.stream, _Checker(str(request.url), sse))
    return response


httpx.HTTPTransport.handle_request = _strict_sync  # type: ignore[method-assign]
httpx.AsyncHTTPTransport.handle_async_request = _strict_async  # type: ignore[method-assign]

_parse_ws_event = ResponsesConnection.parse_event


def _strict_ws_event(self, data):
    strict_loads(data, "WebSocket message")
    return _parse_ws_event(self, data)


ResponsesConnection.parse_event = _strict_ws_event  # type: ignore[method-assign]


def check(cond: bool, what: str, seen: object = None) -> None:
    """Fails the script (exit 1 via `main`) unless `cond`."""
    if not cond:
        raise Mismatch(f"{what}" + ("" if seen is None else f"\n  seen: {seen!r}"))


def check_eq(seen: object, expected: object, what: str) -> None:
    if seen != expected:
        raise Mismatch(f"{what}\n  expected: {expected!r}\n  seen:     {seen!r}")


def check_sealed(blob: object, texts: list[str], what: str) -> None:
    """An `encrypted_content` blob is sealed: URL-safe base64 (no padding) of a version byte, a
    key id, a nonce and ciphertext (core/src/translate/seal.rs), none of whose bytes hold any
    of `texts`. The decoded bytes are searched, not the base64: random base64 text holds any
    two-character string often enough to fail by chance."""
    check(isinstance(blob, str) and len(blob) > 40, what + ": a blob", blob)
    raw = base64.urlsafe_b64decode(blob + "=" * (-len(blob) % 4))
    check(raw[0] in (1, 2), what + ": a sealed blob's version", raw[:1])
    for text in texts:
        check(text.encode() not in raw, what + ": opaque to " + repr(text), blob)


def words(text: str) -> int:
    return len(text.split())


# ---- the typed models of the SDK ----

# Fields the SDK's models require that the OpenResponses schema does not define (OpenAI-only
# extensions). Their absence is reported on stdout as a NOTE, not a failure: the SDK builds
# models without validation and reads a missing field as None. Any other missing or mistyped
# field fails. Paths are relative to a Response object.
OPENAI_ONLY_FIELDS: set[tuple[str, ...]] = set()
_noted: set[tuple[str, ...]] = set()


def as_sent(model: object) -> object:
    """The JSON the server sent, as the SDK kept it: unset fields left out, and without the
    `parsed` / `parsed_arguments` fields the streaming helper adds to its Parsed* models."""

    def strip(v: object) -> object:
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if k not in ("parsed", "parsed_arguments")}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    return strip(model.to_dict(mode="json", warnings=False))  # type: ignore[attr-defined]


def validate(cls: type, raw: dict, what: str) -> None:
    """Validates `raw` (what the server sent, as the SDK kept it) against the SDK's model."""
    try:
        cls.model_validate(raw)
        return
    except pydantic.ValidationError as e:
        errors = e.errors()
    fatal = []
    for err in errors:
        loc = tuple(str(x) for x in err["loc"])
        rel = loc[1:] if loc[:1] == ("response",) else loc
        if err["type"] == "missing" and rel in OPENAI_ONLY_FIELDS:
            if rel not in _noted:
                _noted.add(rel)
                print(f"NOTE: {what}: OpenAI-only field {'.'.join(rel)} is missing (SDK reads None)", flush=True)
            continue
        fatal.append(f"{'.'.join(loc)}: {err['msg']} ({err['type']})")
    if fatal:
        raise Mismatch(f"{what}: does not validate as {cls.__name__}:\n  " + "\n  ".join(fatal) + f"\n  data: {raw}")


def _event_classes() -> dict[str, type]:
    """`type` value -> the SDK's model class, from the ResponseStreamEvent union."""
    union = typing.get_args(ResponseStreamEvent)[0]
    out: dict[str, type] = {}
    for cls in typing.get_args(union):
        for literal in typing.get_args(cls.model_fields["type"].annotation):
            out[literal] = cls
    return out


EVENT_CLASSES = _event_classes()


def check_event(event: object, index: int) -> str:
    """Checks that `event` was parsed into the SDK's typed model for its `type` (not a
    fallback), that the data really satisfies that model (validated, not just constructed:
    the SDK builds models without validation), and that `sequence_number == index`."""
    etype = getattr(event, "type", None)
    cls = EVENT_CLASSES.get(etype)  # type: ignore[arg-type]
    check(cls is not None, f"event #{index}: type {etype!r} is not a Responses event type the SDK knows", event)
    check(
        isinstance(event, cls),
        f"event #{index} ({etype}): parsed as {type(event).__name__}, not {cls.__name__}",
    )
    validate(cls, as_sent(event), f"event #{index} ({etype})")
    check_eq(getattr(event, "sequence_number", None), index, f"event #{index} ({etype}): sequence_number")
    return etype  # type: ignore[return-value]


def check_response(resp: object, what: str) -> None:
    """`resp` is a typed Response whose data validates against the SDK's model."""
    check(isinstance(resp, Response), f"{what}: not a Response but {type(resp).__name__}")
    validate(Response, as_sent(resp), what)
    check_eq(resp.object, "response", f"{what}: object")  # type: ignore[attr-defined]
    check(resp.id.startswith("resp_"), f"{what}: id", resp.id)  # type: ignore[attr-defined]


def text_events(n_words: int) -> list[str]:
    """The event types of a streamed one-message text answer of `n_words` words."""
    return (
        ["response.created", "response.in_progress", "response.output_item.added", "response.content_part.added"]
        + ["response.output_text.delta"] * n_words
        + [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    )


def call_events(n_deltas: int) -> list[str]:
    """The event types of a streamed answer made of one function call."""
    return (
        ["response.created", "response.in_progress", "response.output_item.added"]
        + ["response.function_call_arguments.delta"] * n_deltas
        + ["response.function_call_arguments.done", "response.output_item.done", "response.completed"]
    )


def check_weather_call(item: object, what: str) -> None:
    """`item` is the demo's call of get_weather."""
    check_eq(getattr(item, "type", None), "function_call", f"{what}: item type")
    check_eq(item.name, "get_weather", f"{what}: name")  # type: ignore[attr-defined]
    check_eq(item.call_id, TOOL_CALL_ID, f"{what}: call_id")  # type: ignore[attr-defined]
    check_eq(item.arguments, '{"location":"' + FIXED_STRING_ARG + '"}', f"{what}: arguments")  # type: ignore[attr-defined]
    check_eq(item.status, "completed", f"{what}: status")  # type: ignore[attr-defined]
    check(item.id.startswith("fc_"), f"{what}: id", item.id)  # type: ignore[attr-defined]


def main(run: typing.Callable[[], None]) -> None:
    """Runs `run`, prints PASS/FAIL lines, exits 0 only if every check held."""
    try:
        check(BASE_URL.startswith("http://"), "OPENAI_BASE_URL must be set (http://127.0.0.1:<port>/v1)", BASE_URL)
        run()
    except Mismatch as e:
        print(f"FAIL: {e}", flush=True)
        sys.exit(1)
    finally:
        if DUPLICATE_KEYS:
            print(f"FAIL: {len(DUPLICATE_KEYS)} bodies or events with a duplicate key, e.g. {DUPLICATE_KEYS[0]}", flush=True)
    if DUPLICATE_KEYS:
        sys.exit(1)
    print("ok", flush=True)
