//! Streaming standbys of a private cluster, for testing PostgreSQL failover on one machine
//! (and for trying it by hand): a base backup of a running cluster started as a hot
//! standby on its own socket, synchronous replication so that a committed transaction is
//! on the standby before the primary answers, promotion, and an immediate stop (a crash).

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use super::{ClusterError, PgCluster, io_err};

impl PgCluster {
    /// Let local replication connections in (password logins, on the socket only) and
    /// reload the configuration.
    pub fn allow_local_replication(&self) -> Result<(), ClusterError> {
        let hba = self.data_dir().join("pg_hba.conf");
        let text = std::fs::read_to_string(&hba).map_err(io_err(&hba))?;
        if !text.contains("local   replication") {
            std::fs::write(
                &hba,
                format!("{text}local   replication  all   scram-sha-256\n"),
            )
            .map_err(io_err(&hba))?;
        }
        self.reload()
    }

    /// Re-read the configuration files.
    pub fn reload(&self) -> Result<(), ClusterError> {
        let mut c = self.command("pg_ctl");
        c.arg("reload").arg("-D").arg(self.data_dir());
        c.stdout(Stdio::null());
        self.run("pg_ctl reload", c).map(|_| ())
    }

    /// A streaming standby of this (running) cluster under `root`: a base backup with the
    /// replication settings written (`pg_basebackup -R`), the same password, not started.
    pub fn make_standby(&self, root: &Path) -> Result<PgCluster, ClusterError> {
        let standby = PgCluster::new(root)?;
        standby.prepare()?;
        let secret = std::fs::read(self.secret_file()).map_err(io_err(&self.secret_file()))?;
        std::fs::write(standby.secret_file(), secret).map_err(io_err(&standby.secret_file()))?;
        standby.chown_tree(&standby.secret_file())?;
        let mut c = self.client_command("pg_basebackup")?;
        c.arg("-D")
            .arg(standby.data_dir())
            .args([
                "-R", "-X", "stream", "-c", "fast", "-U", "postgres", "-w", "-h",
            ])
            .arg(self.socket_dir())
            .args(["-p", &self.port.to_string()]);
        self.run("pg_basebackup", c)?;
        Ok(standby)
    }

    /// Start a standby made by [`PgCluster::make_standby`]: ready once it accepts read-only
    /// connections.
    pub fn start_standby(&self) -> Result<(), ClusterError> {
        self.prepare()?;
        self.start_server(true)
    }

    /// Turn a running standby into a primary and wait until it takes writes.
    pub fn promote(&self) -> Result<(), ClusterError> {
        let mut c = self.command("pg_ctl");
        c.arg("promote")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-w", "-t", "60"]);
        c.stdout(Stdio::null());
        self.run("pg_ctl promote", c).map(|_| ())
    }

    /// Stop at once, as a crash would (no shutdown checkpoint).
    pub fn stop_immediate(&self) -> Result<(), ClusterError> {
        let mut c = self.command("pg_ctl");
        c.arg("stop")
            .arg("-D")
            .arg(self.data_dir())
            .args(["-m", "immediate", "-w", "-t", "60"]);
        c.stdout(Stdio::null());
        self.run("pg_ctl stop", c).map(|_| ())
    }

    /// Make commits wait until a standby has them (`synchronous_standby_names = '*'`) and
    /// wait until one streams synchronously.
    pub fn require_synchronous_standby(&self) -> Result<(), ClusterError> {
        self.psql("ALTER SYSTEM SET synchronous_standby_names = '*'")?;
        self.reload()?;
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(60) {
            let state = self.psql("SELECT sync_state FROM pg_stat_replication")?;
            if state.lines().any(|l| l.trim() == "sync") {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Err(ClusterError::Command {
            what: "waiting for a synchronous standby".into(),
            detail: "no standby streams synchronously after 60 s".into(),
        })
    }

    fn psql(&self, sql: &str) -> Result<String, ClusterError> {
        let mut c = self.client_command("psql")?;
        c.args([
            "-X", "-w", "-q", "-A", "-t", "-d", "postgres", "-U", "postgres", "-h",
        ])
        .arg(self.socket_dir())
        .args(["-p", &self.port.to_string(), "-c", sql]);
        self.run("psql", c)
    }
}
