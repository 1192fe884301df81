//! A set of real `steward server` replica processes on one database, each with its own data
//! dir and loopback port, for the replica tests (and the replica benchmark's twin).

use std::collections::BTreeMap;
use std::process::Child;
use std::time::{Duration, Instant};

use steward::client::Client;
use steward::store::replicas::Replicas;

use crate::support::{free_port, new_database, spawn_server_with, wait_healthy};

pub const ADMIN: &str = "stw_test_admin_secret_for_replicas";

pub struct Replica {
    pub child: Child,
    pub url: String,
    pub data: tempfile::TempDir,
}

pub struct ReplicaSet {
    pub db: String,
    pub replicas: Vec<Option<Replica>>,
    /// `--lease-time`, `--heartbeat` given to every replica
    pub lease_time: f64,
    pub heartbeat: f64,
    /// replicas stopped with SIGSTOP (they answer nothing until SIGCONT)
    pub paused: std::collections::HashSet<usize>,
}

impl ReplicaSet {
    /// `n` replicas on a new database.
    pub async fn start(n: usize, lease_time: f64, heartbeat: f64) -> ReplicaSet {
        let mut set = ReplicaSet {
            db: new_database(),
            replicas: Vec::new(),
            lease_time,
            heartbeat,
            paused: Default::default(),
        };
        for _ in 0..n {
            set.add().await;
        }
        set
    }

    /// Start one more replica; its index.
    pub async fn add(&mut self) -> usize {
        let data = tempfile::tempdir_in(crate::support::scratch()).unwrap();
        let port = free_port();
        let child = self.spawn(port, data.path());
        let url = format!("http://127.0.0.1:{port}");
        wait_healthy(&url).await;
        self.replicas.push(Some(Replica { child, url, data }));
        self.replicas.len() - 1
    }

    fn spawn(&self, port: u16, data: &std::path::Path) -> Child {
        let advertise = format!("http://127.0.0.1:{port}");
        let lease = self.lease_time.to_string();
        let beat = self.heartbeat.to_string();
        spawn_server_with(
            &self.db,
            port,
            ADMIN,
            data,
            &[
                "--advertise-url".as_ref(),
                advertise.as_ref(),
                "--lease-time".as_ref(),
                lease.as_ref(),
                "--heartbeat".as_ref(),
                beat.as_ref(),
            ],
        )
    }

    pub fn url(&self, i: usize) -> &str {
        &self.replicas[i].as_ref().expect("replica running").url
    }

    pub fn client(&self, i: usize) -> Client {
        Client::new(self.url(i), Some(ADMIN.into()))
    }

    /// A client of any running replica.
    pub fn any_client(&self) -> Client {
        let i = self.running().next().expect("a running replica");
        self.client(i)
    }

    pub fn running(&self) -> impl Iterator<Item = usize> + '_ {
        self.replicas
            .iter()
            .enumerate()
            .filter(|(i, r)| r.is_some() && !self.paused.contains(i))
            .map(|(i, _)| i)
    }

    pub fn pid(&self, i: usize) -> u32 {
        self.replicas[i].as_ref().expect("running").child.id()
    }

    /// The replica id a running replica registered under (from its /health).
    pub async fn id_of(&self, i: usize) -> String {
        let h = self.client(i).health().await.unwrap();
        h["replica"]["id"].as_str().unwrap().to_string()
    }

    /// Index of the replica with this id.
    pub async fn index_of(&self, id: &str) -> Option<usize> {
        for i in self.running().collect::<Vec<_>>() {
            if self.id_of(i).await == id {
                return Some(i);
            }
        }
        None
    }

    /// SIGSTOP (`pause = true`) or SIGCONT.
    pub fn pause(&mut self, i: usize, pause: bool) {
        if pause {
            self.signal(i, "-STOP");
            self.paused.insert(i);
        } else {
            self.signal(i, "-CONT");
            self.paused.remove(&i);
        }
    }

    pub fn signal(&self, i: usize, sig: &str) {
        let ok = std::process::Command::new("kill")
            .args([sig, &self.pid(i).to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    }

    /// kill -9 and forget it.
    pub fn kill9(&mut self, i: usize) -> Replica {
        self.signal(i, "-9");
        let mut r = self.replicas[i].take().unwrap();
        r.child.wait().unwrap();
        r
    }

    /// SIGTERM and wait until it exited.
    pub fn terminate(&mut self, i: usize) -> Replica {
        self.signal(i, "-TERM");
        let mut r = self.replicas[i].take().unwrap();
        r.child.wait().unwrap();
        r
    }

    pub async fn status(&self) -> Replicas {
        self.any_client().replicas().await.unwrap()
    }

    /// replica id -> environments it owns (live replicas only), from the API.
    pub async fn ownership(&self) -> BTreeMap<String, Vec<String>> {
        let s = self.status().await;
        s.replicas
            .iter()
            .filter(|r| r.live)
            .map(|r| {
                (
                    r.replica.id.clone(),
                    r.environments
                        .iter()
                        .map(|e| e.environment_id.to_string())
                        .collect(),
                )
            })
            .collect()
    }

    /// Wait until every one of `envs` is owned by a live replica, the live replicas are
    /// `replicas` many and their shares differ by one at most; returns the ownership and how long it took.
    pub async fn settled(
        &self,
        envs: &[String],
        replicas: usize,
        secs: u64,
    ) -> (BTreeMap<String, Vec<String>>, Duration) {
        let started = Instant::now();
        loop {
            let own = self.ownership().await;
            let owned: usize = own.values().map(Vec::len).sum();
            let all = envs.iter().all(|e| own.values().any(|v| v.contains(e)));
            let most = own.values().map(Vec::len).max().unwrap_or(0);
            let least = own.values().map(Vec::len).min().unwrap_or(0);
            if own.len() == replicas && all && owned == envs.len() && most - least <= 1 {
                return (own, started.elapsed());
            }
            if started.elapsed() > Duration::from_secs(secs) {
                panic!(
                    "ownership did not settle over {replicas} replicas in {secs}s: {own:#?}\n{}",
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The owner's id of `env`, waiting until it has one that is not `not`.
    pub async fn owner_of(&self, env: &str, not: Option<&str>, secs: u64) -> (String, Duration) {
        let started = Instant::now();
        loop {
            let own = self.ownership().await;
            if let Some((id, _)) = own
                .iter()
                .find(|(id, v)| v.iter().any(|e| e == env) && Some(id.as_str()) != not)
            {
                return (id.clone(), started.elapsed());
            }
            if started.elapsed() > Duration::from_secs(secs) {
                panic!(
                    "no new owner of {env} in {secs}s: {own:#?}\n{}",
                    self.logs()
                );
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// The replicas' logs, for a failing test.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for r in self.replicas.iter().flatten() {
            let log = std::fs::read_to_string(r.data.path().join("server.log")).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect();
            out.push_str(&format!("--- replica on {} ---\n", r.url));
            for l in tail.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for ReplicaSet {
    fn drop(&mut self) {
        for r in self.replicas.iter_mut().flatten() {
            let _ = r.child.kill();
            let _ = r.child.wait();
        }
    }
}
