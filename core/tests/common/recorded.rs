//! The recorded upstream failures of `tests/fixtures/upstream_errors/` (one server's answer
//! each: status, headers, body, the source it was taken from, and what the client must get).
//! The end-to-end harness adds a scripted reply that answers with one (`tests/common/recorded.rs`).

use serde_json::Value;

/// One recorded upstream failure.
pub struct Fixture {
    pub name: String,
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: String,
    /// What the client gets: `status`, `type`, `code`, `param`, `message`, the `headers`
    /// kept; for an error inside a stream (`stream: true`), the `code` and `message` of its
    /// `response.failed`.
    pub expect: Value,
}

impl Fixture {
    /// An error object inside a Chat stream (after a 200), rather than an error answer.
    pub fn is_stream(&self) -> bool {
        self.expect["stream"] == true
    }

    /// The `content-type` of the answer (JSON unless the fixture says otherwise).
    pub fn content_type(&self) -> String {
        self.headers
            .iter()
            .find(|(n, _)| n == "content-type")
            .map_or("application/json", |(_, v)| v.as_str())
            .to_owned()
    }
}

/// Every fixture, by name.
pub fn fixtures() -> Vec<Fixture> {
    let dir = super::repo_root().join("tests/fixtures/upstream_errors");
    let mut out: Vec<Fixture> = std::fs::read_dir(&dir)
        .expect("read the fixtures directory")
        .map(|e| e.expect("a directory entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("read a fixture");
            let v: Value = serde_json::from_str(&text).expect("a fixture is JSON");
            for key in ["server", "shape", "source"] {
                assert!(
                    v[key].as_str().is_some_and(|s| !s.is_empty()),
                    "{}: no {key}",
                    path.display()
                );
            }
            Fixture {
                name: path.file_stem().unwrap().to_string_lossy().into_owned(),
                status: v["status"].as_u64().expect("a status") as u16,
                headers: v["headers"]
                    .as_object()
                    .expect("headers")
                    .iter()
                    .map(|(k, v)| (k.clone(), v.as_str().expect("a header value").to_owned()))
                    .collect(),
                body: v["body"].as_str().expect("a body").to_owned(),
                expect: v["expect"].clone(),
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}
