//! `cheferd certs`: the site CA and the controllers' certificates (mutual TLS).

use crate::common::{usage, Failure};
use clap::{Args, Subcommand};
use padll_wire::flags::whole;
use std::path::PathBuf;

/// Upper bound of `--days`: a century.
const MAX_DAYS: u32 = 36_500;

#[derive(Subcommand)]
pub enum CertsCommand {
    /// A new site CA: DIR/ca.pem and DIR/ca.key (0600). Keep ca.key off the compute
    /// nodes.
    Ca {
        /// Directory to write to (created 0700 if missing).
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
        /// The CA's common name.
        #[arg(long, default_value = "cheferd site CA")]
        name: String,
        /// Days of validity.
        #[arg(long, default_value_t = 3650)]
        #[arg(allow_negative_numbers = true, value_parser = whole(1..=MAX_DAYS))]
        days: u32,
    },
    /// One certificate per node NAME, signed by the CA: OUT/node-NAME.pem and
    /// OUT/node-NAME.key (0600), for `cheferd local --tls-cert/--tls-key` (each node's
    /// `cheferd local` takes its name from its certificate).
    Node(SignArgs),
    /// The global controller's certificate for the host names and IP addresses local
    /// controllers reach it by (each one in --global URLs must be listed):
    /// OUT/server.pem and OUT/server.key (0600).
    Server(SignArgs),
}

/// What `cheferd certs node` and `cheferd certs server` sign.
#[derive(Args)]
pub struct SignArgs {
    /// Node names, or the server's host names and addresses.
    #[arg(required = true)]
    names: Vec<String>,
    /// The CA directory (`cheferd certs ca --out`).
    #[arg(long, value_name = "DIR")]
    ca: PathBuf,
    /// Directory to write to (created 0700 if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Days of validity.
    #[arg(long, default_value_t = 825)]
    #[arg(allow_negative_numbers = true, value_parser = whole(1..=MAX_DAYS))]
    days: u32,
}

/// `cheferd certs …`: prints the files written.
pub fn certs(command: CertsCommand) -> Result<(), Failure> {
    use cheferd_controller::tls::{make_ca, make_leaf, Role};
    let written = match command {
        CertsCommand::Ca { out, name, days } => make_ca(&out, &name, days),
        CertsCommand::Node(SignArgs {
            names,
            ca,
            out,
            days,
        }) => {
            // Check every name before writing anything.
            for name in &names {
                cheferd_controller::tls::check_name(name).map_err(usage)?;
            }
            let mut all = Vec::new();
            for name in &names {
                all.extend(
                    make_leaf(Role::Node, std::slice::from_ref(name), &ca, &out, days)
                        .map_err(usage)?,
                );
            }
            Ok(all)
        }
        CertsCommand::Server(SignArgs {
            names,
            ca,
            out,
            days,
        }) => make_leaf(Role::Server, &names, &ca, &out, days),
    }
    .map_err(usage)?;
    for path in written {
        println!("{}", path.display());
    }
    Ok(())
}
