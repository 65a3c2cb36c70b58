//! The model map (`model_map`): the names clients ask for → the names the upstream serves.
//!
//! Clients that believe they talk to OpenAI ask for OpenAI's names (Codex's default model,
//! the SDKs' examples), which a vLLM or a llama-server answers with 404 `model_not_found`.
//! The operator maps them, once for both modes:
//!
//! - an entry is `requested=upstream`; `requested` is an exact name, or a pattern: a name
//!   ending in one `*`, which stands for any rest, none included (`gpt-*`, and `*` alone for
//!   every name). `upstream` is used as written (no `*`: nothing is substituted);
//! - an exact name wins over every pattern; among patterns the longest prefix wins (the most
//!   specific, as LiteLLM orders its wildcard routes), so the order of entries never matters
//!   (the module's JSON object has none) and two entries can never tie: the same `requested`
//!   twice is refused;
//! - a name no entry matches is sent as the client wrote it.
//!
//! Only the Chat request's `model` changes: the model header, the metrics, traces and logs,
//! and the `model` of the answer keep the requested name; a second header carries the mapped
//! one ([`crate::exchange::UpstreamRequest::model_headers`]).

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;

/// The longest `model` accepted, in bytes. The name goes on as a request header (the model
/// header, for Envoy's routes) and is echoed and logged: 1 KiB is far above any real name (a
/// Hugging Face id, a served model's file path, an Ollama tag) and far below the header limits
/// on its way (Envoy's 60 KiB for all of a request's headers, llama-server's 8 KiB per line).
pub const MAX_MODEL_BYTES: usize = 1024;

/// One entry of the map, as the operator writes it: `requested=upstream`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelAlias {
    /// An exact name, or a pattern ending in `*`.
    pub requested: String,
    /// The name the upstream serves.
    pub upstream: String,
}

impl FromStr for ModelAlias {
    type Err = String;

    /// `requested=upstream`, split at the first `=` (a requested name cannot hold one; an
    /// upstream name can). Checked by [`ModelMap::check`].
    fn from_str(s: &str) -> Result<Self, String> {
        let (requested, upstream) = s
            .split_once('=')
            .ok_or_else(|| format!("`{s}` is not `requested=upstream`"))?;
        Ok(ModelAlias {
            requested: requested.to_owned(),
            upstream: upstream.to_owned(),
        })
    }
}

impl fmt::Display for ModelAlias {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}={}", self.requested, self.upstream)
    }
}

/// The map, ready to look names up in.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ModelMap {
    exact: HashMap<String, String>,
    /// `(prefix, upstream)`, the longest prefix first.
    patterns: Vec<(String, String)>,
}

impl ModelMap {
    /// The map of checked entries (see [`ModelMap::check`]; an entry repeated is the first's).
    pub fn new(aliases: &[ModelAlias]) -> Self {
        let mut map = ModelMap::default();
        for a in aliases {
            match a.requested.strip_suffix('*') {
                Some(prefix) => {
                    if !map.patterns.iter().any(|(p, _)| p == prefix) {
                        map.patterns.push((prefix.to_owned(), a.upstream.clone()));
                    }
                }
                None => {
                    map.exact
                        .entry(a.requested.clone())
                        .or_insert_with(|| a.upstream.clone());
                }
            }
        }
        // Prefixes are distinct: no two of the same length can both match one name.
        map.patterns
            .sort_by_key(|(prefix, _)| std::cmp::Reverse(prefix.len()));
        map
    }

    /// Refuses entries no map could honour: an empty name, a `*` other than a pattern's last
    /// character, an upstream name with a `*` or one that cannot be sent as a header value
    /// (control characters, longer than [`MAX_MODEL_BYTES`]: the mapped name goes on as the
    /// upstream model header), the same requested name twice.
    pub fn check(aliases: &[ModelAlias]) -> Result<(), String> {
        let mut seen = std::collections::HashSet::new();
        for a in aliases {
            let refuse = |why: &str| Err(format!("model_map: `{a}`: {why}"));
            if a.requested.is_empty() || a.upstream.is_empty() {
                return refuse("both names must be given");
            }
            if a.requested.trim_end_matches('*').contains('*') || a.requested.ends_with("**") {
                return refuse("a pattern has one `*`, at its end");
            }
            if a.upstream.contains('*') {
                return refuse("the upstream name is used as written: it cannot hold a `*`");
            }
            if a.upstream.len() > MAX_MODEL_BYTES {
                return refuse(&format!(
                    "the upstream name is longer than {MAX_MODEL_BYTES} bytes"
                ));
            }
            if a.upstream
                .chars()
                .any(|c| c.is_ascii_control() && c != '\t')
            {
                return refuse("the upstream name holds a control character");
            }
            if !seen.insert(a.requested.as_str()) {
                return refuse("this requested name is mapped twice");
            }
        }
        Ok(())
    }

    /// The upstream's name for `requested`, if an entry matches it.
    pub fn resolve(&self, requested: &str) -> Option<&str> {
        if let Some(upstream) = self.exact.get(requested) {
            return Some(upstream);
        }
        self.patterns
            .iter()
            .find(|(prefix, _)| requested.starts_with(prefix.as_str()))
            .map(|(_, upstream)| upstream.as_str())
    }

    pub fn is_empty(&self) -> bool {
        self.exact.is_empty() && self.patterns.is_empty()
    }
}

/// The entries as the module's JSON writes them: one object, `{"requested": "upstream", ...}`
/// (`serde(with)` on the setting). Its order does not matter ([`ModelMap`]); a key twice is
/// kept twice, for [`ModelMap::check`] to refuse.
pub mod json {
    use serde::de::{MapAccess, Visitor};
    use serde::ser::SerializeMap;
    use serde::{Deserializer, Serializer};

    use super::ModelAlias;

    pub fn serialize<S: Serializer>(aliases: &[ModelAlias], s: S) -> Result<S::Ok, S::Error> {
        let mut map = s.serialize_map(Some(aliases.len()))?;
        for a in aliases {
            map.serialize_entry(&a.requested, &a.upstream)?;
        }
        map.end()
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<ModelAlias>, D::Error> {
        struct Entries;
        impl<'de> Visitor<'de> for Entries {
            type Value = Vec<ModelAlias>;

            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object of requested model names to upstream model names")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(map.size_hint().unwrap_or(0));
                while let Some((requested, upstream)) = map.next_entry::<String, String>()? {
                    out.push(ModelAlias {
                        requested,
                        upstream,
                    });
                }
                Ok(out)
            }
        }
        d.deserialize_map(Entries)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aliases(list: &[&str]) -> Vec<ModelAlias> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    fn map(list: &[&str]) -> ModelMap {
        let a = aliases(list);
        ModelMap::check(&a).unwrap();
        ModelMap::new(&a)
    }

    #[test]
    fn exact_names_win_then_the_longest_prefix_whatever_the_order() {
        let entries = [
            "*=fallback",
            "gpt-*=qwen3",
            "gpt-5.4=qwen3-coder",
            "gpt-5*=qwen3-big",
            "o3=llama",
        ];
        let forward = map(&entries);
        let mut reversed = entries;
        reversed.reverse();
        assert_eq!(
            forward,
            map(&reversed),
            "the order of entries does not matter"
        );
        for (asked, sent) in [
            ("gpt-5.4", Some("qwen3-coder")),
            ("gpt-5.4-mini", Some("qwen3-big")),
            ("gpt-5", Some("qwen3-big")),
            ("gpt-4o", Some("qwen3")),
            ("gpt-", Some("qwen3")),
            ("o3", Some("llama")),
            ("o3-mini", Some("fallback")),
            ("anything", Some("fallback")),
        ] {
            assert_eq!(forward.resolve(asked), sent, "{asked}");
        }
    }

    #[test]
    fn names_no_entry_matches_pass_as_sent() {
        let m = map(&["gpt-*=qwen3", "o3=llama"]);
        for asked in ["qwen3", "GPT-5", "o3-mini", "xgpt-5", ""] {
            assert_eq!(m.resolve(asked), None, "{asked}");
        }
        assert!(ModelMap::default().is_empty());
        assert_eq!(ModelMap::default().resolve("gpt-5"), None);
    }

    #[test]
    fn entries_no_map_could_honour_are_refused() {
        for bad in [
            "=qwen",
            "gpt-*=",
            "g*pt=qwen",
            "gpt-**=qwen",
            "*gpt=qwen",
            "gpt-*=qwen-*",
            "gpt=qwen\nx-evil: 1",
        ] {
            let a = aliases(&[bad]);
            assert!(ModelMap::check(&a).is_err(), "{bad}");
        }
        let long = format!("gpt=q{}", "x".repeat(MAX_MODEL_BYTES));
        assert!(ModelMap::check(&aliases(&[&long])).is_err());
        let at_limit = format!("gpt={}", "x".repeat(MAX_MODEL_BYTES));
        assert!(ModelMap::check(&aliases(&[&at_limit])).is_ok());
        let twice = ModelMap::check(&aliases(&["gpt-*=a", "gpt-*=b"])).unwrap_err();
        assert!(twice.contains("mapped twice"), "{twice}");
        assert!("no-equals".parse::<ModelAlias>().is_err());
        // The first `=` splits: an upstream name may hold one, a tab too.
        let a: ModelAlias = "m=org/model=v2\tq".parse().unwrap();
        assert_eq!(
            (a.requested.as_str(), a.upstream.as_str()),
            ("m", "org/model=v2\tq")
        );
        assert!(ModelMap::check(&[a]).is_ok());
    }

    #[test]
    fn the_json_form_is_one_object() {
        #[derive(serde::Serialize, serde::Deserialize)]
        struct S {
            #[serde(with = "json")]
            m: Vec<ModelAlias>,
        }
        let s: S = serde_json::from_str(r#"{"m":{"gpt-*":"qwen3","o3":"llama"}}"#).unwrap();
        assert_eq!(s.m, aliases(&["gpt-*=qwen3", "o3=llama"]));
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"m":{"gpt-*":"qwen3","o3":"llama"}}"#
        );
        // A key twice is kept, for the check to refuse.
        let s: S = serde_json::from_str(r#"{"m":{"a":"x","a":"y"}}"#).unwrap();
        assert!(ModelMap::check(&s.m).is_err());
        assert!(serde_json::from_str::<S>(r#"{"m":["gpt-*=qwen3"]}"#).is_err());
        assert!(serde_json::from_str::<S>(r#"{"m":{"a":1}}"#).is_err());
    }
}
