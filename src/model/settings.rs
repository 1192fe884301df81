//! Typed, validated environment settings with defaults.
//!
//! Stored as JSON in the environment row; every read goes through [`EnvSettings`], so a
//! missing key means the default and an invalid value can never be stored (updates are
//! validated as a whole before they are written).

use serde::{Deserialize, Serialize};

use super::cron::CronSchedule;

/// How often something happens: every N seconds, or on a 5-field cron schedule (UTC, see
/// [`CronSchedule`] for the syntax); `0` disables it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "serde_json::Value", into = "String")]
pub enum Interval {
    Disabled,
    Seconds(u64),
    Cron(CronSchedule),
}

impl Interval {
    pub fn parse(s: &str) -> Result<Interval, String> {
        let t = s.trim();
        if let Ok(n) = t.parse::<i64>() {
            return Ok(if n <= 0 {
                Interval::Disabled
            } else {
                Interval::Seconds(n as u64)
            });
        }
        Ok(Interval::Cron(CronSchedule::parse(t)?))
    }
}

impl TryFrom<serde_json::Value> for Interval {
    type Error = String;
    fn try_from(v: serde_json::Value) -> Result<Interval, String> {
        match v {
            serde_json::Value::Number(n) => Interval::parse(&n.to_string()),
            serde_json::Value::String(s) => Interval::parse(&s),
            other => Err(format!(
                "expected seconds or a cron expression, got {other}"
            )),
        }
    }
}

impl From<Interval> for String {
    fn from(i: Interval) -> String {
        match i {
            Interval::Disabled => "0".into(),
            Interval::Seconds(n) => n.to_string(),
            Interval::Cron(c) => c.to_string(),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SourceKind {
    /// versions are uploaded (`steward export`)
    Push,
    /// versions come only from compiling commits of a git repository
    Git,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct RetryBackoff {
    /// First retry this many seconds after a failure.
    #[schema(minimum = 1)]
    pub initial: u64,
    /// Each further retry waits this many times longer…
    #[schema(minimum = 1)]
    pub factor: f64,
    /// …up to this many seconds.
    pub max: u64,
}

impl Default for RetryBackoff {
    fn default() -> Self {
        RetryBackoff {
            initial: 10,
            factor: 2.0,
            max: 600,
        }
    }
}

/// How long the records that grow with time are kept (pruned in the background).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct Retention {
    /// Days finished records are kept: resource actions and their logs, compile reports of
    /// versions that are gone, commit timelines, dry-runs, webhook deliveries, sent
    /// notifications.
    pub days: u32,
    /// Action records kept per resource, newest first: a resource that fails or is repaired
    /// for months costs at most this many rows.
    pub actions_per_resource: u32,
    /// Compile reports kept (besides those of versions that still exist).
    pub compile_reports: u32,
    /// Dry-runs kept, newest first.
    pub dryruns: u32,
    /// Days audit records of the environment are kept.
    pub audit_days: u32,
    /// Closed pull-request previews kept (with their runs and diffs), newest first; also
    /// none older than `days`.
    pub previews: u32,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            days: 30,
            actions_per_resource: 200,
            compile_reports: 500,
            dryruns: 50,
            audit_days: 365,
            previews: 200,
        }
    }
}

/// Pull-request previews (docs/previews.md): what a pull request to the branch this
/// environment follows would change here, compiled without the environment's secrets and
/// never stored as a version.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct PreviewSettings {
    /// Preview the pull requests of this environment's repository and branch (off by
    /// default: each one is a compile, and a comment on the pull request).
    pub enabled: bool,
    /// Also preview pull requests from forks (their code comes from anyone who can open one).
    pub forks: bool,
    /// Dry-run the resources a preview changes, with the handler code of the active version
    /// (never the pull request's), on the environment's agents. Never for forks.
    pub dry_run: bool,
}

/// How the server reaches `ssh://` agents; the defaults are what the server user's OpenSSH
/// does (`~/.ssh/known_hosts`, its default keys and agent).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SshSettings {
    /// The known_hosts file to trust instead of `~/.ssh/known_hosts` (an absolute path on
    /// the server). Host keys are always checked.
    pub known_hosts: Option<String>,
    /// The private key to use instead of OpenSSH's defaults (an absolute path on the server).
    pub identity: Option<String>,
    /// Seconds reaching a host may take before its actions fail.
    #[schema(minimum = 1)]
    pub connect_timeout: u64,
}

impl Default for SshSettings {
    fn default() -> Self {
        SshSettings {
            known_hosts: None,
            identity: None,
            connect_timeout: 5,
        }
    }
}

/// Which SSH targets and keys an environment may use: chosen by a server administrator (only
/// a global admin token may change it), because whoever picks them picks which machines the
/// server's keys log in to. Empty (the default): no `ssh://` agent connects at all.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct SshAllowed {
    /// `user@host:port` patterns an `ssh://` agent (from `agent_map` or the model's
    /// `std::AgentConfig`) may point at. `*` matches any run of characters in the user or the
    /// host, and any port as the port; a pattern without `user@` matches only targets
    /// without a user (OpenSSH's default user), one without `:port` only port 22. IPv6
    /// addresses in brackets: `deploy@[fd00::5]:22`.
    pub targets: Vec<String>,
    /// The key files `ssh.identity` may name: absolute paths, `*` matching any run of
    /// characters except `/`, a final `/**` any file below a directory (`/**`: any file). The word `default` allows no `ssh.identity` at all, which
    /// means the default keys and agent of the server's user.
    pub identities: Vec<String>,
}

impl SshAllowed {
    /// Whether `[user@]host:port` is one of [`SshAllowed::targets`].
    pub fn allows_target(&self, user: Option<&str>, host: &str, port: u16) -> bool {
        self.targets.iter().any(|p| match target_pattern(p) {
            Ok((pu, ph, pp)) => {
                let user_ok = match (pu, user) {
                    (None, None) => true,
                    (Some("*"), _) => true,
                    (Some(pu), Some(u)) => glob(pu, u, None),
                    _ => false,
                };
                let port_ok = match pp {
                    None => port == 22,
                    Some("*") => true,
                    Some(pp) => pp.parse::<u16>() == Ok(port),
                };
                user_ok
                    && port_ok
                    && glob(&ph.to_ascii_lowercase(), &host.to_ascii_lowercase(), None)
            }
            Err(_) => false,
        })
    }

    /// Whether `identity` (`None`: the default keys) is one of [`SshAllowed::identities`].
    pub fn allows_identity(&self, identity: Option<&str>) -> bool {
        match identity {
            None => self.identities.iter().any(|p| p == "default"),
            Some(path) => {
                path.starts_with('/')
                    && !path.split('/').any(|c| c == "." || c == "..")
                    && self.identities.iter().any(|p| {
                        p.starts_with('/')
                            && match p.strip_suffix("/**") {
                                // a whole tree
                                Some(dir) => path
                                    .strip_prefix(dir)
                                    .is_some_and(|rest| rest.starts_with('/')),
                                None => glob(p, path, Some('/')),
                            }
                    })
            }
        }
    }

    fn validate(&self) -> Result<(), String> {
        for t in &self.targets {
            target_pattern(t).map_err(|e| format!("ssh_allowed.targets: '{t}': {e}"))?;
        }
        for i in &self.identities {
            if i != "default" && !i.starts_with('/') {
                return Err(format!(
                    "ssh_allowed.identities: '{i}' is neither an absolute path nor 'default'"
                ));
            }
        }
        Ok(())
    }
}

/// `[user@]host[:port]` → (user, host, port), IPv6 in brackets.
fn target_pattern(p: &str) -> Result<(Option<&str>, &str, Option<&str>), String> {
    let (user, rest) = match p.rsplit_once('@') {
        Some((u, r)) => (Some(u), r),
        None => (None, p),
    };
    let (host, port) = if let Some(inner) = rest.strip_prefix('[') {
        let (h, after) = inner
            .split_once(']')
            .ok_or("an IPv6 address in brackets misses its ']'")?;
        match after {
            "" => (h, None),
            a => (
                h,
                Some(a.strip_prefix(':').ok_or("only ':port' may follow ']'")?),
            ),
        }
    } else {
        match rest.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (rest, None),
        }
    };
    if host.is_empty() || user == Some("") {
        return Err("expected user@host:port".into());
    }
    if let Some(p) = port
        && p != "*"
        && p.parse::<u16>().is_err()
    {
        return Err(format!("'{p}' is not a port"));
    }
    Ok((user, host, port))
}

/// `pattern` with `*` (any run of characters, not crossing `stop`) matches all of `text`.
fn glob(pattern: &str, text: &str, stop: Option<char>) -> bool {
    match pattern.split_once('*') {
        None => pattern == text,
        Some((head, tail)) => {
            let Some(rest) = text.strip_prefix(head) else {
                return false;
            };
            // the star takes rest[..i]
            rest.char_indices()
                .map(|(i, _)| i)
                .chain([rest.len()])
                .take_while(|&i| stop.is_none_or(|s| !rest[..i].contains(s)))
                .any(|i| glob(tail, &rest[i..], stop))
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields, default)]
pub struct EnvSettings {
    /// Release every new version as soon as it is stored.
    pub auto_release: bool,
    /// Periodic deploy of resources that are not known to be good.
    #[schema(value_type = String)]
    pub deploy_interval: Interval,
    /// Periodic repair: verify every resource and restore drift.
    #[schema(value_type = String)]
    pub repair_interval: Interval,
    pub retry_backoff: RetryBackoff,
    /// Refuse deletion of the environment.
    pub protected: bool,
    pub source: SourceKind,
    /// Handler actions running at once per agent.
    pub agent_parallelism: u32,
    /// Seconds before a handler action is abandoned and its executor killed.
    pub handler_timeout: u64,
    /// Versions kept (besides the active one); older ones are deleted.
    // the whole u32 range in the reference (utoipa would say int32, which ends at 2^31 - 1)
    #[schema(value_type = i64, minimum = 0, maximum = 4294967295_i64)]
    pub version_retention: u32,
    /// Delete resources removed from the model on their targets (otherwise they become
    /// orphans and are left alone).
    pub delete_removed_resources: bool,
    /// What is kept of the records that grow with time.
    pub retention: Retention,
    /// Where each agent's executor runs: `local:` (started by the server, the default),
    /// `external` (a `steward agent run` process connects for it) or
    /// `ssh://user@host:port` (started on the target over SSH). Wins over the model's
    /// `std::AgentConfig(uri=…)`. A null value removes an entry.
    pub agent_map: std::collections::BTreeMap<String, String>,
    /// How `ssh://` agents are reached.
    pub ssh: SshSettings,
    /// The SSH targets and key files this environment may use (only a global admin changes
    /// it); none by default.
    pub ssh_allowed: SshAllowed,
    /// Seconds a fact (a value a handler reports about a resource) stays valid; an older one
    /// counts as unknown to a compile until it is renewed.
    #[schema(minimum = 1)]
    pub fact_expire: u64,
    /// Seconds after which an expiring fact is asked for again from its resource's agent;
    /// null (the default): a third of `fact_expire`.
    #[schema(minimum = 1)]
    pub fact_renew: Option<u64>,
    /// Seconds between two requests to an agent for the missing facts of one resource.
    #[schema(minimum = 1)]
    pub fact_resource_block: u64,
    /// Seconds (a fraction allowed) between a fact or parameter resolving an unknown value
    /// and the recompile it triggers: facts arriving together make one compile.
    #[schema(minimum = 0, maximum = 3600)]
    pub recompile_backoff: f64,
    /// Pull-request previews.
    pub previews: PreviewSettings,
}

impl Default for EnvSettings {
    fn default() -> Self {
        EnvSettings {
            auto_release: true,
            deploy_interval: Interval::Seconds(600),
            repair_interval: Interval::Seconds(86400),
            retry_backoff: RetryBackoff::default(),
            protected: false,
            source: SourceKind::Push,
            agent_parallelism: 1,
            handler_timeout: 300,
            version_retention: 100,
            delete_removed_resources: false,
            retention: Retention::default(),
            agent_map: std::collections::BTreeMap::new(),
            ssh: SshSettings::default(),
            ssh_allowed: SshAllowed::default(),
            fact_expire: 3600,
            fact_renew: None,
            fact_resource_block: 60,
            recompile_backoff: 0.1,
            previews: PreviewSettings::default(),
        }
    }
}

impl EnvSettings {
    /// Apply a JSON patch of settings (only the given keys change) and validate the result.
    pub fn patched(&self, patch: &serde_json::Value) -> Result<EnvSettings, String> {
        let serde_json::Value::Object(p) = patch else {
            return Err("settings must be a JSON object".into());
        };
        let mut current = serde_json::to_value(self).map_err(|e| e.to_string())?;
        let obj = current
            .as_object_mut()
            .expect("settings serialize to an object");
        for (k, v) in p {
            if !obj.contains_key(k) {
                return Err(format!(
                    "unknown setting '{k}' (known: {})",
                    obj.keys().cloned().collect::<Vec<_>>().join(", ")
                ));
            }
            // a nested setting changes only the keys given ({"retention": {"days": 7}})
            match (obj.get_mut(k), v) {
                (Some(serde_json::Value::Object(cur)), serde_json::Value::Object(new)) => {
                    for (nk, nv) in new {
                        // null removes a key (an agent_map entry; a retention key's default)
                        if nv.is_null() {
                            cur.remove(nk);
                        } else {
                            cur.insert(nk.clone(), nv.clone());
                        }
                    }
                }
                _ => {
                    obj.insert(k.clone(), v.clone());
                }
            }
        }
        let s: EnvSettings =
            serde_json::from_value(current).map_err(|e| format!("invalid settings: {e}"))?;
        s.validate()?;
        Ok(s)
    }

    pub fn validate(&self) -> Result<(), String> {
        if self.agent_parallelism == 0 || self.agent_parallelism > 256 {
            return Err("agent_parallelism must be between 1 and 256".into());
        }
        if self.handler_timeout == 0 {
            return Err("handler_timeout must be at least 1 second".into());
        }
        if self.retry_backoff.initial == 0
            || self.retry_backoff.factor < 1.0
            || self.retry_backoff.max < self.retry_backoff.initial
        {
            return Err("retry_backoff needs initial >= 1, factor >= 1 and max >= initial".into());
        }
        if self.version_retention == 0 {
            return Err("version_retention must be at least 1".into());
        }
        for (agent, uri) in &self.agent_map {
            super::placement::Placement::parse(uri)
                .map_err(|e| format!("agent_map: agent '{agent}': {e}"))?;
        }
        for (what, p) in [
            ("ssh.known_hosts", &self.ssh.known_hosts),
            ("ssh.identity", &self.ssh.identity),
        ] {
            if p.as_deref().is_some_and(|p| !p.starts_with('/')) {
                return Err(format!("{what} must be an absolute path on the server"));
            }
        }
        self.ssh_allowed.validate()?;
        if self.ssh.connect_timeout == 0 || self.ssh.connect_timeout > 300 {
            return Err("ssh.connect_timeout must be between 1 and 300 seconds".into());
        }
        if self.fact_expire == 0 {
            return Err("fact_expire must be at least 1 second".into());
        }
        if let Some(renew) = self.fact_renew
            && (renew == 0 || renew >= self.fact_expire)
        {
            return Err(
                "fact_renew must be at least 1 second and less than fact_expire (or null: a third of it)"
                    .into(),
            );
        }
        if self.fact_resource_block == 0 {
            return Err("fact_resource_block must be at least 1 second".into());
        }
        if !(self.recompile_backoff.is_finite() && (0.0..=3600.0).contains(&self.recompile_backoff))
        {
            return Err("recompile_backoff must be between 0 and 3600 seconds".into());
        }
        let r = &self.retention;
        if r.days == 0 || r.audit_days == 0 {
            return Err("retention.days and retention.audit_days must be at least 1".into());
        }
        if r.actions_per_resource < 10 || r.compile_reports < 1 || r.dryruns < 1 {
            return Err(
                "retention keeps at least 10 actions per resource, 1 compile report and 1 dry-run"
                    .into(),
            );
        }
        Ok(())
    }

    /// Seconds after which an expiring fact is renewed: `fact_renew`, or a third of
    /// `fact_expire` (at least one second).
    pub fn fact_renew_secs(&self) -> u64 {
        self.fact_renew.unwrap_or((self.fact_expire / 3).max(1))
    }

    /// Settings as stored: a stored blob that fails to parse falls back to defaults.
    pub fn from_stored(v: &serde_json::Value) -> EnvSettings {
        EnvSettings::default().patched(v).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn intervals() {
        assert_eq!(Interval::parse("600").unwrap(), Interval::Seconds(600));
        assert_eq!(Interval::parse("0").unwrap(), Interval::Disabled);
        assert_eq!(
            Interval::parse("*/5 * * * *").unwrap(),
            Interval::Cron(CronSchedule::parse("*/5 * * * *").unwrap())
        );
        assert!(Interval::parse("61 * * * *").is_err());
        assert!(Interval::parse("soon").is_err());
    }

    #[test]
    fn ssh_allow_lists_match_targets_and_keys() {
        let a = SshAllowed {
            targets: vec![
                "deploy@web*.example.com".into(),
                "*@10.0.0.5:2222".into(),
                "root@[::1]:*".into(),
                "db1".into(),
            ],
            identities: vec!["/etc/steward/keys/shop/*".into()],
        };
        assert!(a.allows_target(Some("deploy"), "web1.example.com", 22));
        assert!(a.allows_target(Some("deploy"), "WEB1.example.com", 22));
        assert!(!a.allows_target(Some("deploy"), "web1.example.com", 2222));
        assert!(!a.allows_target(Some("root"), "web1.example.com", 22));
        assert!(!a.allows_target(Some("deploy"), "web1.example.com.evil", 22));
        assert!(!a.allows_target(None, "web1.example.com", 22));
        assert!(a.allows_target(Some("anyone"), "10.0.0.5", 2222));
        assert!(a.allows_target(None, "10.0.0.5", 2222));
        assert!(!a.allows_target(Some("x"), "10.0.0.50", 2222));
        assert!(a.allows_target(Some("root"), "::1", 2200));
        assert!(a.allows_target(None, "db1", 22));
        assert!(!a.allows_target(Some("root"), "db1", 22));
        assert!(!SshAllowed::default().allows_target(None, "db1", 22));

        assert!(a.allows_identity(Some("/etc/steward/keys/shop/id_ed25519")));
        assert!(!a.allows_identity(Some("/etc/steward/keys/shop/../other/id")));
        assert!(!a.allows_identity(Some("/etc/steward/keys/shop/sub/id")));
        assert!(!a.allows_identity(Some("/etc/steward/keys/other/id")));
        assert!(!a.allows_identity(None), "the default keys need 'default'");
        let d = SshAllowed {
            identities: vec!["default".into()],
            ..SshAllowed::default()
        };
        assert!(d.allows_identity(None));
        assert!(!d.allows_identity(Some("/root/.ssh/id_ed25519")));

        let s = EnvSettings::default();
        assert!(
            s.patched(&serde_json::json!({"ssh_allowed": {"targets": ["u@h:x"]}}))
                .is_err()
        );
        assert!(
            s.patched(&serde_json::json!({"ssh_allowed": {"identities": ["id_rsa"]}}))
                .is_err()
        );
    }

    #[test]
    fn fact_settings() {
        let s = EnvSettings::default();
        assert_eq!((s.fact_expire, s.fact_renew_secs()), (3600, 1200));
        assert_eq!(s.fact_resource_block, 60);
        assert_eq!(s.recompile_backoff, 0.1);
        let p = s.patched(&serde_json::json!({"fact_expire": 90})).unwrap();
        assert_eq!(p.fact_renew_secs(), 30, "a third of fact_expire when unset");
        let p = p.patched(&serde_json::json!({"fact_renew": 10})).unwrap();
        assert_eq!(p.fact_renew_secs(), 10);
        let p = p.patched(&serde_json::json!({"fact_renew": null})).unwrap();
        assert_eq!(p.fact_renew, None);
        for bad in [
            serde_json::json!({"fact_expire": 0}),
            serde_json::json!({"fact_renew": 3600}),
            serde_json::json!({"fact_renew": 0}),
            serde_json::json!({"fact_resource_block": 0}),
            serde_json::json!({"recompile_backoff": -1}),
            serde_json::json!({"recompile_backoff": 4000}),
            serde_json::json!({"recompile_backoff": "soon"}),
        ] {
            assert!(s.patched(&bad).is_err(), "{bad}");
        }
        assert_eq!(
            s.patched(&serde_json::json!({"recompile_backoff": 0.5}))
                .unwrap()
                .recompile_backoff,
            0.5
        );
    }

    #[test]
    fn patching_validates() {
        let s = EnvSettings::default();
        let p = s
            .patched(&serde_json::json!({"auto_release": false, "deploy_interval": "0 * * * *"}))
            .unwrap();
        assert!(!p.auto_release);
        assert!(
            s.patched(&serde_json::json!({"nope": 1}))
                .unwrap_err()
                .contains("unknown setting")
        );
        assert!(
            s.patched(&serde_json::json!({"agent_parallelism": 0}))
                .is_err()
        );
        assert!(s.patched(&serde_json::json!({"source": "svn"})).is_err());
        let r = s
            .patched(&serde_json::json!({"retention": {"days": 7}}))
            .unwrap();
        assert_eq!(r.retention.days, 7);
        assert_eq!(r.retention.actions_per_resource, 200, "other keys kept");
        assert!(
            s.patched(&serde_json::json!({"retention": {"actions_per_resource": 1}}))
                .is_err()
        );
        assert!(
            s.patched(&serde_json::json!({"retention": {"nope": 1}}))
                .is_err()
        );
        assert!(
            s.patched(&serde_json::json!({"deploy_interval": true}))
                .is_err()
        );
        let m = s
            .patched(&serde_json::json!({"agent_map": {"web1": "ssh://deploy@10.0.0.5:22", "api": "external"}}))
            .unwrap();
        assert_eq!(m.agent_map.len(), 2);
        let m = m
            .patched(&serde_json::json!({"agent_map": {"api": null}}))
            .unwrap();
        assert_eq!(m.agent_map.keys().collect::<Vec<_>>(), ["web1"]);
        assert!(
            s.patched(&serde_json::json!({"agent_map": {"web1": "telnet://x"}}))
                .unwrap_err()
                .contains("agent 'web1'")
        );
    }
}
