//! The `limiter` command line: clap types only. `cmd` carries them out.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::dataplane::{AttachMode, pin::DEFAULT_PIN_DIR};

/// XDP edge flood guard: per-source-prefix token buckets enforced at the driver.
#[derive(Debug, Parser)]
#[command(name = "limiter", version = crate::LONG_VERSION, about)]
pub struct Cli {
    /// Print JSON instead of tables (for scripts).
    #[arg(long, short = 'j', global = true, help_heading = "Global options")]
    pub json: bool,
    /// The daemon's control socket [default: /run/limiter/limiter.sock;
    /// for the other verbs, if it does not exist, the one socket of a
    /// `limiter@IFACE` service in /run/limiter].
    #[arg(long, global = true, value_name = "PATH", help_heading = "Global options")]
    pub socket: Option<PathBuf>,
    /// Colour the output: `auto` where standard output is a terminal and
    /// `NO_COLOR` is unset; never with `-j`.
    #[arg(
        long,
        global = true,
        value_enum,
        value_name = "WHEN",
        default_value = "auto",
        help_heading = "Global options"
    )]
    pub color: ColorChoice,
    #[command(subcommand)]
    pub command: Command,
}

/// `--color`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ColorChoice {
    /// When standard output is a terminal, `NO_COLOR` is unset or empty
    /// and `TERM` is not `dumb`.
    #[default]
    Auto,
    Always,
    Never,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Load the XDP program, attach it to an interface and enforce the policy
    /// until SIGINT or SIGTERM; SIGHUP re-reads the policy.
    #[command(
        after_help = "Examples:\n  limiter run --iface eth0\n  limiter run --iface eth0 --pin --policy /etc/limiter/limiter.toml\n  limiter run --iface eth0 --shadow          # count would-be drops, drop nothing"
    )]
    Run(Box<RunArgs>),
    /// Detach a pinned limiter and remove its pins (maps too, unless
    /// --keep-maps).
    #[command(
        after_help = "Examples:\n  limiter unload --pin-dir /sys/fs/bpf/limiter-eth0\n  limiter unload --keep-maps"
    )]
    Unload(UnloadArgs),
    /// The running daemon: interface, policy version, counters, last reload.
    #[command(
        after_help = "Examples:\n  limiter status\n  limiter status --watch 5\n  limiter status -j | jq .last_reload"
    )]
    Status {
        /// Ask again every SECS seconds (2 if not given) until interrupted.
        #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2", value_parser = watch_secs)]
        watch: Option<f64>,
    },
    /// Packets and bytes per reason with its action (pass, drop,
    /// shadow_drop: the metrics' words), and per rule class; reasons that
    /// counted nothing are left out unless --all.
    #[command(after_help = "Examples:\n  limiter stats\n  limiter stats --all\n  limiter stats --watch")]
    Stats {
        /// Every reason, those at zero too.
        #[arg(long)]
        all: bool,
        /// Ask again every SECS seconds (2 if not given) until interrupted.
        #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "2", value_parser = watch_secs)]
        watch: Option<f64>,
    },
    /// Check, apply or show policies.
    #[command(subcommand)]
    Policy(PolicyCommand),
    /// Per-prefix overrides of the running policy (each change is a new
    /// policy version; a daemon run with `--pin` puts them back when it
    /// restarts, otherwise they last until it stops).
    #[command(subcommand)]
    Prefix(PrefixCommand),
    /// The fleet sync of window quotas (`[fleet]` in the policy).
    #[command(subcommand)]
    Fleet(FleetCommand),
    /// Rules announced to the transit over BGP (`[upstream]` in the
    /// policy): list, announce, blackhole, withdraw.
    #[command(subcommand)]
    Upstream(UpstreamCommand),
    /// The backends of the tunnels forwarded at the driver (`[[tunnel]]`
    /// in the policy): list, drain, undrain.
    #[command(subcommand)]
    Backend(BackendCommand),
    /// Live view: pass and drop rates with sparklines, and the prefixes
    /// with the most drops over the last 10 s (sampled; bounded memory).
    #[command(after_help = "Examples:\n  limiter top\n  limiter top --once -n 20\n  limiter top --once -j")]
    Top {
        /// Print once and exit (with --json: one JSON document).
        #[arg(long)]
        once: bool,
        /// How many prefixes to show.
        #[arg(short = 'n', long, default_value_t = 10, value_parser = clap::value_parser!(u16).range(1..=100))]
        count: u16,
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0)]
        interval: f64,
    },
    /// Why a packet from an address would pass or drop now: the verdict,
    /// the layer that gives it, and every layer the data plane asks on
    /// the way, in its order (class, SYN cookies, override, group, deny
    /// set, bucket or window, upstream), each with what holds the address.
    #[command(after_help = "Examples:
  limiter explain 198.18.7.9
  limiter explain 198.18.7.9 --protocol tcp --port 443 --syn
  limiter explain 2001:db8::1 -j | jq .decided_by")]
    Explain {
        /// The packet's source address.
        addr: std::net::IpAddr,
        /// Its IP protocol.
        #[arg(long, value_enum, default_value_t = crate::policy::Protocol::Any)]
        protocol: crate::policy::Protocol,
        /// Its destination port (TCP or UDP).
        #[arg(long, value_name = "PORT")]
        port: Option<u16>,
        /// A TCP SYN without ACK (a new connection).
        #[arg(long)]
        syn: bool,
    },
    /// The audit trail: every change of the policy state (the operator's,
    /// a reload, a feed's or a source's version, CrowdSec, a penalty,
    /// escalation, expiry), who made it (a control client by uid and pid)
    /// and how it went, oldest first.
    #[command(after_help = "Examples:\n  limiter history\n  limiter history --since 1h\n  limiter history -n 500 -j")]
    History {
        /// Only the changes of the last DURATION (`90s`, `10m`, `1h`).
        #[arg(long, value_name = "DURATION", value_parser = since)]
        since: Option<std::time::Duration>,
        /// At most this many, the newest.
        #[arg(short = 'n', long, default_value_t = 50, value_parser = clap::value_parser!(u16).range(1..=2000))]
        count: u16,
    },
    /// The attacks the guard saw (refused above `[attacks]`'s thresholds
    /// for its sustain time): when, how big, from where, why, and what it
    /// did meanwhile; the one going on included.
    #[command(after_help = "Examples:\n  limiter attacks\n  limiter attacks show 3\n  limiter attacks show 3 -j")]
    Attacks {
        #[command(subcommand)]
        show: Option<AttacksCommand>,
        /// At most this many, the newest.
        #[arg(short = 'n', long, default_value_t = 20, value_parser = clap::value_parser!(u16).range(1..=500))]
        count: u16,
    },
    /// Copy the frames the data plane drops, live, as it drops them (or,
    /// with `--passed`, a random sample of those it passes): to a pcapng
    /// file (each frame's verdict, reason and class in its comment; `-w
    /// -` for standard output), or one line each. Ends after `-c` frames
    /// or at Ctrl-C.
    #[command(
        after_help = "Examples:\n  limiter capture -c 10\n  limiter capture -w drops.pcapng --reason rate_limited\n  limiter capture -w - --prefix 198.18.7.0/24 | tcpdump -n -r -\n  limiter capture --passed --prefix 198.18.7.0/24 -c 100"
    )]
    Capture {
        /// Write pcapng to FILE (`-`: standard output) instead of lines.
        #[arg(short = 'w', long = "write", value_name = "FILE")]
        write: Option<PathBuf>,
        /// Only frames dropped (or, with `--passed`, passed) for this
        /// reason (`rate_limited`, `denied`, ...; `admitted`, ...).
        #[arg(long)]
        reason: Option<String>,
        /// Only frames from sources inside this network.
        #[arg(long, value_name = "CIDR")]
        prefix: Option<ipnet::IpNet>,
        /// Only frames of this class (its name in the policy).
        #[arg(long)]
        class: Option<String>,
        /// The frames passed instead of those dropped: a random sample,
        /// at most 10,000 a second (each frame's comment says `sample=1/N`
        /// when it stands for N).
        #[arg(long)]
        passed: bool,
        /// Stop after this many frames.
        #[arg(short = 'c', long = "count", value_parser = clap::value_parser!(u64).range(1..))]
        count: Option<u64>,
    },
    /// Run the real program offline over a capture (with the capture's own
    /// timestamps) and print verdict totals per source prefix: try a policy
    /// on recorded traffic before deploying it.
    #[command(
        after_help = "Examples:\n  limiter replay --pcap capture.pcap --policy my.toml\n  limiter replay --pcap capture.pcap -j"
    )]
    Replay {
        /// A pcap or pcapng file (Ethernet), `limiter capture`'s and the
        /// attacks' included.
        #[arg(long, value_name = "FILE")]
        pcap: PathBuf,
        /// Policy to try [default: /etc/limiter/limiter.toml if it exists,
        /// else the built-in policy].
        #[arg(long, value_name = "FILE")]
        policy: Option<PathBuf>,
    },
    /// Print a shell completion script.
    #[command(after_help = "Examples:\n  limiter completions bash > /etc/bash_completion.d/limiter")]
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the man page limiter(8) (roff), or with --dir write it and
    /// one page per verb (limiter-run(8), limiter-policy-check(8), ...).
    #[command(
        after_help = "Examples:\n  limiter man | man -l -\n  limiter man --policy | man -l -\n  limiter man --dir /usr/local/share/man/man8"
    )]
    Man {
        /// Write every page into this directory instead.
        #[arg(long, value_name = "DIR", conflicts_with = "policy")]
        dir: Option<PathBuf>,
        /// Print limiter.toml(5), the policy file's page, instead.
        #[arg(long)]
        policy: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum PolicyCommand {
    /// Validate a policy file offline; exit non-zero with file, line and
    /// field on the first error.
    #[command(
        after_help = "Examples:\n  limiter policy check /etc/limiter/limiter.toml\n  limiter policy check my.toml -j"
    )]
    Check {
        /// The policy file.
        file: PathBuf,
    },
    /// Apply FILE to the running daemon as the next policy version, all or
    /// nothing; without FILE the daemon re-reads its own policy source.
    #[command(
        after_help = "Examples:\n  limiter policy apply my.toml\n  limiter policy apply                 # re-read the daemon's own file"
    )]
    Apply {
        /// The policy file.
        file: Option<PathBuf>,
        /// Apply it even if it lifts most of the running policy's
        /// overrides or cuts a rate more than 10x (a truncated file is
        /// refused otherwise).
        #[arg(long)]
        force: bool,
    },
    /// Print the policy the daemon enforces, as a policy file.
    #[command(after_help = "Examples:\n  limiter policy show\n  limiter policy show > running.toml")]
    Show,
}

#[derive(Debug, Subcommand)]
pub enum FleetCommand {
    /// The store, the nodes seen, the last sync and its lag, errors.
    #[command(after_help = "Examples:\n  limiter fleet status\n  limiter fleet status -j")]
    Status,
}

#[derive(Debug, Subcommand)]
pub enum AttacksCommand {
    /// One attack's whole record.
    Show { id: u64 },
}

#[derive(Debug, Subcommand)]
pub enum BackendCommand {
    /// Each tunnel's backends: state, weight, what was forwarded.
    #[command(after_help = "Examples:\n  limiter backend list\n  limiter backend list -j")]
    List,
    /// Send no new flows to a backend; its flows stay on it.
    #[command(after_help = "Examples:\n  limiter backend drain 198.18.2.3")]
    Drain {
        /// The backend's address, in every tunnel that has it.
        address: std::net::IpAddr,
    },
    /// Give a drained backend new flows again.
    #[command(after_help = "Examples:\n  limiter backend undrain 198.18.2.3")]
    Undrain { address: std::net::IpAddr },
}

#[derive(Debug, Subcommand)]
pub enum UpstreamCommand {
    /// The speaker, its sessions, and each rule wanted.
    #[command(after_help = "Examples:\n  limiter upstream list\n  limiter upstream list -j")]
    List,
    /// Ask the transit to drop (or rate-limit) traffic from a source
    /// network: a FlowSpec rule.
    #[command(
        after_help = "Examples:\n  limiter upstream announce 198.18.7.0/24 --ttl 10m\n  limiter upstream announce 198.18.7.0/24 --rate-limit 125000 --protocol udp --destination 198.19.0.10/32"
    )]
    Announce {
        /// The source network, e.g. 198.18.80.0/24.
        cidr: ipnet::IpNet,
        /// Match this destination too.
        #[arg(long, value_name = "CIDR")]
        destination: Option<ipnet::IpNet>,
        /// Match this IP protocol too (tcp, udp, icmp, or a number).
        #[arg(long, value_parser = protocol)]
        protocol: Option<u8>,
        /// Rate-limit to this many bytes a second instead of discarding.
        #[arg(long, value_name = "BYTES")]
        rate_limit: Option<u64>,
        /// Withdraw after this long [default: the policy's upstream.ttl].
        #[arg(long, value_name = "DURATION", value_parser = ttl)]
        ttl: Option<u64>,
    },
    /// Ask the transit to drop everything sent to one of this host's
    /// destinations (RFC 7999 BLACKHOLE; needs `upstream.rtbh = true`):
    /// the attack's aim, reached for it, so never automatic.
    #[command(after_help = "Examples:\n  limiter upstream blackhole 198.19.0.10/32 --ttl 5m")]
    Blackhole {
        /// The destination, e.g. 198.18.90.1/32.
        cidr: ipnet::IpNet,
        /// Withdraw after this long [default: the policy's upstream.ttl].
        #[arg(long, value_name = "DURATION", value_parser = ttl)]
        ttl: Option<u64>,
    },
    /// Withdraw the rules of a network, or every rule.
    #[command(after_help = "Examples:\n  limiter upstream withdraw 198.18.7.0/24\n  limiter upstream withdraw --all")]
    Withdraw {
        /// The network.
        #[arg(required_unless_present = "all", conflicts_with = "all")]
        cidr: Option<ipnet::IpNet>,
        /// Every rule, whoever asked for it.
        #[arg(long)]
        all: bool,
    },
}

/// An IP protocol by name or number.
fn protocol(s: &str) -> Result<u8, String> {
    crate::upstream::rule::protocol(s).ok_or_else(|| format!("{s:?} is not tcp, udp, icmp, icmp6 or a number 0-255"))
}

#[derive(Debug, Subcommand)]
pub enum PrefixCommand {
    /// List the overrides in force.
    #[command(after_help = "Examples:\n  limiter prefix list\n  limiter prefix list -j")]
    List,
    /// A prefix's window quotas now: counted here, by the rest of the
    /// fleet, and what is left in the current window.
    #[command(after_help = "Examples:\n  limiter prefix show 198.18.5.7\n  limiter prefix show 2001:2:0:100::/56")]
    Show {
        /// An address or its bucket prefix, e.g. 198.18.5.7 or 198.18.5.0/24.
        #[arg(value_parser = address_or_net)]
        cidr: ipnet::IpNet,
    },
    /// Give a prefix its own rate and burst.
    #[command(
        after_help = "Examples:\n  limiter prefix set 198.18.0.0/16 --rate 50 --burst 100\n  limiter prefix set 198.18.7.0/24 --rate 10 --burst 20 --ttl 1h"
    )]
    Set {
        /// The prefix, e.g. 198.18.0.0/16 (no host bits; an address is its
        /// /32 or /128).
        #[arg(value_parser = address_or_net)]
        cidr: ipnet::IpNet,
        /// Units per second.
        #[arg(long)]
        rate: u64,
        /// Bucket depth in units.
        #[arg(long)]
        burst: u64,
        /// Expire after this long (e.g. 10m, 1h; survives a restart with
        /// --pin) [default: never].
        #[arg(long, value_name = "DURATION", value_parser = ttl)]
        ttl: Option<u64>,
        /// Why, in a few words (at most 200 characters): shown by `prefix
        /// list`, `explain` and `limiter history`.
        #[arg(long, value_name = "TEXT", value_parser = reason)]
        reason: Option<String>,
    },
    /// Never limit a prefix.
    #[command(
        after_help = "Examples:\n  limiter prefix allow 198.18.5.0/24\n  limiter prefix allow 2001:2:0:100::/56 --ttl 1d"
    )]
    Allow {
        /// The prefix (an address is its /32 or /128).
        #[arg(value_parser = address_or_net)]
        cidr: ipnet::IpNet,
        /// Expire after this long [default: never].
        #[arg(long, value_name = "DURATION", value_parser = ttl)]
        ttl: Option<u64>,
        /// Why, in a few words (at most 200 characters): shown by `prefix
        /// list`, `explain` and `limiter history`.
        #[arg(long, value_name = "TEXT", value_parser = reason)]
        reason: Option<String>,
    },
    /// Always drop a prefix.
    #[command(
        after_help = "Examples:\n  limiter prefix deny 198.18.7.0/24 --ttl 10m --reason \"INC-4711: credential stuffing\"\n  limiter prefix deny 198.18.7.0/24 --upstream"
    )]
    Deny {
        /// The prefix (an address is its /32 or /128).
        #[arg(value_parser = address_or_net)]
        cidr: ipnet::IpNet,
        /// Expire after this long [default: never; with --upstream, the
        /// upstream rule lasts the policy's `upstream.ttl`].
        #[arg(long, value_name = "DURATION", value_parser = ttl)]
        ttl: Option<u64>,
        /// Ask the transit to drop it too: a FlowSpec rule on the source,
        /// announced by the policy's `[upstream]` speaker.
        #[arg(long)]
        upstream: bool,
        /// Why, in a few words (at most 200 characters): shown by `prefix
        /// list`, `explain` and `limiter history`.
        #[arg(long, value_name = "TEXT", value_parser = reason)]
        reason: Option<String>,
    },
    /// Deny (or allow) every prefix of a file as one version, all or
    /// nothing: one CIDR per line, `#` comments and blank lines allowed
    /// (as FireHOL netsets are written); `-` reads standard input.
    #[command(
        after_help = "Examples:\n  limiter prefix load --deny blocklist.netset --ttl 1h\n  curl -s https://example.net/list.netset | limiter prefix load --deny -"
    )]
    Load {
        /// The file of prefixes to deny.
        #[arg(long, value_name = "FILE", conflicts_with = "allow", required_unless_present = "allow")]
        deny: Option<PathBuf>,
        /// The file of prefixes to allow.
        #[arg(long, value_name = "FILE")]
        allow: Option<PathBuf>,
        /// Expire after this long [default: never].
        #[arg(long, value_name = "DURATION", value_parser = ttl)]
        ttl: Option<u64>,
    },
    /// Remove a prefix's override, or every entry of a layer as one
    /// change (`--origin`), or of every run-time layer (`--all --yes`).
    #[command(
        after_help = "Examples:\n  limiter prefix unset 198.18.7.0/24\n  limiter prefix unset --origin feedback\n  limiter prefix unset --all --yes"
    )]
    Unset {
        /// The prefix (an address is its /32 or /128).
        #[arg(value_parser = address_or_net, required_unless_present_any = ["origin", "all"], conflicts_with_all = ["origin", "all"])]
        cidr: Option<ipnet::IpNet>,
        /// Every entry of this layer: `runtime` (the operator's), `feedback`
        /// (the tenant layer's penalties) or `escalation`.
        #[arg(long, value_name = "NAME", value_parser = origin, conflicts_with = "all")]
        origin: Option<crate::origin::Origin>,
        /// Every entry of the operator, feedback and escalation (with --yes).
        #[arg(long, requires = "yes")]
        all: bool,
        /// Confirm --all.
        #[arg(long)]
        yes: bool,
    },
}

/// Arguments of `limiter unload`.
#[derive(Debug, Args)]
pub struct UnloadArgs {
    /// Unload even while a daemon serves the pin directory (it will put
    /// back what is removed under it: stop it first to remove protection).
    #[arg(long)]
    pub force: bool,
    /// Keep the pinned maps (buckets, counters, config) for a later `run --pin`.
    #[arg(long)]
    pub keep_maps: bool,
    /// Directory on bpffs holding the pins [default: /sys/fs/bpf/limiter
    /// if anything is pinned there, else the one pin directory of a
    /// `limiter@IFACE` service, /sys/fs/bpf/limiter-IFACE].
    #[arg(long, value_name = "DIR")]
    pub pin_dir: Option<std::path::PathBuf>,
}

/// Arguments of `limiter run`; unset limits take the built-in default policy.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Interface to protect.
    #[arg(long, short = 'i', value_name = "IFACE")]
    pub iface: String,
    /// XDP attach mode.
    #[arg(long, value_enum, default_value_t = AttachMode::Native)]
    pub mode: AttachMode,
    /// How to share the interface: `exclusive` (its only XDP program),
    /// `libxdp` (a component of its libxdp dispatcher, made if none), or
    /// `auto` (join a dispatcher if it has one, else exclusive).
    #[arg(long, value_enum, default_value_t = crate::dataplane::chain::Attach::Exclusive)]
    pub attach: crate::dataplane::chain::Attach,
    /// Run priority under a libxdp dispatcher (lower runs first; the
    /// default, 10, is xdp-filter's too): where the limiter runs among its
    /// neighbours. Only with --attach libxdp or auto.
    #[arg(long, value_name = "N", default_value_t = limiter_common::RUN_PRIORITY_DEFAULT,
          value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub priority: u32,
    /// Policy file [default: /etc/limiter/limiter.toml if it exists, else
    /// the built-in policy]. Re-read on SIGHUP. Flags below override it.
    #[arg(long, value_name = "FILE")]
    pub policy: Option<PathBuf>,
    /// The limit flags, laid over the policy file.
    #[command(flatten)]
    pub overlay: crate::policy::Overlay,
    /// Pin program, link and maps under --pin-dir: enforcement survives the
    /// daemon stopping or crashing, and a restart re-adopts the pinned
    /// state (buckets kept) and swaps its program in atomically.
    #[arg(long)]
    pub pin: bool,
    /// Directory on bpffs for the pins.
    #[arg(long, value_name = "DIR", default_value = DEFAULT_PIN_DIR, requires = "pin")]
    pub pin_dir: std::path::PathBuf,
    /// The audit trail's history file: every change, who made it and how
    /// it went, one JSON line each (rotated past 4 MiB to FILE.1), read by
    /// `limiter history`; without it the trail is the log and memory.
    #[arg(long, value_name = "FILE")]
    pub history: Option<std::path::PathBuf>,
    /// The attacks file: each attack's record, one JSON line at its start
    /// and one at its end (rotated past 8 MiB to FILE.1), read by `limiter
    /// attacks`; without it the records are the log and memory.
    #[arg(long, value_name = "FILE")]
    pub attacks: Option<std::path::PathBuf>,
    /// Log lines as JSON objects instead of text.
    #[arg(long)]
    pub log_json: bool,
    /// Address for Prometheus `/metrics` (HTTP), or `off`.
    #[arg(long, value_name = "ADDR", default_value = crate::metrics::DEFAULT_LISTEN)]
    pub metrics: String,
    /// Group (name or gid) whose members may use the control socket
    /// besides root.
    #[arg(long, value_name = "GROUP")]
    pub socket_group: Option<String>,
    /// Seconds between status lines (0 = none).
    #[arg(long, value_name = "SECS", default_value_t = 5.0)]
    pub status_interval: f64,
}

/// A `--ttl` that is not one.
#[derive(Debug, thiserror::Error)]
pub enum TtlError {
    #[error(transparent)]
    Duration(#[from] crate::policy::DurationError),
    #[error("a ttl must be at least 1s")]
    Zero,
}

/// An argument that is neither an address nor a CIDR.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not an address or a CIDR")]
pub struct NotANet(String);

/// An address (as its host network) or a CIDR.
fn address_or_net(s: &str) -> Result<ipnet::IpNet, NotANet> {
    s.parse::<ipnet::IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| NotANet(s.to_owned()))
}

/// A `--watch` period: 0.1 to 3600 seconds.
/// An `--origin` of `prefix unset`.
fn origin(s: &str) -> Result<crate::origin::Origin, String> {
    use crate::origin::Origin;
    Origin::parse(s)
        .filter(|o| matches!(o, Origin::Operator | Origin::Feedback | Origin::Escalation))
        .ok_or_else(|| format!("{s:?} is not runtime, feedback or escalation"))
}

/// Most characters of a `--reason`.
pub const MAX_REASON: usize = 200;

/// A `--reason`: at most [`MAX_REASON`] characters, no control
/// characters (it reaches log lines and terminals).
fn reason(s: &str) -> Result<String, String> {
    if s.chars().count() > MAX_REASON {
        return Err(format!("at most {MAX_REASON} characters"));
    }
    if s.chars().any(char::is_control) {
        return Err("no control characters (newlines, escapes)".into());
    }
    Ok(s.to_owned())
}

/// A `--since` duration.
fn since(s: &str) -> Result<std::time::Duration, String> {
    crate::policy::parse_duration(s).map_err(|e| e.to_string())
}

fn watch_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.1..=3600.0).contains(&v) => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds from 0.1 to 3600")),
    }
}

/// A `--ttl` in whole seconds, at least one.
fn ttl(s: &str) -> Result<u64, TtlError> {
    let d = crate::policy::parse_duration(s)?;
    if d.as_secs() == 0 {
        return Err(TtlError::Zero);
    }
    Ok(d.as_secs())
}

/// clap's message as one line: its first paragraph (a list of missing
/// arguments follows the line that announces it), without `error: `.
fn one_line(text: &str) -> String {
    let para: Vec<&str> =
        text.lines().map(str::trim).skip_while(|l| l.is_empty()).take_while(|l| !l.is_empty()).collect();
    if para.is_empty() { "invalid arguments".into() } else { para.join(" ").trim_start_matches("error: ").to_owned() }
}

/// Parse arguments; on a usage error print one line (a JSON object under
/// `-j`, see [`say_error`]) and exit with status 2.
#[must_use]
pub fn parse() -> Cli {
    match Cli::try_parse() {
        Ok(c) => c,
        Err(e) if !e.use_stderr() => e.exit(), // --help, --version
        Err(e) => {
            let json = std::env::args().skip(1).take_while(|a| a != "--").any(|a| a == "-j" || a == "--json");
            say_error(&format!("{} (see --help)", one_line(&e.to_string())), json);
            std::process::exit(2);
        }
    }
}

/// Say a verb's error: `limiter: MESSAGE` on standard error, or with
/// `json` `{"error": "MESSAGE"}` on standard output, where a script reads
/// the answer (the exit status says it failed either way).
pub fn say_error(message: &str, json: bool) {
    if json {
        println!("{}", serde_json::json!({ "error": message }));
    } else {
        eprintln!("limiter: {message}");
    }
}
