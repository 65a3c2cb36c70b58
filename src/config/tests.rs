use super::*;

#[test]
fn listen_addresses() {
    assert_eq!(
        "127.0.0.1:1".parse(),
        Ok(Listen::Tcp("127.0.0.1:1".parse().unwrap()))
    );
    assert_eq!(
        "unix:/tmp/x.sock".parse(),
        Ok(Listen::Unix("/tmp/x.sock".into()))
    );
    assert!("unix:".parse::<Listen>().is_err());
    assert!("localhost".parse::<Listen>().is_err());
}

#[test]
fn defaults_and_tls_flags() {
    let c = Config::default();
    assert_eq!(c.listen.to_string(), "127.0.0.1:50051");
    assert_eq!(c.exchange.responses_path, "/v1/responses");
    assert!(!c.exchange.strict && !c.log_content);
    assert!(
        Cli::try_parse_from(["x", "--tls-cert", "c.pem"]).is_err(),
        "a cert needs its key"
    );
    assert!(
        Cli::try_parse_from(["x", "--tls-client-ca", "ca.pem"]).is_err(),
        "mTLS needs TLS"
    );
    assert!(Cli::try_parse_from([
        "x",
        "--tls-cert",
        "c",
        "--tls-key",
        "k",
        "--tls-client-ca",
        "a"
    ])
    .is_ok());
}

/// The Envoy module reads the same settings from JSON (`responses_core::settings`): every
/// flag of the group is a JSON key of the same name, with the same default, and the same
/// values given both ways make the same settings.
#[test]
fn the_modules_json_keys_and_defaults_are_the_flags() {
    use clap::{Args, CommandFactory};
    let group = ExchangeConfig::augment_args(clap::Command::new("x"));
    let mut flags: Vec<String> = group
        .get_arguments()
        .map(|a| {
            let id = a.get_id().to_string();
            assert_eq!(a.get_long(), Some(id.replace('_', "-").as_str()));
            id
        })
        .collect();
    // Environment only for the CLI (kept out of process listings).
    flags.push("reasoning_keys".into());
    // The module's alone: the processor sends its calls to --ws-upstream.
    flags.push("upstream_cluster".into());
    flags.sort();
    let json = serde_json::to_value(ExchangeConfig::default()).unwrap();
    let mut keys: Vec<String> = json.as_object().unwrap().keys().cloned().collect();
    keys.sort();
    assert_eq!(flags, keys);
    // The group is part of the CLI, with the same defaults.
    assert!(Cli::command()
        .get_arguments()
        .any(|a| a.get_id() == "max_body_bytes"));
    assert_eq!(Config::default().exchange, ExchangeConfig::default());

    let cli = Cli::try_parse_from([
        "x",
        "--responses-path",
        "/r",
        "--chat-path",
        "/c",
        "--model-header",
        "x-m",
        "--strict",
        "--reasoning-events",
        "openai",
        "--max-sse-frame-bytes",
        "7",
        "--max-output-bytes",
        "8",
        "--developer-role",
        "developer",
        "--hosted-tools",
        "reject",
        "--max-request-bytes",
        "9",
        "--max-input-items",
        "10",
        "--max-part-bytes",
        "11",
        "--reasoning-keys-file",
        "/k",
        "--max-body-bytes",
        "12",
    ])
    .unwrap();
    let module: ExchangeConfig = serde_json::from_value(serde_json::json!({
        "responses_path": "/r", "chat_path": "/c", "model_header": "x-m", "strict": true,
        "reasoning_events": "openai", "max_sse_frame_bytes": 7, "max_output_bytes": 8,
        "developer_role": "developer", "hosted_tools": "reject", "max_request_bytes": 9,
        "max_input_items": 10, "max_part_bytes": 11, "reasoning_keys_file": "/k",
        "max_body_bytes": 12,
        "reasoning_keys": cli.serve.exchange.reasoning_keys,
    }))
    .unwrap();
    assert_eq!(cli.serve.exchange, module);
}

/// The enums of the settings are the core's own: each value has one name, as a flag
/// value and as a JSON value.
#[test]
fn every_enum_value_is_named_alike_in_flags_and_json() {
    use responses_core::client::ReasoningEventsPolicy;
    use responses_core::translate::{DeveloperRole, HostedTools};
    fn alike<T: ValueEnum + serde::Serialize + std::fmt::Debug>() {
        for v in T::value_variants() {
            let flag = v.to_possible_value().expect("a visible value");
            let json = serde_json::to_value(v).unwrap();
            assert_eq!(json.as_str(), Some(flag.get_name()), "{v:?}");
        }
    }
    alike::<ReasoningEventsPolicy>();
    alike::<DeveloperRole>();
    alike::<HostedTools>();
}

/// The drain's default is the core's, as the module's bootstrap extension's.
#[test]
fn the_drain_time_defaults_to_the_cores() {
    assert_eq!(
        Config::default().drain_seconds,
        std::time::Duration::from_secs(responses_core::settings::DEFAULT_DRAIN_SECONDS)
    );
}
