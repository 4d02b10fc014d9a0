//! Clap's refusals of a command line as one line, the same in every binary (`padll`,
//! `cheferd`, `cheferd-lab`, `policies`): what is wrong, naming the value (a missing
//! argument, a typo'd flag or subcommand with clap's suggestion), and the help of the
//! (sub)command it was given to. Help and version are printed as clap renders them.
//! Included with `#[path = "…/scripts/cli-errors.rs"] mod cli_errors;`.

use clap::error::{ContextKind, ContextValue, ErrorKind};
use std::ffi::OsString;

/// Help or version, which clap renders (on stdout, or stderr when shown for a missing
/// subcommand): printed, with the exit code (0, or 2). `None` for a refusal.
pub fn shown(error: &clap::Error) -> Option<u8> {
    if !matches!(
        error.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        return None;
    }
    let _ = error.print();
    Some(if error.use_stderr() {
        padll_wire::exit::EX_USAGE
    } else {
        0
    })
}

/// `error`, a refusal of `args` (the program's name first) by `command`, as one line:
/// clap's message (with what it lists under it: the missing arguments, the possible
/// values), its tip, and `see 'PROGRAM SUBCOMMAND --help'` for the deepest subcommand
/// given. Values are escaped (`\n`), so the line stays one.
pub fn line(error: &clap::Error, command: &clap::Command, args: &[OsString]) -> String {
    let mut rendered = error.render().to_string();
    for kind in [
        ContextKind::InvalidArg,
        ContextKind::InvalidValue,
        ContextKind::InvalidSubcommand,
    ] {
        let values = match error.get(kind) {
            Some(ContextValue::String(value)) => vec![value.clone()],
            Some(ContextValue::Strings(values)) => values.clone(),
            _ => Vec::new(),
        };
        for value in values {
            let escaped = padll_wire::escape(&value).to_string();
            if escaped != value {
                rendered = rendered.replace(&value, &escaped);
            }
        }
    }
    // The message is the lines before the first blank one, the usage or the tip.
    let message: Vec<&str> = rendered
        .lines()
        .map(str::trim)
        .take_while(|l| !l.is_empty() && !l.starts_with("Usage:") && !l.starts_with("tip:"))
        .collect();
    let message = match message.join(" ") {
        joined if joined.is_empty() => "bad command line".to_string(),
        joined => joined.trim_start_matches("error: ").to_string(),
    };
    // A tip that suggests a spelling; not clap's `use '-- …'`, which misleads more often.
    let tip = rendered
        .lines()
        .find_map(|l| l.trim().strip_prefix("tip: "))
        .filter(|t| !t.contains("use '--"))
        .map(|t| format!(" ({t})"))
        .unwrap_or_default();
    format!("{message}{tip}; see '{} --help'", given(command, args))
}

/// The program and the subcommands `args` named, as far as `command` knows them:
/// `cheferd ctl` for `cheferd ctl stauts`.
fn given(command: &clap::Command, args: &[OsString]) -> String {
    let mut path = vec![command.get_name().to_string()];
    let mut current = command;
    for arg in args.iter().skip(1) {
        let Some(arg) = arg.to_str() else { continue };
        if arg == "--" {
            break;
        }
        if let Some(sub) = current.find_subcommand(arg) {
            path.push(sub.get_name().to_string());
            current = sub;
        }
    }
    path.join(" ")
}
