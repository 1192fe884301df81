//! Where an agent's executor runs (DESIGN.md §9): on the server (`local:`), in an external
//! `steward agent run` process that connects to the server (`external`), or on a target
//! reached over SSH (`ssh://user@host:port`, agentless). Chosen per agent by the
//! environment's `agent_map` setting, else by the model's `std::AgentConfig(uri=…)`, else
//! `local:`.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// an executor process started by the server (the default)
    Local,
    /// a `steward agent run` process, started by hand on a managed machine
    External,
    /// an executor started on the target over SSH; the normalised `ssh://` URI
    Ssh(String),
}

impl Placement {
    /// Parse a placement URI. Inmanta's `local:` and `ssh://user@host:port?python=…` forms
    /// are accepted (the query, which names a Python interpreter there, is ignored).
    pub fn parse(uri: &str) -> Result<Placement, String> {
        let u = uri.trim();
        if u == "local:" || u == "local" {
            return Ok(Placement::Local);
        }
        if u == "external" {
            return Ok(Placement::External);
        }
        if let Some(rest) = u.strip_prefix("ssh://") {
            let rest = rest.split(['?', '#']).next().unwrap_or_default();
            let rest = rest.trim_end_matches('/');
            let (user, hostport) = match rest.rsplit_once('@') {
                Some((u, h)) => (Some(u), h),
                None => (None, rest),
            };
            if user.is_some_and(|u| u.is_empty() || u.contains([':', '/'])) {
                return Err(format!(
                    "'{uri}': the user part of an ssh:// URI must be a name"
                ));
            }
            let (host, port) = match hostport.rsplit_once(':') {
                Some((h, p)) if !h.ends_with(']') || hostport.starts_with('[') => {
                    let port: u16 = p
                        .parse()
                        .ok()
                        .filter(|&p| p > 0)
                        .ok_or_else(|| format!("'{uri}': invalid port '{p}'"))?;
                    (h, port)
                }
                _ => (hostport, 22),
            };
            if host.is_empty() || host.contains('/') {
                return Err(format!("'{uri}': an ssh:// URI needs a host"));
            }
            let user = user.map(|u| format!("{u}@")).unwrap_or_default();
            return Ok(Placement::Ssh(format!("ssh://{user}{host}:{port}")));
        }
        Err(format!(
            "'{uri}' is not a placement: use local:, external or ssh://user@host:port"
        ))
    }

    pub fn is_local(&self) -> bool {
        *self == Placement::Local
    }
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Placement::Local => f.write_str("local:"),
            Placement::External => f.write_str("external"),
            Placement::Ssh(uri) => f.write_str(uri),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placements() {
        assert_eq!(Placement::parse("local:").unwrap(), Placement::Local);
        assert_eq!(Placement::parse("external").unwrap(), Placement::External);
        assert_eq!(
            Placement::parse("ssh://deploy@10.0.0.5:2222").unwrap(),
            Placement::Ssh("ssh://deploy@10.0.0.5:2222".into())
        );
        assert_eq!(
            Placement::parse("ssh://root@web1?python=python3").unwrap(),
            Placement::Ssh("ssh://root@web1:22".into())
        );
        assert_eq!(
            Placement::parse("ssh://web1").unwrap().to_string(),
            "ssh://web1:22"
        );
        for bad in [
            "ssh://",
            "ssh://@h",
            "ssh://h:0",
            "ssh://h:x",
            "http://h",
            "remote",
        ] {
            assert!(Placement::parse(bad).is_err(), "{bad}");
        }
    }
}
