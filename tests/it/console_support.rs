//! Console test helpers: sign in with a token and keep the session cookie and CSRF value,
//! as a browser would (reqwest, redirects not followed so that tests see them).

#![allow(dead_code)]

use reqwest::redirect::Policy;
use reqwest::{Response, StatusCode};

/// A signed-in console session.
pub struct ConsoleSession {
    pub base: String,
    pub http: reqwest::Client,
    /// `steward_session=…`, for the Cookie header.
    pub cookie: String,
    /// The raw Set-Cookie header the sign-in answered.
    pub set_cookie: String,
}

pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(Policy::none())
        .build()
        .unwrap()
}

impl ConsoleSession {
    /// Sign in with `token`; panics unless the console accepts it.
    pub async fn sign_in(base: &str, token: &str) -> ConsoleSession {
        let resp = sign_in_raw(base, token).await;
        assert_eq!(resp.status(), StatusCode::SEE_OTHER, "sign-in refused");
        let set_cookie = resp
            .headers()
            .get("set-cookie")
            .expect("a session cookie")
            .to_str()
            .unwrap()
            .to_string();
        let cookie = set_cookie.split(';').next().unwrap().trim().to_string();
        ConsoleSession {
            base: base.to_string(),
            http: http(),
            cookie,
            set_cookie,
        }
    }

    pub async fn get(&self, path: &str) -> Response {
        self.http
            .get(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .send()
            .await
            .unwrap()
    }

    /// GET a page and return its status and HTML.
    pub async fn page(&self, path: &str) -> (StatusCode, String) {
        let r = self.get(path).await;
        (r.status(), r.text().await.unwrap())
    }

    /// POST a form (the pairs as given: add ("csrf", …) yourself, or use `post_with_csrf`).
    pub async fn post(&self, path: &str, form: &[(&str, &str)]) -> Response {
        self.http
            .post(format!("{}{path}", self.base))
            .header("cookie", &self.cookie)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(encode_form(form))
            .send()
            .await
            .unwrap()
    }

    /// The CSRF value the console's pages carry for this session.
    pub async fn csrf(&self) -> String {
        let (status, html) = self.page("/console/").await;
        assert_eq!(status, StatusCode::OK, "{html}");
        csrf_in(&html).expect("a csrf field on the environments page")
    }

    pub async fn post_with_csrf(&self, path: &str, form: &[(&str, &str)]) -> Response {
        let csrf = self.csrf().await;
        let mut all = vec![("csrf", csrf.as_str())];
        all.extend_from_slice(form);
        self.post(path, &all).await
    }
}

pub async fn sign_in_raw(base: &str, token: &str) -> Response {
    http()
        .post(format!("{base}/console/sign-in"))
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encode_form(&[("token", token), ("next", "/console/")]))
        .send()
        .await
        .unwrap()
}

/// The value of the first `name="csrf"` field of a page.
pub fn csrf_in(html: &str) -> Option<String> {
    let at = html.find("name=\"csrf\" value=\"")? + "name=\"csrf\" value=\"".len();
    let end = html[at..].find('"')?;
    Some(html[at..at + end].to_string())
}

/// A form body as browsers send it (application/x-www-form-urlencoded).
pub fn encode_form(pairs: &[(&str, &str)]) -> String {
    fn enc(s: &str) -> String {
        let mut out = String::new();
        for b in s.bytes() {
            match b {
                b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'*' => {
                    out.push(b as char)
                }
                b' ' => out.push('+'),
                _ => out.push_str(&format!("%{b:02X}")),
            }
        }
        out
    }
    pairs
        .iter()
        .map(|(k, v)| format!("{}={}", enc(k), enc(v)))
        .collect::<Vec<_>>()
        .join("&")
}
