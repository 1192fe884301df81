//! Repository URLs: credentials are kept out of them. (Here, below the store and the git
//! sources, because both apply the rule: the sources when they take a URL, the store when it
//! shows one.)

/// Split credentials out of a repository URL: `https://user:secret@host/repo` becomes
/// `https://host/repo` and the secret (or, with no password, the user part, as GitHub
/// takes a token there). An SSH user name (`ssh://git@host/…`) is not a secret and stays.
/// Credentials never live in the stored URL: the API shows it, and git writes it into the
/// mirror's config.
pub fn split_credentials(url: &str) -> (String, Option<String>) {
    let Some((scheme, rest)) = url.split_once("://") else {
        return (url.to_string(), None);
    };
    let end = rest.find('/').unwrap_or(rest.len());
    let Some((userinfo, host)) = rest[..end].rsplit_once('@') else {
        return (url.to_string(), None);
    };
    let (user, password) = match userinfo.split_once(':') {
        Some((u, p)) => (u, Some(p)),
        None => (userinfo, None),
    };
    if scheme == "ssh" {
        let kept = if user.is_empty() {
            String::new()
        } else {
            format!("{user}@")
        };
        return (
            format!("{scheme}://{kept}{host}{}", &rest[end..]),
            password.filter(|p| !p.is_empty()).map(str::to_string),
        );
    }
    let secret = password.unwrap_or(user);
    (
        format!("{scheme}://{host}{}", &rest[end..]),
        (!secret.is_empty()).then(|| secret.to_string()),
    )
}

/// The repository URL without credentials, for provenance and logs.
pub fn public_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_string();
    };
    // credentials live in the authority: before the first '/'
    let end = rest.find('/').unwrap_or(rest.len());
    match rest[..end].rsplit_once('@') {
        Some((_, host)) => format!("{scheme}://{host}{}", &rest[end..]),
        None => url.to_string(),
    }
}

/// Percent-encode everything but unreserved characters (RFC 3986), for a path segment or a
/// query value (resource ids contain `[`, `]`, `/`, `=` …).
pub fn encode_component(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod credential_tests {
    use super::split_credentials;

    #[test]
    fn credentials_leave_the_url() {
        assert_eq!(
            split_credentials("https://bob:s3cret@git.example/o/r.git"),
            ("https://git.example/o/r.git".into(), Some("s3cret".into()))
        );
        assert_eq!(
            split_credentials("https://ghp_tok@github.com/o/r"),
            ("https://github.com/o/r".into(), Some("ghp_tok".into()))
        );
        assert_eq!(
            split_credentials("ssh://git@host/o/r.git"),
            ("ssh://git@host/o/r.git".into(), None)
        );
        assert_eq!(
            split_credentials("file:///srv/git/r.git"),
            ("file:///srv/git/r.git".into(), None)
        );
        // an @ in the path is not a credential
        assert_eq!(
            split_credentials("https://host/o/r@v1"),
            ("https://host/o/r@v1".into(), None)
        );
    }

    #[test]
    fn credentials_never_leave() {
        assert_eq!(
            super::public_url("https://user:tok@git.example.com/a/b.git"),
            "https://git.example.com/a/b.git"
        );
        assert_eq!(
            super::public_url("ssh://git@host/repo.git"),
            "ssh://host/repo.git"
        );
        assert_eq!(
            super::public_url("file:///srv/git/x.git"),
            "file:///srv/git/x.git"
        );
        assert_eq!(super::public_url("https://host/a@b"), "https://host/a@b");
        assert_eq!(super::public_url("https://user:tok@host"), "https://host");
    }
}
