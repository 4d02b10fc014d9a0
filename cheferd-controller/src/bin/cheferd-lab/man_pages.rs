//! What the `cheferd-lab` binary's man pages say beyond its command line: exit status
//! and examples (`cheferd-lab generate man DIR`).

use crate::cli_docs::{Extras, Page};

/// The exit status of every tool (`Kind::exit_code` of bin/common).
const EXIT_STATUS: &[(&str, &str)] = &[
    ("0", "Success."),
    ("1", "A failure at run time (e.g. a controller of the demo that stopped, a file that cannot be written)."),
    ("2", "Bad usage: a flag, a value or an input file is wrong (the message names it); nothing was started."),
];

const PAGES: &[Page] = &[
    Page {
        name: "cheferd-lab",
        exit_status: None,
        files: &[],
        examples: &[
            ("The whole system on one machine, with a plot of the rates:", "cheferd-lab demo"),
            ("The control cycle with 1000 simulated local controllers:", "cheferd-lab bench --locals 1000"),
        ],
    },
    Page {
        name: "cheferd-lab-demo",
        exit_status: None,
        files: &[],
        examples: &[
            ("The demo with its defaults (four jobs, PSFA):", "cheferd-lab demo"),
            ("Two jobs under AdapTBF for a minute, results in ./out:", "cheferd-lab demo --policy adaptbf --jobs 2 --seconds 60 --out out"),
        ],
    },
    Page {
        name: "cheferd-lab-replay",
        exit_status: None,
        files: &[],
        examples: &[(
            "A constant load of 2000 metadata operations per second for 10 s, under the stage:",
            "padll run --mount /scratch --limit metadata=500/s -- cheferd-lab replay --rate 2000 --seconds 10 --dir /scratch/t",
        )],
    },
];

/// The `cheferd-lab` binary's man page extras.
pub const EXTRAS: Extras = Extras {
    exit_status: EXIT_STATUS,
    pages: PAGES,
    config_pages: &[],
};
