//! The clients table of `docs/clients.md` is checked here, so it cannot drift: each version
//! is the one pinned for the tests (Python requirements, the Node package.json, the Codex
//! script), and every test it names exists in tests/e2e/clients.rs.

use std::path::Path;

fn read(path: &str) -> String {
    let full = Path::new(env!("CARGO_MANIFEST_DIR")).join(path);
    std::fs::read_to_string(&full).unwrap_or_else(|e| panic!("{}: {e}", full.display()))
}

/// The page and the section that hold the table.
const PAGE: &str = "docs/clients.md";
const SECTION: &str = "\n## Clients verified\n";

struct Row {
    client: String,
    version: String,
    tests: Vec<String>,
}

fn rows() -> Vec<Row> {
    let page = read(PAGE);
    let section = page
        .split(SECTION)
        .nth(1)
        .expect("a '## Clients verified' section in docs/clients.md");
    section
        .lines()
        .skip_while(|l| !l.starts_with("| client |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|line| {
            let cells: Vec<&str> = line.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 5, "a row of 5 cells: {line}");
            Row {
                client: cells[0].to_owned(),
                version: cells[1].to_owned(),
                tests: cells[3]
                    .split(',')
                    .map(|t| t.trim().trim_matches('`').to_owned())
                    .filter(|t| !t.is_empty())
                    .collect(),
            }
        })
        .collect()
}

/// The version pinned for `client`, from the file that pins it.
fn pinned(client: &str) -> Option<String> {
    let python = read("tests/clients/python/requirements.txt");
    let node: serde_json::Value =
        serde_json::from_str(&read("tests/clients/node/package.json")).unwrap();
    let pip = |name: &str| {
        python
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}==")))
            .map(str::to_owned)
    };
    let npm = |name: &str| node["dependencies"][name].as_str().map(str::to_owned);
    match client {
        "openai (PyPI)" => pip("openai"),
        "openai-agents (PyPI)" => pip("openai-agents"),
        "openai (npm)" => npm("openai"),
        "ai (npm)" => npm("ai"),
        "@ai-sdk/open-responses (npm)" => npm("@ai-sdk/open-responses"),
        "Codex CLI (@openai/codex, npm)" => read("tests/clients/codex/run.sh")
            .lines()
            .find_map(|l| l.strip_prefix("CODEX_VERSION=\"${CODEX_VERSION:-"))
            .map(|v| v.trim_end_matches("}\"").to_owned()),
        _ => None,
    }
}

#[test]
fn the_clients_table_matches_the_pins_and_the_tests() {
    let rows = rows();
    assert!(rows.len() >= 6, "{} rows", rows.len());
    let tests = read("tests/e2e/clients.rs");
    for row in &rows {
        if let Some(pin) = pinned(&row.client) {
            assert_eq!(row.version, pin, "documented version of {}", row.client);
        } else {
            assert!(
                row.version.is_empty(),
                "{}: a version without a pin",
                row.client
            );
        }
        assert!(!row.tests.is_empty(), "{}: no tests named", row.client);
        for name in &row.tests {
            assert!(
                tests.contains(&format!("fn {name}(")),
                "{}: test {name} is not in tests/e2e/clients.rs",
                row.client
            );
        }
    }
    // Helpers pinned beside the Node SDK and named in the table: the pinned version.
    let section = read(PAGE);
    let section = section.split(SECTION).nth(1).unwrap_or_default();
    let node: serde_json::Value =
        serde_json::from_str(&read("tests/clients/node/package.json")).unwrap();
    for helper in ["ws", "typescript"] {
        let pin = node["dependencies"][helper].as_str().unwrap_or_default();
        assert!(
            section.contains(&format!("`{helper}` {pin}")),
            "the clients section names `{helper}` {pin} (tests/clients/node/package.json)"
        );
    }
    // Every pinned client has its row.
    for client in [
        "openai (PyPI)",
        "openai-agents (PyPI)",
        "openai (npm)",
        "ai (npm)",
        "@ai-sdk/open-responses (npm)",
    ] {
        assert!(
            rows.iter().any(|r| r.client == client),
            "no row for {client}"
        );
    }
}
