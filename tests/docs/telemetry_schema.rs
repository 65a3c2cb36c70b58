//! The metrics schema where the code cannot be: the metrics table of docs/operations.md, and
//! the module's buckets in Envoy's bootstrap.
//!
//! The module's histograms take their buckets from Envoy's bootstrap, not from the module
//! (`stats_config.histogram_bucket_settings`, matched on the stat's full name): every shipped
//! Envoy config of the module sets the buckets of the metrics schema
//! (`responses_core::metrics`), for each histogram family under its metrics namespace. The
//! processor registers the same buckets; `tests/e2e/metrics.rs` compares both exports.

use crate::common;

use responses_core::metrics::{Kind, Metric};

/// What each histogram family's setting must be: (the prefix, its buckets).
fn expected(namespace: &str) -> Vec<(String, Vec<f64>)> {
    Metric::ALL
        .iter()
        .map(|m| m.family())
        .filter(|f| f.kind == Kind::Histogram)
        .map(|f| (format!("{namespace}.{}", f.name), f.buckets.to_vec()))
        .collect()
}

/// The `- match: {prefix: "..."}` / `buckets: [...]` pairs of a YAML file, in order.
fn settings(file: &str) -> Vec<(String, Vec<f64>)> {
    let text = std::fs::read_to_string(common::repo_root().join(file)).expect(file);
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    lines
        .windows(2)
        .filter_map(|pair| {
            let prefix = pair[0]
                .strip_prefix("- match: {prefix: \"")?
                .strip_suffix("\"}")?;
            let buckets = pair[1]
                .strip_prefix("buckets: [")
                .and_then(|b| b.strip_suffix(']'))
                .unwrap_or_else(|| panic!("{file}: no buckets after {}", pair[0]));
            let buckets = buckets
                .split(',')
                .map(|b| b.trim().parse().expect("a number"))
                .collect();
            Some((prefix.to_owned(), buckets))
        })
        .collect()
}

#[test]
fn the_shipped_envoy_configs_give_the_module_the_schemas_buckets() {
    assert_eq!(
        settings("envoy/envoy-module.yaml"),
        expected("responses_module")
    );
    // Envoy Gateway sets no metrics namespace: Envoy's default.
    assert_eq!(
        settings("deploy/envoy-gateway/module-policy.yaml"),
        expected("dynamicmodulescustom")
    );
    // Istio: a pod annotation, prefix → buckets, in the file's instructions.
    let file = "deploy/istio/envoyfilter-module.yaml";
    let text = std::fs::read_to_string(common::repo_root().join(file)).expect(file);
    let annotation = text
        .split("sidecar.istio.io/statsHistogramBuckets: '")
        .nth(1)
        .and_then(|rest| rest.split('\'').next())
        .expect("the annotation");
    let buckets: std::collections::BTreeMap<String, Vec<f64>> =
        serde_json::from_str(annotation).expect("its JSON");
    assert_eq!(buckets, expected("responses_module").into_iter().collect());
}

#[test]
fn no_histograms_prefix_matches_another_family() {
    // Envoy matches each setting on the beginning of a stat's name.
    for a in Metric::ALL {
        for b in Metric::ALL {
            let (a, b) = (a.family().name, b.family().name);
            assert!(a == b || !b.starts_with(a), "{a} is a prefix of {b}");
        }
    }
}

/// The metrics table of docs/operations.md lists exactly the schema's families, each with the
/// instrument it is over OTLP, its type, its buckets and, for a replaced family, that it is
/// deprecated.
#[test]
fn the_operations_page_lists_the_schemas_families() {
    let page = std::fs::read_to_string(common::repo_root().join("docs/operations.md"))
        .expect("docs/operations.md");
    let rows: Vec<Vec<String>> = page
        .lines()
        .skip_while(|l| !l.starts_with("| family (after the prefix) | over OTLP |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect();
    assert_eq!(rows.len(), Metric::ALL.len(), "one row per family");
    for metric in Metric::ALL {
        let f = metric.family();
        let row = rows
            .iter()
            .find(|r| r[0] == format!("`{}`", f.name))
            .unwrap_or_else(|| panic!("no row for {}", f.name));
        let otlp = f
            .semconv
            .map_or_else(|| "ours".to_owned(), |i| format!("`{}`", i.name));
        assert_eq!(row[1], otlp, "{}", f.name);
        assert_eq!(row[2], f.kind.as_str(), "{}", f.name);
        if f.kind == Kind::Histogram {
            let buckets: Vec<String> = f.buckets.iter().map(|b| b.to_string()).collect();
            let listed = buckets.join(", ");
            assert!(
                row[5].ends_with(&listed) || row[5] == "as above",
                "{}: {} is not {listed}",
                f.name,
                row[5]
            );
        }
        assert_eq!(
            row[6].starts_with("**deprecated**"),
            f.replaced_by.is_some(),
            "{}",
            f.name
        );
    }
}
