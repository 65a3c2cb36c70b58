//! The Prometheus text format, read: the processor's `/metrics` and Envoy's
//! `/stats/prometheus` (which writes `{}` for a series without labels and no `# HELP`).

use std::collections::{BTreeMap, BTreeSet};

/// One sample line.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    pub value: f64,
}

/// An export: each family's type (`# TYPE`), and every sample.
#[derive(Debug, Clone, Default)]
pub struct Export {
    pub types: BTreeMap<String, String>,
    pub samples: Vec<Sample>,
}

/// A label value's text, up to its closing quote, unescaped; and the rest after the quote.
fn quoted(s: &str) -> (String, &str) {
    let mut out = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return (out, &s[i + 1..]),
            '\\' => match chars.next() {
                Some((_, 'n')) => out.push('\n'),
                Some((_, other)) => out.push(other),
                None => break,
            },
            c => out.push(c),
        }
    }
    panic!("an unterminated label value: {s}")
}

fn sample(line: &str) -> Sample {
    let (name, mut rest) = match line.find(['{', ' ']) {
        Some(i) => line.split_at(i),
        None => panic!("a sample without a value: {line}"),
    };
    let mut labels = BTreeMap::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = inner;
        loop {
            rest = rest.trim_start_matches(',');
            if let Some(after) = rest.strip_prefix('}') {
                rest = after;
                break;
            }
            let (key, after) = rest
                .split_once("=\"")
                .unwrap_or_else(|| panic!("a label without a value: {line}"));
            let (value, after) = quoted(after);
            labels.insert(key.to_owned(), value);
            rest = after;
        }
    }
    let value = rest.trim();
    let value = match value {
        "+Inf" => f64::INFINITY,
        "-Inf" => f64::NEG_INFINITY,
        v => v
            .parse()
            .unwrap_or_else(|_| panic!("not a number: {v:?} in {line}")),
    };
    Sample {
        name: name.to_owned(),
        labels,
        value,
    }
}

impl Export {
    pub fn parse(text: &str) -> Export {
        let mut export = Export::default();
        for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if let Some(kind) = line.strip_prefix("# TYPE ") {
                let (name, kind) = kind.split_once(' ').expect("# TYPE name kind");
                export.types.insert(name.to_owned(), kind.to_owned());
            } else if !line.starts_with('#') {
                export.samples.push(sample(line));
            }
        }
        export
    }

    /// The samples of series `name` (a family, or its `_bucket`, `_sum`, `_count`).
    pub fn series<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// The value of the one sample of `name` whose labels include all of `labels`.
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let matching: Vec<&Sample> = self
            .series(name)
            .filter(|s| {
                labels
                    .iter()
                    .all(|(k, v)| s.labels.get(*k).map(String::as_str) == Some(*v))
            })
            .collect();
        assert_eq!(
            matching.len(),
            1,
            "{name} {labels:?}: {matching:?}\namong {:?}",
            self.series(name).collect::<Vec<_>>()
        );
        matching[0].value
    }

    /// The families whose names start with `prefix`, by their name less the prefix.
    pub fn families(&self, prefix: &str) -> BTreeSet<String> {
        self.types
            .keys()
            .filter_map(|name| name.strip_prefix(prefix))
            .map(str::to_owned)
            .collect()
    }
}
