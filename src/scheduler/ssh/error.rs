//! What can go wrong on an SSH link, in words an operator can act on. OpenSSH reports only
//! text on stderr (exit status 255 for all of it), so [`classify`] reads that text: the
//! phrases it looks for have been stable across OpenSSH releases for well over a decade, and
//! anything it does not recognise is passed on verbatim rather than guessed at.

/// Why an SSH operation failed.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    #[error("invalid SSH target '{uri}': {reason}")]
    InvalidTarget { uri: String, reason: String },
    #[error(
        "host key of {host} is not known (known_hosts: {known_hosts}); refusing to connect. Check the host's fingerprint out of band, then add its key to that file (ssh-keyscan -p PORT HOST prints it)"
    )]
    UnknownHostKey { host: String, known_hosts: String },
    #[error(
        "host key of {host} changed (known_hosts: {known_hosts}; the host now presents {fingerprint}): refusing to connect, this may be an attack. If the host was really reinstalled, replace its line in that file"
    )]
    ChangedHostKey {
        host: String,
        known_hosts: String,
        fingerprint: String,
    },
    #[error("host key of {host} could not be verified (known_hosts: {known_hosts}): {detail}")]
    HostKey {
        host: String,
        known_hosts: String,
        detail: String,
    },
    #[error("can not reach {host} within {secs} s")]
    Timeout { host: String, secs: f64 },
    #[error("can not reach {host}: {detail}")]
    Unreachable { host: String, detail: String },
    #[error("authentication failed as {user} on {host} ({identity}): {detail}")]
    Auth {
        user: String,
        host: String,
        identity: String,
        detail: String,
    },
    #[error(
        "the login shell of {target} printed text before running a command ({noise:?}): the executor protocol needs a clean channel, so make the shell's startup files (~/.bashrc, …) silent when not interactive"
    )]
    NoisyShell { target: String, noise: String },
    #[error("refusing to connect to {target}: {detail}")]
    NotAllowed { target: String, detail: String },
    #[error("{target}: refusing to use what is shipped there: {detail}")]
    Untrusted { target: String, detail: String },
    #[error("{target} can not run this executor: {detail}")]
    Platform { target: String, detail: String },
    #[error("{what} on {target} failed: {detail}")]
    Remote {
        target: String,
        what: String,
        detail: String,
    },
    #[error("{what} {path}: {detail}")]
    Local {
        what: String,
        path: String,
        detail: String,
    },
    #[error("ssh to {target} failed: {detail}")]
    Ssh { target: String, detail: String },
}

/// What the link knows when `ssh` failed to connect, for the message.
pub(super) struct Failed<'a> {
    pub host: String,
    pub user: String,
    pub known_hosts: String,
    pub identity: String,
    pub secs: f64,
    pub target: &'a str,
}

/// The error that `ssh`'s stderr describes (it exited while connecting).
pub(super) fn classify(stderr: &str, f: Failed<'_>) -> SshError {
    let text = stderr.trim();
    let has = |s: &str| text.contains(s);
    if has("REMOTE HOST IDENTIFICATION HAS CHANGED") || has("has changed and you have requested") {
        let fingerprint = text
            .lines()
            .map(str::trim)
            .find(|l| l.starts_with("SHA256:") || l.starts_with("MD5:"))
            .map(|l| l.trim_end_matches('.').to_string())
            .unwrap_or_else(|| "another key".into());
        return SshError::ChangedHostKey {
            host: f.host,
            known_hosts: f.known_hosts,
            fingerprint,
        };
    }
    if has("host key is known for") && has("requested strict checking") {
        return SshError::UnknownHostKey {
            host: f.host,
            known_hosts: f.known_hosts,
        };
    }
    if has("Host key verification failed") || has("host key") && has("REVOKED") {
        return SshError::HostKey {
            host: f.host,
            known_hosts: f.known_hosts,
            detail: last_lines(text),
        };
    }
    if has("Permission denied (") || has("Too many authentication failures") {
        return SshError::Auth {
            user: f.user,
            host: f.host,
            identity: f.identity,
            detail: last_lines(text),
        };
    }
    if has("timed out") {
        return SshError::Timeout {
            host: f.host,
            secs: f.secs,
        };
    }
    let unreachable = [
        "Connection refused",
        "Could not resolve hostname",
        "No route to host",
        "Network is unreachable",
        "Connection closed by",
        "Connection reset by",
        "kex_exchange_identification",
    ];
    if unreachable.iter().any(|s| has(s)) {
        return SshError::Unreachable {
            host: f.host,
            detail: last_lines(text),
        };
    }
    SshError::Ssh {
        target: f.target.to_string(),
        detail: if text.is_empty() {
            "ssh exited without a message".into()
        } else {
            last_lines(text)
        },
    }
}

/// The end of a message, on one line (ssh's last lines say what failed).
fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text
        .lines()
        .map(|l| l.trim().trim_start_matches("ssh: "))
        .filter(|l| !l.is_empty() && !l.starts_with('@'))
        .collect();
    let tail = &lines[lines.len().saturating_sub(3)..];
    tail.join(" / ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(stderr: &str) -> SshError {
        classify(
            stderr,
            Failed {
                host: "10.1.2.3:22".into(),
                user: "deploy".into(),
                known_hosts: "/k".into(),
                identity: "the default keys".into(),
                secs: 5.0,
                target: "ssh://deploy@10.1.2.3:22",
            },
        )
    }

    #[test]
    fn openssh_messages_become_clear_errors() {
        let e = c(
            "No ED25519 host key is known for [10.1.2.3]:22 and you have requested strict checking.\r\nHost key verification failed.\r\n",
        );
        assert!(matches!(e, SshError::UnknownHostKey { .. }), "{e:?}");
        assert!(
            e.to_string()
                .starts_with("host key of 10.1.2.3:22 is not known (known_hosts: /k)")
        );

        let e = c(
            "@@@@@\n@    WARNING: REMOTE HOST IDENTIFICATION HAS CHANGED!     @\n@@@@@\nThe fingerprint for the ED25519 key sent by the remote host is\nSHA256:42ozFg5WAzbi1cswNneMcKaTb5CRSS0GOH91sLXOOgs.\nPlease contact your system administrator.\nHost key for [10.1.2.3]:22 has changed and you have requested strict checking.\nHost key verification failed.\n",
        );
        assert!(
            e.to_string().contains(
                "host key of 10.1.2.3:22 changed (known_hosts: /k; the host now presents SHA256:42ozFg5WAzbi1cswNneMcKaTb5CRSS0GOH91sLXOOgs)"
            ),
            "{e}"
        );

        let e = c("deploy@10.1.2.3: Permission denied (publickey).\r\n");
        assert!(
            e.to_string()
                .starts_with("authentication failed as deploy on 10.1.2.3:22"),
            "{e}"
        );

        let e = c("ssh: connect to host 10.1.2.3 port 22: Connection refused\r\n");
        assert_eq!(
            e.to_string(),
            "can not reach 10.1.2.3:22: connect to host 10.1.2.3 port 22: Connection refused"
        );
        let e = c("ssh: connect to host 10.1.2.3 port 22: Connection timed out\r\n");
        assert_eq!(e.to_string(), "can not reach 10.1.2.3:22 within 5 s");
        let e = c("Connection timed out during banner exchange\r\n");
        assert!(matches!(e, SshError::Timeout { .. }));
        let e = c("ssh: Could not resolve hostname nowhere: Name or service not known\r\n");
        assert!(matches!(e, SshError::Unreachable { .. }));
        let e = c("something new\n");
        assert_eq!(
            e.to_string(),
            "ssh to ssh://deploy@10.1.2.3:22 failed: something new"
        );
    }
}
