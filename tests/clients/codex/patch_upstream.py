"""A scripted Chat Completions upstream for the Codex apply_patch profile (run.sh apply_patch).

    python3 patch_upstream.py PORT RECORD_FILE

Answers POST /v1/chat/completions (streamed or not):
* the request carries a `tool` message (the patch was applied) -> the text "Created hello.txt.";
* else, when a function named `apply_patch` with a string parameter `input` is offered (the
  processor's form of Codex's `custom` apply_patch tool) -> one call of it whose input adds
  hello.txt;
* else (deploy/demo.sh's own two requests) -> the text "hi".
Every request body is appended to RECORD_FILE (one JSON per line) for run.sh to check.
Standard library only.
"""

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATCH = "*** Begin Patch\n*** Add File: hello.txt\n+Hello from the apply_patch profile.\n*** End Patch\n"
MODEL = "patch-upstream"


def chunk(delta, finish=None):
    return {
        "id": "chatcmpl-patch",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": MODEL,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("content-length", "0"))) or b"{}")
        with open(sys.argv[2], "a") as f:
            f.write(json.dumps(body) + "\n")
        messages = body.get("messages", [])
        tools = {t["function"]["name"]: t["function"] for t in body.get("tools", []) if t.get("type") == "function"}
        if any(m.get("role") == "tool" for m in messages):
            message = {"role": "assistant", "content": "Created hello.txt."}
            finish = "stop"
        elif "input" in tools.get("apply_patch", {}).get("parameters", {}).get("properties", {}):
            call = {"id": "call_patch_1", "type": "function",
                    "function": {"name": "apply_patch", "arguments": json.dumps({"input": PATCH})}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        else:
            message = {"role": "assistant", "content": "hi"}
            finish = "stop"
        usage = {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
        if not body.get("stream"):
            return self.reply(200, "application/json", json.dumps({
                "id": "chatcmpl-patch", "object": "chat.completion", "created": 1700000000, "model": MODEL,
                "choices": [{"index": 0, "message": message, "finish_reason": finish}], "usage": usage}))
        frames = [chunk({"role": "assistant", "content": message.get("content")})]
        for i, call in enumerate(message.get("tool_calls", [])):
            args = call["function"]["arguments"]
            frames.append(chunk({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                                 "function": {"name": call["function"]["name"], "arguments": args[:20]}}]}))
            frames.append(chunk({"tool_calls": [{"index": i, "function": {"arguments": args[20:]}}]}))
        frames.append(chunk({}, finish))
        frames.append({**chunk({}), "choices": [], "usage": usage})
        out = "".join(f"data: {json.dumps(f)}\n\n" for f in frames) + "data: [DONE]\n\n"
        self.reply(200, "text/event-stream", out)

    def reply(self, status, content_type, text):
        data = text.encode()
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


if __name__ == "__main__":
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
