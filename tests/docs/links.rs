//! The documentation holds together: every relative link and `#anchor` in `README.md`, the
//! pages of `docs/` and the folders' READMEs resolves (anchors by GitHub's heading slugs),
//! every page is linked from the README's map, the README stays short, and each page opens
//! with its title and a summary of at most two lines.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The folders' READMEs, beside the top one and `docs/`.
const FOLDER_READMES: [&str; 4] = [
    "envoy/README.md",
    "envoy/examples/README.md",
    "deploy/README.md",
    "fuzz/README.md",
];

/// The pages of `docs/`; `docs/_pending/` holds drafts not yet folded into them.
fn pages() -> Vec<PathBuf> {
    let mut pages: Vec<PathBuf> = std::fs::read_dir(root().join("docs"))
        .expect("docs/")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    pages.sort();
    pages
}

/// Every Markdown file the check covers.
fn documents() -> Vec<PathBuf> {
    let mut docs = vec![root().join("README.md")];
    docs.extend(FOLDER_READMES.iter().map(|p| root().join(p)));
    docs.extend(pages());
    docs
}

/// The text outside fenced code blocks, line by line (fenced lines are blank).
fn prose(text: &str) -> Vec<&str> {
    let mut fenced = false;
    text.lines()
        .map(|line| {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
                ""
            } else if fenced {
                ""
            } else {
                line
            }
        })
        .collect()
}

/// `line` without its code spans (`` `...` ``), whose brackets are not links.
fn without_code(line: &str) -> String {
    line.split('`').step_by(2).collect()
}

/// The targets of the inline links and images on `line`: `[text](target)`.
fn link_targets(line: &str) -> Vec<String> {
    let text = without_code(line);
    let mut targets = Vec::new();
    let mut rest = text.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        let end = after.find(')').unwrap_or(after.len());
        // `[text](target "title")`: the target is the first word.
        let target = after[..end].split_whitespace().next().unwrap_or_default();
        targets.push(target.trim_matches(['<', '>']).to_owned());
        rest = &after[end..];
    }
    targets
}

/// The anchor GitHub gives a heading: its text lower-cased, without punctuation (letters,
/// digits, `-`, `_` and spaces stay), spaces as `-`; a repeated slug gets `-1`, `-2`, ….
fn slug(heading: &str) -> String {
    // What renders: code spans keep their text, links their text, emphasis marks go.
    let mut text = heading.replace(['`', '*'], "");
    while let (Some(open), Some(mid)) = (text.find('['), text.find("](")) {
        let Some(close) = text[mid..].find(')') else {
            break;
        };
        if open > mid {
            break;
        }
        text = format!(
            "{}{}{}",
            &text[..open],
            &text[open + 1..mid],
            &text[mid + close + 1..]
        );
    }
    text.trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

/// The anchors of a Markdown text's headings, in GitHub's form.
fn anchors(text: &str) -> Vec<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    prose(text)
        .into_iter()
        .filter_map(|line| {
            let hashes = line.chars().take_while(|c| *c == '#').count();
            let heading = line.get(hashes..)?;
            ((1..=6).contains(&hashes) && heading.starts_with(' '))
                .then(|| heading.trim().trim_end_matches('#').trim())
        })
        .map(|heading| {
            let base = slug(heading);
            let n = seen.entry(base.clone()).or_insert(0);
            let anchor = if *n == 0 {
                base.clone()
            } else {
                format!("{base}-{n}")
            };
            *n += 1;
            anchor
        })
        .collect()
}

/// The broken links of the document `path` holding `text`, as readable lines.
fn broken_links(path: &Path, text: &str) -> Vec<String> {
    let dir = path.parent().expect("a document is in a folder");
    let mut broken = Vec::new();
    for (n, line) in prose(text).into_iter().enumerate() {
        for target in link_targets(line) {
            if target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((file, anchor)) => (file, Some(anchor)),
                None => (target.as_str(), None),
            };
            let at = format!("{}:{}: {target}", path.display(), n + 1);
            let target_text = if file.is_empty() {
                text.to_owned()
            } else {
                let file = dir.join(file);
                if !file.exists() {
                    broken.push(format!("{at}: no such file"));
                    continue;
                }
                if anchor.is_none() {
                    continue;
                }
                match std::fs::read_to_string(&file) {
                    Ok(text) => text,
                    Err(_) => {
                        broken.push(format!("{at}: an anchor into a folder"));
                        continue;
                    }
                }
            };
            let Some(anchor) = anchor else { continue };
            if !anchors(&target_text).iter().any(|a| a == anchor) {
                broken.push(format!("{at}: no heading with this anchor"));
            }
        }
    }
    broken
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let docs = documents();
    assert!(docs.len() > 10, "{} documents", docs.len());
    let broken: Vec<String> = docs
        .iter()
        .flat_map(|path| {
            let text =
                std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            broken_links(path.strip_prefix(root()).unwrap_or(path), &text)
                .into_iter()
                .map(|b| b.replace(&format!("{}/", root().display()), ""))
                .collect::<Vec<_>>()
        })
        .collect();
    assert!(
        broken.is_empty(),
        "{} broken link(s):\n{}",
        broken.len(),
        broken.join("\n")
    );
}

/// The check itself: a missing file, a missing anchor and a link into a heading's wrong slug
/// are each found; links in code are not links.
#[test]
fn broken_links_are_found() {
    let here = root().join("docs/example.md");
    let text = "# A page\n\n## The `local_reply_config`, explained\n\n\
                [ok](#the-local_reply_config-explained) [ok](configuration.md#settings)\n\
                [missing file](no-such-page.md) [missing anchor](#the-local-reply-config)\n\
                [other page's missing anchor](configuration.md#no-such-heading)\n\
                `[not a link](nowhere.md)`\n```\n[not a link](nowhere.md)\n```\n";
    let broken = broken_links(&here, text);
    assert_eq!(broken.len(), 3, "{broken:#?}");
    assert!(
        broken[0].ends_with("no-such-page.md: no such file"),
        "{}",
        broken[0]
    );
    assert!(broken[1].contains("#the-local-reply-config: no heading"));
    assert!(broken[2].contains("configuration.md#no-such-heading: no heading"));
}

#[test]
fn anchors_follow_githubs_slugs() {
    let text = "# Title\n## /v1/responses/compact\n## In-process (the module), side by side\n\
                ## Remote compaction: `compaction_trigger`\n### The module's JSON config\n\
                ## Notes\n## Notes\n```\n# not a heading\n```\n";
    assert_eq!(
        anchors(text),
        [
            "title",
            "v1responsescompact",
            "in-process-the-module-side-by-side",
            "remote-compaction-compaction_trigger",
            "the-modules-json-config",
            "notes",
            "notes-1",
        ]
    );
}

#[test]
fn the_readme_is_short_and_maps_every_page() {
    let readme = std::fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(lines <= 300, "README.md has {lines} lines (at most 300)");
    let linked: Vec<String> = prose(&readme).into_iter().flat_map(link_targets).collect();
    for page in pages() {
        let name = format!("docs/{}", page.file_name().unwrap().to_string_lossy());
        assert!(
            linked
                .iter()
                .any(|t| t.split('#').next() == Some(name.as_str())),
            "README.md does not link {name}"
        );
    }
}

#[test]
fn every_page_opens_with_its_title_and_a_short_summary() {
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("page");
        let name = page.display();
        let mut lines = text.lines();
        assert!(
            lines.next().is_some_and(|l| l.starts_with("# ")),
            "{name}: the first line is not its title"
        );
        assert_eq!(
            lines.next(),
            Some(""),
            "{name}: no blank line after the title"
        );
        let summary: Vec<&str> = lines.take_while(|l| !l.is_empty()).collect();
        assert!(
            (1..=2).contains(&summary.len()) && !summary[0].starts_with(['#', '|', '-']),
            "{name}: the summary under the title is not one or two lines of text"
        );
    }
}
