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

/// A repository's identity whatever the URL's form: lowercase host and path without scheme,
/// credentials, user, a trailing `/` or `.git` (`https://GitHub.com/Org/Site.git` and
/// `ssh://git@github.com/org/site` are both `github.com/org/site`); a local path stays as
/// given, without the trailing parts.
pub fn repo_key(url: &str) -> String {
    let (plain, _) = split_credentials(url.trim());
    let rest = match plain.split_once("://") {
        Some((_, rest)) => {
            let end = rest.find('/').unwrap_or(rest.len());
            let host = rest[..end]
                .rsplit_once('@')
                .map_or(&rest[..end], |(_, h)| h);
            format!("{host}{}", &rest[end..]).to_lowercase()
        }
        // scp-like `git@host:org/site`
        None if !plain.starts_with('/') && plain.contains(':') => {
            let r = plain.rsplit_once('@').map_or(plain.as_str(), |(_, r)| r);
            r.replacen(':', "/", 1).to_lowercase()
        }
        None => plain.clone(),
    };
    let rest = rest.trim_end_matches('/');
    rest.strip_suffix(".git").unwrap_or(rest).to_string()
}

/// `owner/name` of a repository URL: its last two path segments (how hosts name it).
pub fn repo_name(url: &str) -> String {
    let key = repo_key(url);
    let parts: Vec<&str> = key.rsplitn(3, '/').collect();
    match parts.as_slice() {
        [name, owner, _] => format!("{owner}/{name}"),
        _ => key,
    }
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

    #[test]
    fn repo_keys_name_a_repository_whatever_the_url() {
        let k = "github.com/org/site";
        for u in [
            "https://GitHub.com/Org/Site.git",
            "ssh://git@github.com/org/site",
            "https://user:tok@github.com/org/site/",
            "git@github.com:org/site.git",
        ] {
            assert_eq!(super::repo_key(u), k, "{u}");
        }
        assert_eq!(super::repo_key("/srv/git/site.git"), "/srv/git/site");
        assert_eq!(
            super::repo_name("https://github.com/Org/Site.git"),
            "org/site"
        );
        assert_eq!(super::repo_name("file:///tmp/x/repo.git"), "x/repo");
    }
}
