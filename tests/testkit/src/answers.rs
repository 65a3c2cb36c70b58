//! The fail-closed rule for what a client may see once a request is ours: an OpenResponses
//! error envelope, a translated JSON answer, or translated events (whole events, JSON data,
//! ending in `[DONE]` when the stream is complete). Never the upstream's own bytes.

/// An answer the client may see: an envelope, a translated JSON response or compaction, or
/// translated SSE events (whole events, JSON data; ending in `[DONE]` when `complete`).
pub fn check_answer(status: u16, content_type: &str, body: &[u8], complete: bool) {
    if content_type == "text/event-stream" {
        assert_eq!(status, 200);
        let text = std::str::from_utf8(body).expect("UTF-8 events");
        if complete || !text.is_empty() {
            assert!(text.starts_with("event: "), "{text}");
        }
        if complete {
            assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        }
        let whole = match text.rfind("\n\n") {
            Some(i) => &text[..i + 2],
            None => "",
        };
        for event in whole.split_terminator("\n\n") {
            let data = event
                .strip_prefix("event: ")
                .and_then(|e| e.split_once("\ndata: "))
                .map(|(_, d)| d)
                .unwrap_or_else(|| event.strip_prefix("data: ").expect("an SSE event"));
            assert!(
                data == "[DONE]" || serde_json::from_str::<serde_json::Value>(data).is_ok(),
                "event data is JSON: {data}"
            );
        }
        return;
    }
    assert_eq!(content_type, "application/json", "status {status}");
    if !complete {
        return;
    }
    let v: serde_json::Value = serde_json::from_slice(body).expect("a JSON answer");
    if (200..300).contains(&status) {
        assert!(
            v["object"] == "response" || v["object"] == "response.compaction",
            "{v}"
        );
    } else {
        assert!((400..600).contains(&status), "{status}");
        assert!(
            v["error"]["message"].is_string() && v["error"]["type"].is_string(),
            "{v}"
        );
    }
}
