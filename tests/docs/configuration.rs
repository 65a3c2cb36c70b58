//! The settings table of `docs/configuration.md` is checked against the definitions it
//! documents: the processor's CLI (`src/config.rs`), which takes the shared settings of
//! `core/src/settings.rs` as a group of flags, and those settings' JSON keys (the module's
//! config). Every flag has one row with its environment variable, its module key (the shared
//! settings only) and its default; every row names real flags; every JSON key has its row.

use clap::{Args, CommandFactory};
use responses_core::settings::ExchangeConfig;
use responses_extproc::config::Cli;

const PAGE: &str = "docs/configuration.md";

struct Row {
    line: String,
    flags: Vec<String>,
    env: String,
    key: Option<String>,
    default: String,
}

/// The text of each `` `code` `` span of `cell`.
fn code_spans(cell: &str) -> Vec<String> {
    cell.split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

fn rows() -> Vec<Row> {
    let page = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/docs/configuration.md"
    ))
    .expect(PAGE);
    let section = page
        .split("\n## Settings\n")
        .nth(1)
        .expect("a '## Settings' section in docs/configuration.md");
    section
        .lines()
        .skip_while(|l| !l.starts_with("| flag |"))
        .skip(2)
        .take_while(|l| l.starts_with('|'))
        .map(|line| {
            // Escaped pipes (`spec\|openai`) are text, not cell borders.
            let unescaped = line.replace("\\|", "/");
            let cells: Vec<&str> = unescaped
                .trim_matches('|')
                .split('|')
                .map(str::trim)
                .collect();
            assert_eq!(cells.len(), 5, "a row of 5 cells: {line}");
            let key = code_spans(cells[2]);
            assert!(key.len() <= 1, "one module key at most: {line}");
            Row {
                line: line.to_owned(),
                flags: code_spans(cells[0])
                    .into_iter()
                    .filter(|f| f.starts_with("--"))
                    .collect(),
                env: cells[1].to_owned(),
                key: key.into_iter().next(),
                default: cells[3].to_owned(),
            }
        })
        .collect()
}

/// Whether the table's `cell` states clap's `default` (none: the setting is off or unset).
fn states_default(cell: &str, default: Option<&str>) -> bool {
    let Some(default) = default.filter(|d| *d != "false") else {
        // No default value: the cell says what unset means, in words.
        return !cell.is_empty() && !cell.starts_with('`');
    };
    if cell == default || cell == format!("`{default}`") {
        return true;
    }
    // Sizes in bytes, written `16 MiB` / `1 KiB`.
    let bytes = cell.split_once(' ').and_then(|(n, unit)| {
        let n: u64 = n.parse().ok()?;
        Some(match unit {
            "MiB" => n << 20,
            "KiB" => n << 10,
            _ => return None,
        })
    });
    bytes.is_some_and(|b| default.parse() == Ok(b))
}

#[test]
fn every_flag_has_its_row_with_its_variable_key_and_default() {
    let rows = rows();
    let shared: Vec<String> = ExchangeConfig::augment_args(clap::Command::new("x"))
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    let cli = Cli::command();
    let args: Vec<&clap::Arg> = cli
        .get_arguments()
        .filter(|a| !["help", "version"].contains(&a.get_id().as_str()))
        .collect();
    assert!(args.len() > 30, "{} flags", args.len());
    let mut problems = Vec::new();
    for arg in &args {
        let id = arg.get_id().to_string();
        let flag = format!(
            "--{}",
            arg.get_long().expect("every setting is a long flag")
        );
        let found: Vec<&Row> = rows.iter().filter(|r| r.flags.contains(&flag)).collect();
        let [row] = found[..] else {
            problems.push(format!("{flag}: {} rows", found.len()));
            continue;
        };
        let env = arg
            .get_env()
            .expect("every flag reads a variable")
            .to_string_lossy();
        if !code_spans(&row.env).contains(&env.to_string()) {
            problems.push(format!("{flag}: the variable is `{env}`: {}", row.line));
        }
        let key = shared.contains(&id).then_some(id.clone());
        if row.key != key {
            problems.push(format!("{flag}: the module key is {key:?}: {}", row.line));
        }
        let default = arg
            .get_default_values()
            .first()
            .map(|d| d.to_string_lossy());
        if !states_default(&row.default, default.as_deref()) {
            problems.push(format!("{flag}: the default is {default:?}: {}", row.line));
        }
    }
    for row in &rows {
        for flag in &row.flags {
            if !args
                .iter()
                .any(|a| a.get_long().map(|l| format!("--{l}")).as_ref() == Some(flag))
            {
                problems.push(format!("{flag} is not a flag: {}", row.line));
            }
        }
    }
    // Every key of the module's JSON config, the environment-only ones included.
    let json = serde_json::to_value(ExchangeConfig::default()).expect("the settings as JSON");
    for key in json.as_object().expect("an object").keys() {
        if !rows.iter().any(|r| r.key.as_deref() == Some(key.as_str())) {
            problems.push(format!("the module key `{key}` has no row"));
        }
    }
    assert!(
        problems.is_empty(),
        "{PAGE} and the CLI differ:\n{}",
        problems.join("\n")
    );
}

#[test]
fn defaults_are_read_as_written() {
    assert!(states_default("16 MiB", Some("16777216")));
    assert!(states_default("`/v1/responses`", Some("/v1/responses")));
    assert!(states_default("4096", Some("4096")));
    assert!(states_default("off", None));
    assert!(states_default("off", Some("false")));
    assert!(!states_default("1 MiB", Some("16777216")));
    assert!(!states_default("`/v1/chat`", Some("/v1/responses")));
    assert!(!states_default("`x`", None));
}

/// "Both modes refuse … a cap of 0" (the page's module section): every number among the
/// shared settings, set to 0 alone, is refused by the one validation both adapters run (the
/// processor at startup, the module when Envoy loads its config).
#[test]
fn every_numeric_setting_refuses_zero() {
    let defaults = serde_json::to_value(ExchangeConfig::default()).expect("settings as JSON");
    let numeric: Vec<&String> = defaults
        .as_object()
        .expect("an object")
        .iter()
        .filter(|(_, v)| v.is_number())
        .map(|(k, _)| k)
        .collect();
    assert!(numeric.len() > 10, "{numeric:?}");
    let accepted: Vec<&&String> = numeric
        .iter()
        .filter(|key| {
            let config: ExchangeConfig =
                serde_json::from_value(serde_json::json!({ key.as_str(): 0 })).expect(key);
            config.validate().is_ok()
        })
        .collect();
    assert!(
        accepted.is_empty(),
        "{PAGE}: a 0 is accepted for {accepted:?}"
    );
}
