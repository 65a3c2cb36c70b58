//! What the snapshot suites share (`core/tests/snapshots.rs`, `core/tests/answer_snapshots.rs`,
//! `core/tests/request_pins.rs`): one switch to rewrite every expected file, `UPDATE_SNAPSHOTS=1`,
//! and a text pinned byte for byte in a file.

/// Whether this run writes what the code gives instead of comparing (`UPDATE_SNAPSHOTS=1`).
pub fn updating() -> bool {
    std::env::var_os("UPDATE_SNAPSHOTS").is_some_and(|v| v != "0" && !v.is_empty())
}

/// Compares `text` with the file at `path` (from the repository root), byte for byte, or
/// writes it there when [`updating`]. A missing file is a failure, so a new case is written
/// on purpose.
pub fn pinned_text(path: &str, text: &str) {
    let file = super::repo_root().join(path);
    if updating() {
        if std::fs::read_to_string(&file).ok().as_deref() != Some(text) {
            std::fs::write(&file, text).unwrap_or_else(|e| panic!("write {path}: {e}"));
            eprintln!("updated {path}");
        }
        return;
    }
    let pinned = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("{path}: {e} (UPDATE_SNAPSHOTS=1 writes what the code gives)"));
    if pinned == text {
        return;
    }
    panic!(
        "{path} differs from what the code gives ({}; UPDATE_SNAPSHOTS=1 writes the code's, \
         review it with git diff)",
        first_difference(&pinned, text)
    );
}

/// Where two texts part: the line number and both lines, cut short.
fn first_difference(pinned: &str, got: &str) -> String {
    let cut = |line: Option<&str>| match line {
        None => "(no line)".to_string(),
        Some(l) if l.chars().count() > 300 => {
            format!("{}...", l.chars().take(300).collect::<String>())
        }
        Some(l) => l.to_string(),
    };
    let (mut a, mut b) = (pinned.lines(), got.lines());
    for n in 1.. {
        let (x, y) = (a.next(), b.next());
        if x != y {
            return format!("line {n}:\n  pinned: {}\n  now:    {}", cut(x), cut(y));
        }
        if x.is_none() {
            break;
        }
    }
    "the same lines, different line endings".to_string()
}
