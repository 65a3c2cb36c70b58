//! Replays the committed fuzz corpus through the fuzz targets' checks: the fuzzers' findings
//! stay fixed, and every `cargo test` smoke-runs the targets without the fuzzing toolchain.

#[path = "../fuzz/checks.rs"]
mod checks;

use std::path::PathBuf;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("corpus entry").path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).expect("corpus file");
            (p, bytes)
        })
        .collect()
}

#[test]
fn request_corpus_holds() {
    let files = corpus("request");
    assert!(!files.is_empty());
    for (path, data) in files {
        let outcome = std::panic::catch_unwind(|| checks::request(&data));
        assert!(outcome.is_ok(), "{}", path.display());
    }
}

#[test]
fn stream_corpus_holds_under_several_splits() {
    let files = corpus("stream");
    assert!(!files.is_empty());
    for (path, body) in files {
        // The raw corpus entries are libFuzzer's `Arbitrary` encoding for the stream target,
        // except the seed captures; either way they are bytes a stream may contain.
        for cuts in [
            vec![],
            vec![1, 2, 3],
            vec![body.len() / 2],
            (0..body.len()).step_by(7).collect(),
        ] {
            for small in [false, true] {
                let outcome = std::panic::catch_unwind(|| checks::stream(&body, &cuts, small));
                assert!(
                    outcome.is_ok(),
                    "{} cuts={cuts:?} small={small}",
                    path.display()
                );
            }
        }
    }
}

#[test]
fn exchange_corpus_holds() {
    let files = corpus("exchange");
    assert!(!files.is_empty());
    for (path, data) in files {
        let outcome = std::panic::catch_unwind(|| checks::exchange(&data));
        assert!(outcome.is_ok(), "{}", path.display());
    }
}

#[test]
fn module_corpus_holds() {
    let files = corpus("module");
    assert!(!files.is_empty());
    for (path, data) in files {
        let outcome = std::panic::catch_unwind(|| checks::module(&data));
        assert!(outcome.is_ok(), "{}", path.display());
    }
}

#[test]
fn websocket_frames_corpus_holds() {
    let files = corpus("websocket_frames");
    assert!(!files.is_empty());
    for (path, data) in files {
        let outcome = std::panic::catch_unwind(|| checks::websocket_frames(&data));
        assert!(outcome.is_ok(), "{}", path.display());
    }
}

#[test]
fn connection_corpus_holds() {
    let files = corpus("connection");
    assert!(!files.is_empty());
    for (path, data) in files {
        let outcome = std::panic::catch_unwind(|| checks::connection(&data));
        assert!(outcome.is_ok(), "{}", path.display());
    }
}
