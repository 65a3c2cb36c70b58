//! Numbers and names the docs state that the code defines: the headers Envoy forwards to the
//! processor, the metric labels' bounds, the status of a failed folded stream, the time the
//! processor asks Envoy for during a compaction. Each is read from the page and compared with
//! the constant it states, so a change to either side fails here.

use responses_core::driver::CALL_GRACE;
use responses_core::metrics::{DEFAULT_MAX_MODELS, MAX_UPSTREAM_CODES};
use responses_core::openresponses::{Code, ErrorCode};
use responses_core::settings::ExchangeConfig;
use responses_core::upstream_failure::{folded_status, MAX_WORD};
use responses_extproc::extproc::session::{HEADERS_READ, HEADER_PREFIXES_READ};

use crate::common::repo_root;

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The table row of `page` whose first cell starts with `first_cell`.
fn row(page: &str, first_cell: &str) -> String {
    let text = read(page);
    let start = format!("| {first_cell}");
    let rows: Vec<&str> = text.lines().filter(|l| l.starts_with(&start)).collect();
    assert_eq!(rows.len(), 1, "{page}: one row `{start}`");
    rows[0].to_owned()
}

/// The text of each `` `code` `` span of `text`.
fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// The number written right after each occurrence of `phrase` in `page` (at least one).
fn numbers_after(page: &str, phrase: &str) -> Vec<u64> {
    let text = read(page).replace('\n', " ");
    let numbers: Vec<u64> = text
        .split(phrase)
        .skip(1)
        .map(|rest| {
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits
                .parse()
                .unwrap_or_else(|_| panic!("{page}: no number after `{phrase}`"))
        })
        .collect();
    assert!(!numbers.is_empty(), "{page}: `{phrase}` not found");
    numbers
}

/// docs/deploying.md's `forward_rules` row counts and names exactly the headers the processor
/// reads (`HEADERS_READ`, `HEADER_PREFIXES_READ`), and every page that counts them says the
/// same.
#[test]
fn the_forwarded_headers_are_the_ones_read() {
    let row = row("docs/deploying.md", "`forward_rules.allowed_headers` |");
    let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
    let stated = format!(
        "the {} headers and {} prefix the processor reads",
        HEADERS_READ.len(),
        HEADER_PREFIXES_READ.len()
    );
    assert_eq!(cells[1], stated, "docs/deploying.md: {row}");
    // The names, up to where the cell says why.
    let (names, _) = cells[2]
        .split_once(": nothing else is encoded")
        .expect("the row says nothing else is encoded");
    let mut documented: Vec<&str> = code_spans(names);
    documented.sort_unstable();
    let mut expected: Vec<&str> = HEADERS_READ
        .iter()
        .chain(HEADER_PREFIXES_READ.iter())
        .copied()
        .collect();
    expected.sort_unstable();
    assert_eq!(
        documented, expected,
        "docs/deploying.md's forward_rules row"
    );

    // Every count of them: "the 18 headers and 1 prefix", "the same 18 headers and 1 prefix".
    for page in [
        "docs/deploying.md",
        "docs/performance.md",
        "docs/compaction.md",
    ] {
        let text = read(page);
        let words: Vec<&str> = text.split_whitespace().collect();
        for w in words.windows(4) {
            if let (Ok(n), ["headers", "and", "1"]) = (w[0].parse::<usize>(), &w[1..]) {
                assert_eq!(n, HEADERS_READ.len(), "{page}: {}", w.join(" "));
            }
        }
    }
}

/// The label bounds of docs/operations.md and docs/limits-and-failures.md are the metrics'.
#[test]
fn the_label_bounds_are_the_codes() {
    for n in numbers_after("docs/operations.md", "kept for the first ")
        .into_iter()
        .chain(numbers_after(
            "docs/limits-and-failures.md",
            "`error_code` keeps the first ",
        ))
    {
        assert_eq!(n, MAX_UPSTREAM_CODES as u64, "the error_code label's bound");
    }
    for n in numbers_after("docs/operations.md", "(`--metrics-max-models`, ") {
        assert_eq!(n, DEFAULT_MAX_MODELS as u64, "metrics_max_models' default");
    }
    for (page, phrase) in [
        ("docs/operations.md", "words of at most "),
        ("docs/limits-and-failures.md", "identifier of at most "),
    ] {
        for n in numbers_after(page, phrase) {
            assert_eq!(
                n, MAX_WORD as u64,
                "{page}: an upstream's code kept as a word"
            );
        }
    }
}

/// docs/responses-and-streaming.md: a stream folded into one JSON answer that fails is a 502
/// envelope, and one that reports a context overflow a 400, as `folded_status` decides.
#[test]
fn a_failed_folded_stream_has_the_documented_status() {
    let row = row(
        "docs/responses-and-streaming.md",
        "an SSE answer although JSON was asked for",
    );
    let failed = folded_status(&Code::from(ErrorCode::UpstreamStreamTruncated));
    let overflow = folded_status(&Code::from(ErrorCode::ContextLengthExceeded));
    assert!(row.contains(&format!("→ {failed} envelope")), "{row}");
    assert!(
        row.contains(&format!("→ {overflow} `context_length_exceeded`")),
        "{row}"
    );
    assert_eq!((failed, overflow), (502, 400));
}

/// The processor asks Envoy for `--compaction-timeout` + [`CALL_GRACE`] during a compaction:
/// every shipped ext_proc bootstrap's `max_message_timeout` grants the default, its comment
/// says so, and so do the docs' rows.
#[test]
fn max_message_timeout_grants_the_compactions_time() {
    let margin = CALL_GRACE.as_secs();
    let asked = ExchangeConfig::default().compaction_timeout + margin;
    let said = format!("--compaction-timeout + {margin} s");
    for file in [
        "envoy/envoy.yaml",
        "envoy/examples/extproc-tls.yaml",
        "envoy/examples/extproc-mtls.yaml",
        "envoy/examples/extproc-uds.yaml",
    ] {
        let text = read(file);
        let lines: Vec<&str> = text.lines().collect();
        let at = lines
            .iter()
            .position(|l| l.trim_start().starts_with("max_message_timeout:"))
            .unwrap_or_else(|| panic!("{file}: no max_message_timeout"));
        let value: u64 = lines[at]
            .trim()
            .trim_start_matches("max_message_timeout:")
            .trim()
            .trim_end_matches('s')
            .parse()
            .expect("seconds");
        assert!(value >= asked, "{file}: {value} s < {asked} s");
        let comment: String = lines[..at]
            .iter()
            .rev()
            .take_while(|l| l.trim_start().starts_with('#'))
            .map(|l| l.trim_start().trim_start_matches('#').trim())
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(comment.contains(&said), "{file}: {comment}");
    }
    let row = row("docs/limits-and-failures.md", "`max_message_timeout` |");
    assert!(
        row.contains(&format!(
            "`--compaction-timeout` + {margin} s ({asked} s by default)"
        )),
        "{row}"
    );
}

/// The manifests' gRPC probes name no service, so they ask for the overall status, which the
/// processor turns NOT_SERVING when it drains (`tests/e2e/drain.rs`, docs/operations.md).
#[test]
fn the_grpc_probes_ask_for_the_overall_status() {
    let mut probes = 0;
    for file in [
        "deploy/kubernetes/sidecar.yaml",
        "deploy/kubernetes/service.yaml",
    ] {
        for line in read(file)
            .lines()
            .filter(|l| l.trim_start().starts_with("grpc: {"))
        {
            assert_eq!(line.trim(), "grpc: {port: 50051}", "{file}");
            probes += 1;
        }
    }
    assert_eq!(probes, 4, "readiness and liveness in both manifests");
}

/// A size as the docs write it: `16 MiB`, `1 KiB`, `4096`, `8,192`.
fn size(text: &str) -> u64 {
    let text = text.replace(',', "");
    let (n, unit) = text.split_once(' ').unwrap_or((&text, ""));
    let n: u64 = n.parse().unwrap_or_else(|_| panic!("a size: {text}"));
    match unit.split_whitespace().next().unwrap_or("") {
        "MiB" => n << 20,
        "KiB" => n << 10,
        _ => n,
    }
}

/// docs/limits-and-failures.md's table of limits: each default is the code's (the settings'
/// defaults, the fixed caps, the derived gRPC limit, the shipped circuit breakers).
#[test]
fn the_limits_table_states_the_codes_defaults() {
    use responses_core::translate::request::MAX_MODEL_BYTES;
    use responses_core::translate::stream::CALL_SLOT_BYTES;
    let d = ExchangeConfig::default();
    let page = "docs/limits-and-failures.md";
    let default = |first: &str| -> u64 {
        let row = row(page, first);
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        size(cells[2])
    };
    for (first, value) in [
        ("request body |", d.max_request_bytes),
        ("one content part", d.max_part_bytes),
        ("input items |", d.max_input_items),
        ("an answer read whole", d.max_body_bytes),
        ("one upstream SSE event", d.max_sse_frame_bytes),
        ("a stream's text, arguments", d.max_output_bytes),
    ] {
        assert_eq!(default(first), value as u64, "{page}: {first}");
    }
    let model = row(page, "`model` |");
    assert!(
        model.contains(&format!("{} KiB is far above", MAX_MODEL_BYTES >> 10)),
        "{model}"
    );
    let output = row(page, "a stream's text, arguments");
    assert!(
        output.contains(&format!(
            "counts {CALL_SLOT_BYTES} bytes beside its name, id and arguments: {} empty calls",
            format_thousands((d.max_output_bytes / CALL_SLOT_BYTES) as u64)
        )),
        "{output}"
    );
    let grpc = row(page, "one ext_proc message from Envoy");
    let limit = (d.max_request_bytes.max(d.max_body_bytes) * 2 + (1 << 20)) >> 20;
    assert!(grpc.contains(&format!("({limit} MiB)")), "{grpc}");
    // The shipped circuit breakers, every threshold of every cluster.
    let breakers = default("concurrent exchanges");
    let envoy = read("envoy/envoy.yaml");
    let thresholds: Vec<u64> = envoy
        .lines()
        .filter_map(|l| {
            let l = l.trim();
            [
                "max_connections: ",
                "max_pending_requests: ",
                "max_requests: ",
            ]
            .iter()
            .find_map(|k| l.strip_prefix(k))
        })
        .map(|v| v.parse().expect("a number"))
        .collect();
    // extproc, responses_ws, responses_records (the records' answer), upstream.
    assert_eq!(thresholds.len(), 12, "four clusters, three thresholds each");
    assert!(thresholds.iter().all(|t| *t == breakers), "{thresholds:?}");
}

/// 65536 → "65,536".
fn format_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    out
}
