//! What the `cheferd` binary's man pages say beyond its command line: exit status,
//! files, examples, and the `global.toml(5)` page (`cheferd generate man DIR`).

use crate::cli_docs::{ConfigPage, Extras, Page};

/// The exit status of every command but `ctl` (`Kind::exit_code` of bin/common).
const EXIT_STATUS: &[(&str, &str)] = &[
    ("0", "Success; a controller exits 0 when SIGTERM or SIGINT stops it."),
    ("1", "A failure at run time (e.g. a controller deposed by a newer leader, a file that cannot be written)."),
    ("2", "Bad usage: a flag, a value or the configuration file is wrong (the message names it); nothing was started."),
];

/// `cheferd ctl`'s exit status: scripts tell a refusal from an unreachable controller.
const CTL_EXIT_STATUS: &[(&str, &str)] = &[
    ("0", "The view was printed, or the change was applied."),
    ("1", "The controller refused the change (e.g. an unknown job or resource, or a standby naming its leader)."),
    ("2", "Bad usage: the bad value is named and nothing was sent."),
    ("69", "The controller could not be reached, or did not answer within 10 seconds."),
    ("77", "Permission denied: changes are for root, the controller's uid and the configuration's admins."),
];

const GLOBAL_FILES: &[(&str, &str)] = &[
    ("/etc/cheferd/global.toml", "The configuration (--config): resources, policies, jobs, scheduled rules; see global.toml(5)."),
    ("/etc/cheferd/tls/server.pem, server.key, ca.pem", "Its certificate and key, and the site CA that signed the nodes' certificates (cheferd certs)."),
    ("/run/cheferd/admin.sock", "The admin socket cheferd ctl talks to (--admin-socket)."),
    ("/etc/default/cheferd-global", "The systemd unit's settings (CHEFERD_GLOBAL_OPTIONS)."),
];

const LOCAL_FILES: &[(&str, &str)] = &[
    (
        "/run/cheferd/local.sock",
        "The socket the node's stages connect to (--socket; their PADLL_CONTROLLER).",
    ),
    (
        "/etc/cheferd/tls/node.pem, node.key, ca.pem",
        "This node's certificate and key, and the site CA (cheferd certs node).",
    ),
    (
        "/etc/default/cheferd-local",
        "The systemd unit's settings (CHEFERD_GLOBAL, CHEFERD_LOCAL_OPTIONS).",
    ),
    (
        "/proc/PID/cgroup",
        "Read for every stage: its Slurm job, whatever the stage claims.",
    ),
];

const RELAY_FILES: &[(&str, &str)] = &[
    (
        "/etc/cheferd/tls/server.pem, server.key",
        "Its server certificate and key, which the local controllers check (cheferd certs server).",
    ),
    (
        "/etc/cheferd/tls/relay.pem, relay.key, ca.pem",
        "Its node certificate and key, which the global controller checks against `relays` (cheferd certs node), and the site CA.",
    ),
    (
        "/etc/default/cheferd-relay",
        "The systemd unit's settings (CHEFERD_RELAY_LISTEN, CHEFERD_GLOBAL, CHEFERD_RELAY_OPTIONS).",
    ),
];

const PAGES: &[Page] = &[
    Page {
        name: "cheferd",
        exit_status: None,
        files: &[],
        examples: &[
            ("The live view of a running cluster, on the head node:", "cheferd ctl top"),
        ],
    },
    Page {
        name: "cheferd-global",
        exit_status: None,
        files: GLOBAL_FILES,
        examples: &[(
            "The global controller of a cluster, with mutual TLS and metrics:",
            "cheferd global --config /etc/cheferd/global.toml --listen 0.0.0.0:50051 \\\n    --tls-cert server.pem --tls-key server.key --tls-client-ca ca.pem \\\n    --metrics 127.0.0.1:9464",
        ), (
            "One of two global controllers with a standby, elected in etcd:",
            "cheferd global --config global.toml --listen 0.0.0.0:50051 ... \\\n    --etcd http://etcd1:2379,http://etcd2:2379,http://etcd3:2379 --advertise https://head1:50051",
        )],
    },
    Page {
        name: "cheferd-local",
        exit_status: None,
        files: LOCAL_FILES,
        examples: &[(
            "The local controller of node cn-001:",
            "cheferd local --global https://head:50051 \\\n    --tls-cert node-cn-001.pem --tls-key node-cn-001.key --tls-ca ca.pem",
        ), (
            "The same, holding a job to 2000 metadata operations/s on /scratch while it has no rules from the global controller:",
            "cheferd local --global https://head:50051 ... \\\n    --default-limit /scratch:metadata=2000/s",
        )],
    },
    Page {
        name: "cheferd-relay",
        exit_status: None,
        files: RELAY_FILES,
        examples: &[(
            "The relay of rack 1 (`relays = [\"rack1\"]` in the global controller's global.toml); its nodes run `cheferd local --global https://rack1:50052 ...`:",
            "cheferd relay --listen 0.0.0.0:50052 --global https://head:50051 \\\n    --tls-cert server.pem --tls-key server.key \\\n    --node-cert node-rack1.pem --node-key node-rack1.key --tls-ca ca.pem",
        )],
    },
    Page {
        name: "cheferd-ctl",
        exit_status: Some(CTL_EXIT_STATUS),
        files: &[("/run/cheferd/admin.sock", "The global controller's admin socket (--socket).")],
        examples: &[
            ("Every job's usage, demand and assigned rate, as JSON:", "cheferd ctl jobs --json"),
            ("Halve a resource's capacity:", "cheferd ctl set-max-rate /scratch:metadata 55k"),
            ("Give job 4242 priority 2 and a demand:", "cheferd ctl set-job 4242 --priority 2 --resource /scratch:metadata --demand 40k"),
        ],
    },
    Page {
        name: "cheferd-certs",
        exit_status: None,
        files: &[],
        examples: &[(
            "A site CA, the head node's certificate and two nodes' certificates:",
            "cheferd certs ca --out ca\ncheferd certs server head head.cluster --ca ca --out head\ncheferd certs node cn-001 cn-002 --ca ca --out nodes",
        )],
    },
];

const CONFIG_PAGES: &[ConfigPage] = &[ConfigPage {
    file: "global.toml",
    summary: "configuration of the PADLL global controller (cheferd global --config)",
    sections: &["`global.toml`", "Rates"],
    see_also: "cheferd-global(1), cheferd-ctl(1), padll.toml(5)",
}];

/// The `cheferd` binary's man page extras.
pub const EXTRAS: Extras = Extras {
    exit_status: EXIT_STATUS,
    pages: PAGES,
    config_pages: CONFIG_PAGES,
};
