//! `ssh://[user@]host[:port]`: where an agentless agent lives. Parsing is strict because the
//! parts end up on the `ssh` command line: a host or user that could read as an option
//! (`-oProxyCommand=…`) or carry a path, a query or a password is refused, not escaped.

use std::fmt;

use super::SshError;

/// An SSH destination: `ssh://[user@]host[:port]` (port 22 when not given).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SshTarget {
    /// The remote user; `None` means what OpenSSH picks (its config, else the local user).
    pub user: Option<String>,
    /// A host name or an IP address (IPv6 without the brackets of the URI).
    pub host: String,
    pub port: u16,
}

impl SshTarget {
    pub fn parse(uri: &str) -> Result<SshTarget, SshError> {
        let bad = |reason: &str| SshError::InvalidTarget {
            uri: uri.to_string(),
            reason: reason.to_string(),
        };
        let rest = match uri.split_once("://") {
            Some((scheme, rest)) if scheme.eq_ignore_ascii_case("ssh") => rest,
            _ => return Err(bad("it must start with ssh://, as in ssh://user@host:22")),
        };
        let rest = rest.strip_suffix('/').unwrap_or(rest);
        if rest.contains(['/', '?', '#']) {
            return Err(bad("a path, query or fragment is not allowed"));
        }
        let (user, hostport) = match rest.rsplit_once('@') {
            Some((user, hostport)) => {
                if user.contains(':') {
                    return Err(bad(
                        "a password is not allowed in the URI: Steward logs in with keys only",
                    ));
                }
                if !valid_user(user) {
                    return Err(bad(
                        "the user must be letters, digits, '.', '_' or '-' and not start with '-'",
                    ));
                }
                (Some(user.to_string()), hostport)
            }
            None => (None, rest),
        };
        let (host, port) = if let Some(inner) = hostport.strip_prefix('[') {
            let (host, after) = inner
                .split_once(']')
                .ok_or_else(|| bad("an IPv6 address in brackets misses its ']'"))?;
            let (addr, zone) = host.split_once('%').unwrap_or((host, "x"));
            if !addr.contains(':')
                || !addr
                    .chars()
                    .all(|c| c.is_ascii_hexdigit() || matches!(c, ':' | '.'))
                || !valid_host(zone)
                || zone.is_empty()
            {
                return Err(bad("the text in brackets is not an IPv6 address"));
            }
            let port = match after {
                "" => None,
                p => Some(
                    p.strip_prefix(':')
                        .ok_or_else(|| bad("only ':port' may follow the IPv6 address"))?,
                ),
            };
            (host, port)
        } else {
            match hostport.split_once(':') {
                Some((_, p)) if p.contains(':') => {
                    return Err(bad(
                        "an IPv6 address must be written in brackets: ssh://[::1]:22",
                    ));
                }
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        if host.is_empty() {
            return Err(bad("the host is missing"));
        }
        if !host.contains(':') && !valid_host(host) {
            return Err(bad(
                "the host must be a name or an address: letters, digits, '.', '_' or '-', not starting with '-'",
            ));
        }
        let port = match port {
            None => 22,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => n,
                _ => return Err(bad("the port must be a number from 1 to 65535")),
            },
        };
        Ok(SshTarget {
            user,
            host: host.to_string(),
            port,
        })
    }

    /// `host:port` as people write it (`[::1]:22` for IPv6), for messages.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for SshTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.user {
            Some(u) => write!(f, "ssh://{u}@{}", self.address()),
            None => write!(f, "ssh://{}", self.address()),
        }
    }
}

fn valid_user(u: &str) -> bool {
    !u.is_empty()
        && !u.starts_with('-')
        && u.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

fn valid_host(h: &str) -> bool {
    !h.starts_with('-')
        && h.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(uri: &str) -> SshTarget {
        SshTarget::parse(uri).unwrap_or_else(|e| panic!("{uri}: {e}"))
    }

    fn err(uri: &str) -> String {
        match SshTarget::parse(uri) {
            Ok(t) => panic!("{uri} parsed as {t:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn ssh_uris_parse() {
        let t = ok("ssh://deploy@web1.example.com:2222");
        assert_eq!(t.user.as_deref(), Some("deploy"));
        assert_eq!(t.host, "web1.example.com");
        assert_eq!(t.port, 2222);
        assert_eq!(t.to_string(), "ssh://deploy@web1.example.com:2222");
        let t = ok("ssh://10.0.0.5");
        assert_eq!((t.user, t.host.as_str(), t.port), (None, "10.0.0.5", 22));
        let t = ok("SSH://root@[::1]:2200/");
        assert_eq!((t.host.as_str(), t.port), ("::1", 2200));
        assert_eq!(t.address(), "[::1]:2200");
        assert_eq!(ok("ssh://[fe80::1%eth0]").port, 22);
    }

    #[test]
    fn bad_ssh_uris_say_why() {
        assert!(err("web1:22").contains("must start with ssh://"));
        assert!(err("local:").contains("must start with ssh://"));
        assert!(err("ssh://").contains("host is missing"));
        assert!(err("ssh://u@").contains("host is missing"));
        assert!(err("ssh://h:0").contains("port must be"));
        assert!(err("ssh://h:99999").contains("port must be"));
        assert!(err("ssh://h:x").contains("port must be"));
        assert!(err("ssh://u:secret@h").contains("password is not allowed"));
        assert!(err("ssh://h/etc").contains("path"));
        assert!(err("ssh://::1").contains("in brackets"));
        assert!(err("ssh://[::1").contains("misses its ']'"));
        assert!(err("ssh://[web]:22").contains("not an IPv6"));
        // what `ssh` would read as options
        assert!(err("ssh://-oProxyCommand=sh").contains("not starting with '-'"));
        assert!(err("ssh://-x@h").contains("not start with '-'"));
        assert!(err("ssh://a b@h").contains("the user must be"));
        assert!(err("ssh://h;reboot").contains("the host must be"));
    }
}
