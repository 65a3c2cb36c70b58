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
