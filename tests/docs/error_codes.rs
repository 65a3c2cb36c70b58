//! The docs' table of error codes (a table under `docs/` whose header starts `| code |`) lists
//! exactly the codes of `ErrorCode`: a code added to the enum without a row, or a row for a
//! code the gateway no longer emits, fails here.

use std::collections::BTreeSet;
use std::path::Path;

use responses_core::openresponses::ErrorCode;

fn markdown_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("docs/ is readable") {
        let path = entry.expect("a docs/ entry").path();
        if path.is_dir() {
            markdown_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "md") {
            out.push(path);
        }
    }
}

/// The first cell of each row of every `| code | ...` table in `text`.
fn documented_codes(text: &str) -> Vec<String> {
    let mut codes = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if !line.starts_with("| code |") {
            continue;
        }
        lines.next(); // the |---| line
        for row in lines.by_ref().take_while(|l| l.starts_with('|')) {
            let cell = row.trim_start_matches('|').split('|').next().unwrap_or("");
            codes.push(cell.trim().trim_matches('`').to_owned());
        }
    }
    codes
}

#[test]
fn the_docs_list_every_error_code_once() {
    let mut files = Vec::new();
    markdown_files(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("docs"),
        &mut files,
    );
    let mut listed = Vec::new();
    for file in &files {
        listed.extend(documented_codes(
            &std::fs::read_to_string(file).expect("a readable doc"),
        ));
    }
    let unique: BTreeSet<&str> = listed.iter().map(String::as_str).collect();
    assert_eq!(
        unique.len(),
        listed.len(),
        "a code listed twice: {listed:?}"
    );
    let emitted: BTreeSet<&str> = ErrorCode::all().iter().map(|c| c.as_str()).collect();
    assert_eq!(
        unique, emitted,
        "the docs' `| code |` table and ErrorCode differ"
    );
}
