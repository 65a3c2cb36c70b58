//! The pieces of an `envoy/examples/*.yaml` file (`key: |` blocks) spliced into a bootstrap.

/// The block scalar `key: |` of the example file, dedented, then indented by `indent`.
pub fn piece(example: &str, key: &str, indent: usize) -> String {
    let mut lines = example
        .lines()
        .skip_while(|l| *l != format!("{key}: |"))
        .skip(1)
        .take_while(|l| l.starts_with("  ") || l.is_empty());
    let pad = " ".repeat(indent);
    let mut out = String::new();
    for line in lines.by_ref() {
        if !line.is_empty() {
            out.push_str(&pad);
            out.push_str(&line[2..]);
        }
        out.push('\n');
    }
    assert!(!out.trim().is_empty(), "no `{key}: |` block in the example");
    out
}

/// `config` with `piece` put before (or after) `anchor`, which must occur exactly once.
pub fn splice(config: String, anchor: &str, piece: &str, before: bool) -> String {
    assert_eq!(config.matches(anchor).count(), 1, "anchor `{anchor}`");
    splice_first(config, anchor, piece, before)
}

/// [`splice`] at `anchor`'s first occurrence: the client's listener, which comes first in
/// both shipped configs (module mode's internal listener, which only Envoy reaches, has the
/// same filter chain lines after it).
pub fn splice_first(config: String, anchor: &str, piece: &str, before: bool) -> String {
    assert!(config.contains(anchor), "anchor `{anchor}`");
    let replacement = if before {
        format!("{piece}{anchor}")
    } else {
        format!("{anchor}{piece}")
    };
    config.replacen(anchor, &replacement, 1)
}

/// `config` with `piece` put after the first line that starts with `line`: the client's
/// listener's `          http_filters:` (module mode: `http_filters: &filters`, the chain its
/// internal listener shares), which comes first in both shipped configs.
pub fn after_first_line(config: String, line: &str, piece: &str) -> String {
    let at = config
        .find(line)
        .unwrap_or_else(|| panic!("no line starting with {line:?}"));
    let end = at + config[at..].find('\n').expect("a line end") + 1;
    format!("{}{piece}{}", &config[..end], &config[end..])
}
