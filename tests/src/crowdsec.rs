//! A real CrowdSec Local API for the tests: Debian's `crowdsec` and
//! `cscli` (extracted by `cargo xtask setup`, never installed), with a
//! config and a sqlite database of its own in a temporary directory, on a
//! private loopback port, without the agent or the central API
//! (`crowdsec -no-cs -no-capi`).

use std::{
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use crate::kernel::TempDir;

fn tool(name: &str) -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/tools/crowdsec/usr/bin").join(name);
    assert!(p.exists(), "{} is missing: run `cargo xtask setup`", p.display());
    p
}

/// A running LAPI; stopped and its directory removed on drop.
pub struct Lapi {
    dir: TempDir,
    child: Option<Child>,
    pub port: u16,
    /// The network namespace it listens in (`None`: this one).
    ns: Option<String>,
}

impl Lapi {
    /// Configure, register the local machine, and start the LAPI.
    #[must_use]
    pub fn start(tag: &str) -> Self {
        Self::start_in(tag, None)
    }

    /// [`Self::start`] in the network namespace `ns` (where a daemon under
    /// test runs: a loopback port is only reachable from its own
    /// namespace); `cscli` runs there too.
    #[must_use]
    pub fn start_in(tag: &str, ns: Option<&str>) -> Self {
        let dir = TempDir::new(&format!("crowdsec-{tag}"));
        let port = TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
        let r = dir.0.display().to_string();
        for d in ["data", "hub", "notifications", "plugins", "acquis.d"] {
            std::fs::create_dir_all(dir.0.join(d)).unwrap();
        }
        std::fs::write(dir.0.join("hub/.index.json"), "{}").unwrap();
        std::fs::write(dir.0.join("acquis.yaml"), "").unwrap();
        std::fs::write(dir.0.join("simulation.yaml"), "simulation: off\n").unwrap();
        std::fs::write(
            dir.0.join("profiles.yaml"),
            "name: default_ip_remediation\nfilters:\n - Alert.Remediation == true && Alert.GetScope() == \"Ip\"\ndecisions:\n - type: ban\n   duration: 4h\non_success: break\n",
        )
        .unwrap();
        std::fs::write(
            dir.0.join("config.yaml"),
            format!(
                "common:\n  daemonize: false\n  log_media: stdout\n  log_level: warning\n  working_dir: .\n\
                 config_paths:\n  config_dir: {r}/\n  data_dir: {r}/data/\n  simulation_path: {r}/simulation.yaml\n  \
                 hub_dir: {r}/hub/\n  index_path: {r}/hub/.index.json\n  notification_dir: {r}/notifications/\n  \
                 plugin_dir: {r}/plugins/\n\
                 crowdsec_service:\n  acquisition_path: {r}/acquis.yaml\n  acquisition_dir: {r}/acquis.d\n  parser_routines: 1\n\
                 cscli:\n  output: json\n  color: no\n\
                 db_config:\n  log_level: warning\n  type: sqlite\n  db_path: {r}/data/crowdsec.db\n  use_wal: true\n\
                 api:\n  client:\n    insecure_skip_verify: false\n    credentials_path: {r}/local_api_credentials.yaml\n  \
                 server:\n    log_level: warning\n    listen_uri: 127.0.0.1:{port}\n    profiles_path: {r}/profiles.yaml\n    \
                 console_path: {r}/console.yaml\n    trusted_ips:\n      - 127.0.0.1\n\
                 prometheus:\n  enabled: false\n  level: full\n  listen_addr: 127.0.0.1\n  listen_port: 0\n"
            ),
        )
        .unwrap();
        std::fs::write(dir.0.join("local_api_credentials.yaml"), format!("url: http://127.0.0.1:{port}\n")).unwrap();
        let mut lapi = Self { dir, child: None, port, ns: ns.map(str::to_owned) };
        let creds = lapi.dir.0.join("local_api_credentials.yaml").display().to_string();
        lapi.cscli(&["machines", "add", "--auto", "--force", "-f", &creds]);
        lapi.run();
        lapi
    }

    fn config(&self) -> String {
        self.dir.0.join("config.yaml").display().to_string()
    }

    /// Start the LAPI process (again, after [`Self::kill`]) and wait until
    /// it listens.
    pub fn run(&mut self) {
        let child = self
            .command("crowdsec")
            .args(["-c", &self.config(), "-no-cs", "-no-capi"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start crowdsec");
        self.child = Some(child);
        let start = Instant::now();
        while !self.listens() {
            assert!(start.elapsed() < Duration::from_secs(20), "the LAPI did not listen on {} within 20 s", self.port);
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// `tool` of the extracted package, in the LAPI's namespace.
    fn command(&self, tool_name: &str) -> Command {
        match &self.ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(tool(tool_name));
                c
            }
            None => Command::new(tool(tool_name)),
        }
    }

    /// Whether the LAPI's port takes a connection (from its namespace).
    fn listens(&self) -> bool {
        match &self.ns {
            None => TcpStream::connect(("127.0.0.1", self.port)).is_ok(),
            Some(ns) => Command::new("ip")
                .args(["netns", "exec", ns, "bash", "-c", &format!("exec 3<>/dev/tcp/127.0.0.1/{}", self.port)])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success()),
        }
    }

    /// Stop the LAPI process (its database stays).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    #[must_use]
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `cscli ARGS` against this LAPI: its standard output.
    #[expect(clippy::must_use_candidate, reason = "most calls are for what cscli does, not what it prints")]
    pub fn cscli(&self, args: &[&str]) -> String {
        let o = self.command("cscli").args(["-c", &self.config()]).args(args).output().expect("run cscli");
        assert!(o.status.success(), "cscli {args:?}: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// A new bouncer's API key.
    #[must_use]
    pub fn bouncer_key(&self, name: &str) -> String {
        self.cscli(&["bouncers", "add", name, "-o", "raw"]).trim().to_owned()
    }

    /// `cscli bouncers list`, parsed.
    #[must_use]
    pub fn bouncers(&self) -> serde_json::Value {
        serde_json::from_str(&self.cscli(&["bouncers", "list", "-o", "json"])).expect("cscli's JSON")
    }
}

impl Drop for Lapi {
    fn drop(&mut self) {
        self.kill();
    }
}
