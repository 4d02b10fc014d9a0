//! Man pages and shell completions from a binary's clap definition, written by its
//! hidden `generate` subcommand (`padll generate man DIR`, `cheferd generate
//! completions DIR`) so they always match the binary; `scripts/install.sh` runs them.
//! Included by `padll` and `cheferd` with `#[path = "…/scripts/cli-docs.rs"] mod cli_docs;`.

use clap_complete::Shell;
use std::path::PathBuf;

/// What `generate` writes.
#[derive(clap::Subcommand)]
pub enum Generate {
    /// One man page per command and subcommand (`NAME.1`, `NAME-SUB.1`, …) into DIR.
    Man {
        /// Directory to write to (created if missing).
        dir: PathBuf,
    },
    /// Completions for bash (`NAME.bash`), zsh (`_NAME`) and fish (`NAME.fish`) into DIR.
    Completions {
        /// Directory to write to (created if missing).
        dir: PathBuf,
    },
}

/// Writes what `what` asks for, from `command` (the binary's full clap definition);
/// an error is one line naming the directory.
pub fn generate(what: &Generate, mut command: clap::Command) -> Result<(), String> {
    let dir = match what {
        Generate::Man { dir } | Generate::Completions { dir } => dir,
    };
    let failed = |e: std::io::Error| format!("cannot write to {}: {e}", dir.display());
    std::fs::create_dir_all(dir).map_err(failed)?;
    match what {
        Generate::Man { .. } => clap_mangen::generate_to(command, dir).map_err(failed),
        Generate::Completions { .. } => {
            let name = command.get_name().to_string();
            for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
                clap_complete::generate_to(shell, &mut command, &name, dir).map_err(failed)?;
            }
            Ok(())
        }
    }
}
