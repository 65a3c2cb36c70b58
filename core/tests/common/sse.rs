//! A small, strict-enough Server-Sent Events parser for test bodies.

use serde_json::Value;

/// One SSE event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SseEvent {
    /// The `event:` field, if any.
    pub event: Option<String>,
    /// The `data:` lines joined with `\n`.
    pub data: String,
    /// How many `data:` lines the event had.
    pub data_lines: usize,
}

/// Parses an SSE body (LF or CRLF line endings) into events. Comment lines (`:`) and fields
/// other than `event`/`data` are ignored; events without data are dropped, as a browser would.
pub fn parse_sse(body: &str) -> Vec<SseEvent> {
    let mut events = Vec::new();
    let mut event: Option<String> = None;
    let mut data: Vec<&str> = Vec::new();
    for line in body.split('\n') {
        let line = line.strip_suffix('\r').unwrap_or(line);
        if line.is_empty() {
            if !data.is_empty() {
                events.push(SseEvent {
                    event: event.take(),
                    data: data.join("\n"),
                    data_lines: data.len(),
                });
            }
            event = None;
            data.clear();
            continue;
        }
        if line.starts_with(':') {
            continue;
        }
        let (field, value) = line.split_once(':').unwrap_or((line, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        match field {
            "event" => event = Some(value.to_string()),
            "data" => data.push(value),
            _ => {}
        }
    }
    // An unterminated last event is not dispatched (per the SSE spec).
    events
}

/// The JSON events of an SSE body as `(event name, data)`; the name is the `event:` field, or
/// the data's `type` when there is none. `[DONE]` is skipped. Panics on non-JSON data and on
/// a key given twice in one object.
pub fn parse_sse_json(body: &str) -> Vec<(String, Value)> {
    parse_sse(body)
        .into_iter()
        .filter(|e| e.data != "[DONE]")
        .map(|e| {
            let value: Value = super::json::parse_strict(&e.data)
                .unwrap_or_else(|err| panic!("SSE data is not strict JSON ({err}): {}", e.data));
            let name = e
                .event
                .unwrap_or_else(|| value["type"].as_str().unwrap_or_default().to_string());
            (name, value)
        })
        .collect()
}
