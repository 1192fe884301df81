//! A database URL naming several hosts, libpq style:
//! `postgres://user:pw@db1:5432,db2:5432/steward?target_session_attrs=read-write`.
//!
//! The pool connects to the first host that answers and, for `read-write` (the default
//! when several hosts are named), is not a standby (`pg_is_in_recovery()`). A watcher asks
//! the pool every second whether it still reaches a primary; when it does not (the host is
//! gone, or was demoted), it looks for the primary among the hosts and points the pool's
//! *new* connections there (`Pool::set_connect_options`). Connections opened before the
//! switch are not handed out again, and a connection that finds itself on a standby when it
//! opens is refused, so no write goes to a read-only server twice. Everything built on the
//! pool (the changes listener, the replicas' event link) follows, since they take their
//! connections from it.
//!
//! A single-host URL takes none of this: no watcher, no extra query.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};

use super::{Result, StoreError};

/// What the URL asks of the server a connection lands on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SessionAttrs {
    /// any server (libpq's `any`)
    Any,
    /// a primary that takes writes (libpq's `read-write`, `primary`)
    ReadWrite,
}

/// A parsed multi-host URL: one single-host URL per host, in order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hosts {
    pub urls: Vec<String>,
    /// `host:port` per URL, for logs
    pub names: Vec<String>,
    pub attrs: SessionAttrs,
}

/// Split a URL naming several hosts into one URL per host; None for a single-host URL
/// (which sqlx parses as it is).
pub fn parse(url: &str) -> Result<Option<Hosts>> {
    let invalid = |m: &str| StoreError::Invalid(format!("invalid database URL: {m}"));
    let Some((scheme, rest)) = url.split_once("://") else {
        return Ok(None);
    };
    if scheme != "postgres" && scheme != "postgresql" {
        return Ok(None);
    }
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    // credentials may hold ',' only percent-encoded, so the last '@' ends them
    let (userinfo, hostlist) = match authority.rfind('@') {
        Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
        None => (None, authority),
    };
    let (path, query) = match tail.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (tail, None),
    };
    // the query form: `?host=/run/a,/run/b&port=5432` (unix socket directories, or names)
    let query_hosts = query
        .unwrap_or("")
        .split('&')
        .find_map(|p| p.strip_prefix("host="))
        .filter(|h| h.contains(','));
    if !hostlist.contains(',') && query_hosts.is_none() {
        return Ok(None);
    }
    if let Some(list) = query_hosts {
        return parse_query_hosts(scheme, authority, path, query.unwrap_or(""), list);
    }
    let mut attrs = SessionAttrs::ReadWrite;
    let mut kept: Vec<&str> = Vec::new();
    for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("target_session_attrs", v)) => attrs = session_attrs(v)?,
            _ => kept.push(pair),
        }
    }
    let mut urls = Vec::new();
    let mut names = Vec::new();
    for host in hostlist.split(',') {
        if host.is_empty() {
            return Err(invalid("an empty host in the host list"));
        }
        let (name, port) = match host.rsplit_once(':') {
            // [v6]:port or name:port
            Some((h, p)) if !h.is_empty() && !h.ends_with(':') => {
                let port: u16 = p
                    .parse()
                    .map_err(|_| invalid(&format!("port '{p}' of host '{h}' is not a number")))?;
                (h.to_string(), port)
            }
            _ => (host.to_string(), 5432),
        };
        let user = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
        let query = if kept.is_empty() {
            String::new()
        } else {
            format!("?{}", kept.join("&"))
        };
        let single = format!("{scheme}://{user}{name}:{port}{path}{query}");
        single
            .parse::<PgConnectOptions>()
            .map_err(|e| invalid(&format!("host {name}:{port}: {e}")))?;
        urls.push(single);
        names.push(format!("{name}:{port}"));
    }
    Ok(Some(Hosts { urls, names, attrs }))
}

/// `?host=a,b[&port=p|p1,p2]`: one URL per host with `host=` and `port=` of its own.
fn parse_query_hosts(
    scheme: &str,
    authority: &str,
    path: &str,
    query: &str,
    list: &str,
) -> Result<Option<Hosts>> {
    let invalid = |m: &str| StoreError::Invalid(format!("invalid database URL: {m}"));
    let hosts: Vec<&str> = list.split(',').collect();
    if hosts.iter().any(|h| h.is_empty()) {
        return Err(invalid("an empty host in the host list"));
    }
    let ports: Vec<&str> = query
        .split('&')
        .find_map(|p| p.strip_prefix("port="))
        .map(|p| p.split(',').collect())
        .unwrap_or_default();
    if ports.len() > 1 && ports.len() != hosts.len() {
        return Err(invalid("give one port, or one port per host"));
    }
    let mut attrs = SessionAttrs::ReadWrite;
    let mut kept: Vec<&str> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        match pair.split_once('=') {
            Some(("host" | "port", _)) => {}
            Some(("target_session_attrs", v)) => attrs = session_attrs(v)?,
            _ => kept.push(pair),
        }
    }
    let mut urls = Vec::new();
    let mut names = Vec::new();
    for (i, host) in hosts.iter().enumerate() {
        let port = match ports.len() {
            0 => "5432",
            1 => ports[0],
            _ => ports[i],
        };
        port.parse::<u16>()
            .map_err(|_| invalid(&format!("port '{port}' is not a number")))?;
        let mut q = kept.clone();
        let host_param = format!("host={host}");
        let port_param = format!("port={port}");
        q.push(&host_param);
        q.push(&port_param);
        let single = format!("{scheme}://{authority}{path}?{}", q.join("&"));
        single
            .parse::<PgConnectOptions>()
            .map_err(|e| invalid(&format!("host {host}: {e}")))?;
        urls.push(single);
        names.push(format!("{}:{port}", urlencoding_decode(host)));
    }
    Ok(Some(Hosts { urls, names, attrs }))
}

/// Percent-decoding for host names shown in logs.
fn urlencoding_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16)
        {
            out.push(b);
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn session_attrs(v: &str) -> Result<SessionAttrs> {
    match v {
        "any" => Ok(SessionAttrs::Any),
        "read-write" | "primary" => Ok(SessionAttrs::ReadWrite),
        other => Err(StoreError::Invalid(format!(
            "invalid database URL: target_session_attrs={other} is not supported (any, read-write or primary)"
        ))),
    }
}

fn options(url: &str) -> Result<PgConnectOptions> {
    Ok(url
        .parse::<PgConnectOptions>()
        .map_err(|e| StoreError::Invalid(format!("invalid database URL: {e}")))?
        .disable_statement_logging())
}

/// The first host (from `start`, wrapping around) that answers and suits `attrs`.
async fn find_primary(hosts: &Hosts, start: usize) -> Option<usize> {
    let n = hosts.urls.len();
    for k in 0..n {
        let i = (start + k) % n;
        let Ok(opts) = options(&hosts.urls[i]) else {
            continue;
        };
        let probe = async {
            let mut c = sqlx::PgConnection::connect_with(&opts).await.ok()?;
            let standby: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                .fetch_one(&mut c)
                .await
                .ok()?;
            let _ = c.close().await;
            Some(standby)
        };
        match tokio::time::timeout(Duration::from_secs(3), probe).await {
            Ok(Some(false)) => return Some(i),
            Ok(Some(true)) if hosts.attrs == SessionAttrs::Any => return Some(i),
            _ => {}
        }
    }
    None
}

/// When the current host was chosen: connections older than this are not handed out.
struct Switch {
    base: Instant,
    at_ms: AtomicU64,
}

/// Connect a pool over several hosts (see the module doc).
pub async fn connect(hosts: Hosts, max_connections: u32) -> Result<PgPool> {
    let first = find_primary(&hosts, 0).await.ok_or_else(|| {
        StoreError::Unavailable(format!(
            "none of the database hosts {} is a {} server that answers",
            hosts.names.join(", "),
            if hosts.attrs == SessionAttrs::ReadWrite {
                "primary (read-write)"
            } else {
                "PostgreSQL"
            }
        ))
    })?;
    let switch = Arc::new(Switch {
        base: Instant::now(),
        at_ms: AtomicU64::new(0),
    });
    let read_write = hosts.attrs == SessionAttrs::ReadWrite;
    let seen = switch.clone();
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .min_connections(0)
        .acquire_timeout(Duration::from_secs(5))
        .idle_timeout(Duration::from_secs(300))
        .test_before_acquire(true)
        // a connection that lands on a standby is refused: the watcher finds the primary
        .after_connect(move |c, _| {
            Box::pin(async move {
                if read_write {
                    let standby: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                        .fetch_one(&mut *c)
                        .await?;
                    if standby {
                        return Err(sqlx::Error::Protocol(
                            "the database host is a standby (read-only); waiting for the primary"
                                .into(),
                        ));
                    }
                }
                Ok(())
            })
        })
        // connections opened before the last switch went to the old host
        .before_acquire(move |_, meta| {
            let since_switch = seen
                .base
                .elapsed()
                .saturating_sub(Duration::from_millis(seen.at_ms.load(Ordering::Acquire)));
            let fresh = seen.at_ms.load(Ordering::Acquire) == 0 || meta.age <= since_switch;
            Box::pin(async move { Ok(fresh) })
        })
        .connect_with(options(&hosts.urls[first])?)
        .await?;
    tracing::info!(host = %hosts.names[first], hosts = %hosts.names.join(","), "database host chosen");
    tokio::spawn(watch(pool.clone(), hosts, first, switch));
    Ok(pool)
}

/// Every second: does the pool still reach a suitable server? If not, find one and point
/// the pool's new connections there.
async fn watch(pool: PgPool, hosts: Hosts, mut current: usize, switch: Arc<Switch>) {
    let read_write = hosts.attrs == SessionAttrs::ReadWrite;
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if pool.is_closed() {
            return;
        }
        let check = tokio::time::timeout(
            Duration::from_secs(3),
            sqlx::query_scalar::<_, bool>("SELECT pg_is_in_recovery()").fetch_one(&pool),
        )
        .await;
        let fine = matches!(check, Ok(Ok(standby)) if !(read_write && standby));
        if fine {
            continue;
        }
        // look at the others first: the current one just failed
        let Some(next) = find_primary(&hosts, current + 1).await else {
            tracing::warn!(hosts = %hosts.names.join(","), "no database host is a primary right now; looking again");
            continue;
        };
        if next == current {
            continue;
        }
        let Ok(opts) = options(&hosts.urls[next]) else {
            continue;
        };
        pool.set_connect_options(opts);
        switch.at_ms.store(
            (switch.base.elapsed().as_millis() as u64).max(1),
            Ordering::Release,
        );
        tracing::warn!(from = %hosts.names[current], to = %hosts.names[next], "database primary moved; new connections go to the new one");
        current = next;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn several_hosts_become_one_url_each() {
        let h = parse("postgres://u:p%40ss@db1:5433,db2,[::1]:5434/steward?sslmode=disable")
            .unwrap()
            .unwrap();
        assert_eq!(
            h.urls,
            vec![
                "postgres://u:p%40ss@db1:5433/steward?sslmode=disable",
                "postgres://u:p%40ss@db2:5432/steward?sslmode=disable",
                "postgres://u:p%40ss@[::1]:5434/steward?sslmode=disable",
            ]
        );
        assert_eq!(h.names, vec!["db1:5433", "db2:5432", "[::1]:5434"]);
        assert_eq!(h.attrs, SessionAttrs::ReadWrite);
    }

    #[test]
    fn session_attrs_are_read_and_removed() {
        let h = parse("postgresql://a,b/x?target_session_attrs=any&application_name=s")
            .unwrap()
            .unwrap();
        assert_eq!(h.attrs, SessionAttrs::Any);
        assert_eq!(h.urls[0], "postgresql://a:5432/x?application_name=s");
        let h = parse("postgres://a,b/x?target_session_attrs=primary")
            .unwrap()
            .unwrap();
        assert_eq!(h.attrs, SessionAttrs::ReadWrite);
        assert_eq!(h.urls[1], "postgres://b:5432/x");
    }

    #[test]
    fn socket_directories_in_the_query() {
        let h = parse("postgres://postgres:pw@localhost/db?host=%2Frun%2Fa,%2Frun%2Fb&port=5432")
            .unwrap()
            .unwrap();
        assert_eq!(
            h.urls,
            vec![
                "postgres://postgres:pw@localhost/db?host=%2Frun%2Fa&port=5432",
                "postgres://postgres:pw@localhost/db?host=%2Frun%2Fb&port=5432",
            ]
        );
        assert_eq!(h.names, vec!["/run/a:5432", "/run/b:5432"]);
        let h = parse("postgres://u@x/db?host=a,b&port=1,2&target_session_attrs=any")
            .unwrap()
            .unwrap();
        assert_eq!(h.urls[1], "postgres://u@x/db?host=b&port=2");
        assert_eq!(h.attrs, SessionAttrs::Any);
        let e = parse("postgres://u@x/db?host=a,b&port=1,2,3")
            .unwrap_err()
            .to_string();
        assert!(e.contains("one port per host"), "{e}");
    }

    #[test]
    fn a_single_host_is_left_to_sqlx() {
        assert_eq!(parse("postgres://u@db:5432/x").unwrap(), None);
        assert_eq!(
            parse("postgres://u@db/x?host=/run/postgresql").unwrap(),
            None
        );
        assert_eq!(parse("not a url").unwrap(), None);
    }

    #[test]
    fn bad_host_lists_say_what_is_wrong() {
        let e = parse("postgres://a,,b/x").unwrap_err().to_string();
        assert!(e.contains("empty host"), "{e}");
        let e = parse("postgres://a:x,b/x").unwrap_err().to_string();
        assert!(e.contains("port 'x'"), "{e}");
        let e = parse("postgres://a,b/x?target_session_attrs=standby")
            .unwrap_err()
            .to_string();
        assert!(e.contains("target_session_attrs=standby"), "{e}");
    }
}
