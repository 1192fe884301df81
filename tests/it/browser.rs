//! Browser harness for the console tests: Debian's headless Chromium driven over WebDriver
//! (fantoccini, plain HTTP to a chromedriver on 127.0.0.1), one browser per test, each with a
//! fresh profile. A test gets a small API: go to a URL, find by CSS, fill and click, wait for
//! a condition (timeout, clear message), read text and cookies, run axe-core (vendored under
//! `tests/assets/axe-core/`, injected here, never served), and take screenshots (into
//! `docs/console/` with `STEWARD_SCREENSHOTS=1`).
//!
//! Invariants: nothing is skipped (without Chromium a test fails and says to run
//! `scripts/test`, which installs it); chromedriver runs in a process group of its own and the
//! whole group (chromedriver, Chromium and its helpers) is killed when the [`Browser`] is
//! dropped, also when a test panics; at most [`MAX_BROWSERS`] run at once, so that the
//! browsers of parallel tests do not starve each other (and the server) of the two cores.

// a harness: not every test uses every helper
#![allow(dead_code)]

use std::fmt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use fantoccini::elements::Element;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";

/// Browsers alive at once in this test binary.
pub const MAX_BROWSERS: usize = 2;
static SLOTS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(MAX_BROWSERS);

/// How long [`Browser::wait_until`] and the `wait_*` helpers wait by default.
pub const WAIT: Duration = Duration::from_secs(10);

/// A headless Chromium and its chromedriver, killed on drop.
pub struct Browser {
    pub client: Client,
    driver: Child,
    port: u16,
    dir: tempfile::TempDir,
    _slot: tokio::sync::SemaphorePermit<'static>,
}

/// One axe-core rule that failed, with the elements it failed on.
#[derive(Debug, serde::Deserialize)]
pub struct Violation {
    pub id: String,
    pub impact: Option<String>,
    pub help: String,
    #[serde(rename = "helpUrl", default)]
    pub help_url: String,
    pub nodes: Vec<ViolationNode>,
}

#[derive(Debug, serde::Deserialize)]
pub struct ViolationNode {
    pub target: Value,
    pub html: String,
    #[serde(rename = "failureSummary", default)]
    pub failure_summary: Option<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "[{}] {}: {} ({})",
            self.impact.as_deref().unwrap_or("?"),
            self.id,
            self.help,
            self.help_url
        )?;
        for n in &self.nodes {
            writeln!(f, "    at {}: {}", n.target, n.html)?;
            if let Some(s) = &n.failure_summary {
                for line in s.lines() {
                    writeln!(f, "       {line}")?;
                }
            }
        }
        Ok(())
    }
}

/// Violations, one per paragraph, for an assertion message.
pub fn describe(violations: &[Violation]) -> String {
    violations.iter().map(|v| v.to_string()).collect()
}

fn missing_browser() -> Option<String> {
    let missing: Vec<&str> = [CHROMIUM, CHROMEDRIVER]
        .into_iter()
        .filter(|p| !Path::new(p).exists())
        .collect();
    (!missing.is_empty()).then(|| {
        format!(
            "{} missing: run scripts/test (it installs Debian's chromium and chromium-driver), \
             or apt-get install chromium chromium-driver",
            missing.join(" and ")
        )
    })
}

impl Browser {
    /// Start chromedriver on a free loopback port and open a headless Chromium through it.
    pub async fn start() -> Browser {
        if let Some(why) = missing_browser() {
            panic!("{why}");
        }
        let slot = SLOTS.acquire().await.expect("browser slots");
        let dir = tempfile::Builder::new()
            .prefix("steward-browser-")
            .tempdir()
            .expect("browser temp dir");
        let port = crate::support::free_port();
        let log = dir.path().join("chromedriver.log");
        let driver = Command::new(CHROMEDRIVER)
            .arg(format!("--port={port}"))
            .arg(format!("--log-path={}", log.display()))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // its own process group: Drop kills chromedriver and every browser process at once
            .process_group(0)
            .spawn()
            .expect("spawn chromedriver");
        let mut browser = Browser {
            client: match Self::connect(port, dir.path()).await {
                Ok(c) => c,
                Err(e) => {
                    kill_group(driver.id());
                    let tail = std::fs::read_to_string(&log).unwrap_or_default();
                    let tail: String = tail
                        .lines()
                        .rev()
                        .take(30)
                        .collect::<Vec<_>>()
                        .into_iter()
                        .rev()
                        .collect::<Vec<_>>()
                        .join("\n");
                    panic!("could not open Chromium through chromedriver: {e}\n{tail}");
                }
            },
            driver,
            port,
            dir,
            _slot: slot,
        };
        browser.driver_alive();
        browser
    }

    async fn connect(port: u16, dir: &Path) -> Result<Client, String> {
        // chromedriver answers once it listens
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(20);
        while tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_err()
        {
            if Instant::now() > deadline {
                return Err(format!("chromedriver did not listen on {url} in 20 s"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let profile = dir.join("profile");
        let mut args = vec![
            "--headless=new".to_string(),
            "--disable-gpu".into(),
            "--disable-quic".into(),
            "--no-first-run".into(),
            "--no-default-browser-check".into(),
            "--disable-background-networking".into(),
            "--disable-component-update".into(),
            "--disable-sync".into(),
            "--disable-crash-reporter".into(),
            "--disable-breakpad".into(),
            "--disable-extensions".into(),
            "--disable-dev-shm-usage".into(),
            "--window-size=1280,900".into(),
            format!("--user-data-dir={}", profile.display()),
        ];
        // Chromium refuses to run as root with its sandbox on
        if unsafe { libc::geteuid() } == 0 {
            args.push("--no-sandbox".into());
        }
        let caps = json!({
            "browserName": "chrome",
            "pageLoadStrategy": "normal",
            "goog:chromeOptions": { "binary": CHROMIUM, "args": args },
        });
        let caps = caps.as_object().unwrap().clone();
        let connector = hyper_util::client::legacy::connect::HttpConnector::new();
        ClientBuilder::new(connector)
            .capabilities(caps)
            .connect(&url)
            .await
            .map_err(|e| e.to_string())
    }

    fn driver_alive(&mut self) {
        if let Ok(Some(status)) = self.driver.try_wait() {
            panic!("chromedriver exited: {status}");
        }
    }

    /// End the WebDriver session politely (Chromium closes its windows), then kill whatever
    /// is left. Dropping does the killing alone.
    pub async fn close(self) {
        let _ = tokio::time::timeout(Duration::from_secs(5), self.client.clone().close()).await;
    }

    /// The chromedriver log, for a failing test to show.
    pub fn driver_log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("chromedriver.log")).unwrap_or_default()
    }

    pub async fn goto(&self, url: &str) {
        self.client
            .goto(url)
            .await
            .unwrap_or_else(|e| panic!("go to {url}: {e}"));
    }

    /// The HTTP status of the document's own response (Navigation Timing; 0 for a data: URL).
    pub async fn status(&self) -> u16 {
        self.js(
            "const n = performance.getEntriesByType('navigation')[0]; \
             return n ? n.responseStatus : 0;",
            vec![],
        )
        .await
        .as_u64()
        .unwrap_or(0) as u16
    }

    pub async fn current_url(&self) -> String {
        self.client.current_url().await.expect("current url").into()
    }

    /// The element matching `css`; panics (with the page's URL) when there is none.
    pub async fn find(&self, css: &str) -> Element {
        match self.client.find(Locator::Css(css)).await {
            Ok(e) => e,
            Err(e) => panic!("no element `{css}` on {}: {e}", self.current_url().await),
        }
    }

    /// Every element matching `css` (maybe none).
    pub async fn find_all(&self, css: &str) -> Vec<Element> {
        self.client
            .find_all(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("find `{css}`: {e}"))
    }

    /// Whether some element matches `css`.
    pub async fn exists(&self, css: &str) -> bool {
        !self.find_all(css).await.is_empty()
    }

    /// Clear the input `css` and type `text` into it.
    pub async fn fill(&self, css: &str, text: &str) {
        let e = self.find(css).await;
        e.clear()
            .await
            .unwrap_or_else(|err| panic!("clear `{css}`: {err}"));
        e.send_keys(text)
            .await
            .unwrap_or_else(|err| panic!("type into `{css}`: {err}"));
    }

    pub async fn click(&self, css: &str) {
        self.find(css)
            .await
            .click()
            .await
            .unwrap_or_else(|e| panic!("click `{css}`: {e}"));
    }

    /// The visible text of `css`.
    pub async fn text(&self, css: &str) -> String {
        self.find(css)
            .await
            .text()
            .await
            .unwrap_or_else(|e| panic!("text of `{css}`: {e}"))
    }

    /// The page's HTML, as the browser has it now.
    pub async fn source(&self) -> String {
        self.client.source().await.expect("page source")
    }

    /// Run `script` (a function body: `return …`) in the page.
    pub async fn js(&self, script: &str, args: Vec<Value>) -> Value {
        self.client
            .execute(script, args)
            .await
            .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    /// Poll `check` (every 50 ms) until it gives `Some`, or panic after `timeout` saying
    /// what was awaited, on which page, and the last value `check` saw (`Err` text).
    pub async fn wait_until<T, F, Fut>(&self, what: &str, timeout: Duration, mut check: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, String>>,
    {
        let deadline = Instant::now() + timeout;
        loop {
            let last = match check().await {
                Ok(v) => return v,
                Err(last) => last,
            };
            if Instant::now() > deadline {
                panic!(
                    "timed out after {:.1} s waiting for {what} on {}; last: {last}",
                    timeout.as_secs_f64(),
                    self.current_url().await
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Wait until the JavaScript expression `expr` is truthy; returns its value.
    pub async fn wait_js(&self, what: &str, expr: &str, timeout: Duration) -> Value {
        let script = format!("return ({expr});");
        self.wait_until(what, timeout, || {
            let c = self.client.clone();
            let script = script.clone();
            async move {
                match c.execute(&script, vec![]).await {
                    Ok(v) if truthy(&v) => Ok(v),
                    Ok(v) => Err(v.to_string()),
                    Err(e) => Err(e.to_string()),
                }
            }
        })
        .await
    }

    /// Wait until an element matches `css`.
    pub async fn wait_for(&self, css: &str) -> Element {
        self.wait_until(&format!("an element `{css}`"), WAIT, || {
            let c = self.client.clone();
            async move {
                c.find(Locator::Css(css))
                    .await
                    .map_err(|_| "not there".to_string())
            }
        })
        .await
    }

    /// Wait until the URL's path is `path` (after a redirect or a submitted form).
    pub async fn wait_path(&self, path: &str) {
        self.wait_until(&format!("the path {path}"), WAIT, || {
            let c = self.client.clone();
            async move {
                let url = c.current_url().await.map_err(|e| e.to_string())?;
                if url.path() == path {
                    Ok(())
                } else {
                    Err(url.to_string())
                }
            }
        })
        .await
    }

    /// Wait until the text of `css` contains `needle`; returns the text.
    pub async fn wait_text(&self, css: &str, needle: &str) -> String {
        self.wait_until(&format!("`{css}` to contain {needle:?}"), WAIT, || {
            let c = self.client.clone();
            async move {
                let e = c
                    .find(Locator::Css(css))
                    .await
                    .map_err(|_| "no such element".to_string())?;
                let t = e.text().await.map_err(|e| e.to_string())?;
                if t.contains(needle) { Ok(t) } else { Err(t) }
            }
        })
        .await
    }

    /// Every cookie the browser holds for the current page, HttpOnly ones included.
    pub async fn cookies(&self) -> Vec<fantoccini::cookies::Cookie<'static>> {
        self.client.get_all_cookies().await.expect("cookies")
    }

    /// What scripts of the page see: `document.cookie`.
    pub async fn document_cookie(&self) -> String {
        self.js("return document.cookie;", vec![])
            .await
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Set a marker on `window`; [`Browser::same_document`] tells whether it survived, i.e.
    /// the page was not reloaded or navigated away from in between.
    pub async fn mark_document(&self) -> String {
        let mark = format!("m{}", uuid::Uuid::new_v4().simple());
        self.js(
            "window.__stewardMark = arguments[0]; return null;",
            vec![json!(mark)],
        )
        .await;
        mark
    }

    pub async fn same_document(&self, mark: &str) -> bool {
        self.js("return window.__stewardMark || null;", vec![])
            .await
            .as_str()
            == Some(mark)
    }

    /// How many resources (fetches, scripts, styles, event streams…) the page has requested
    /// since it loaded, per the Performance API.
    pub async fn resource_requests(&self) -> Vec<String> {
        let v = self
            .js(
                "return performance.getEntriesByType('resource').map(e => e.initiatorType + ' ' + e.name);",
                vec![],
            )
            .await;
        serde_json::from_value(v).expect("resource entries")
    }

    /// Run axe-core on the page; returns the violations of impact serious or critical.
    pub async fn axe(&self) -> Vec<Violation> {
        axe(&self.client).await
    }

    /// Save a PNG of the window as `{name}.png` in [`screenshot_dir`]: `docs/console/` when
    /// `STEWARD_SCREENSHOTS=1` (to refresh the pictures the docs show), otherwise a dir under
    /// the build's temp dir, so that a test run leaves the work tree as it was.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let dir = screenshot_dir();
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
        let path = dir.join(format!("{name}.png"));
        self.screenshot_to(&path).await;
        path
    }

    /// Save a PNG of the window at `path`.
    pub async fn screenshot_to(&self, path: &Path) {
        let png = self.client.screenshot().await.expect("screenshot");
        std::fs::write(path, png).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    }

    /// A screenshot of the whole page, not only the window: the window is made as tall as
    /// the document for the picture, then put back.
    pub async fn screenshot_full(&self, name: &str) -> PathBuf {
        let (w, h) = self.client.get_window_size().await.expect("window size");
        let height = self
            .js(
                "return Math.ceil(document.documentElement.scrollHeight);",
                vec![],
            )
            .await
            .as_u64()
            .unwrap_or(h)
            // chrome's outer frame is a few px in headless mode; keep within a sane bound
            .clamp(h, 6000);
        let _ = self.client.set_window_size(w as u32, height as u32).await;
        let path = self.screenshot(name).await;
        let _ = self.client.set_window_size(w as u32, h as u32).await;
        path
    }
}

/// Where [`Browser::screenshot`] saves: `docs/console/` with `STEWARD_SCREENSHOTS=1`, else
/// `console-screenshots/` in the build's temp dir (`target/tmp/`).
pub fn screenshot_dir() -> PathBuf {
    if std::env::var("STEWARD_SCREENSHOTS").is_ok_and(|v| v == "1") {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/console")
    } else {
        Path::new(env!("CARGO_TARGET_TMPDIR")).join("console-screenshots")
    }
}

/// Run axe-core (injected from `tests/assets/axe-core/axe.min.js` when the page has not got
/// it yet) and return the violations of impact serious or critical.
pub async fn axe(client: &Client) -> Vec<Violation> {
    static AXE: &str = include_str!("../assets/axe-core/axe.min.js");
    let loaded = client
        .execute("return typeof window.axe === 'object';", vec![])
        .await
        .expect("check for axe");
    if loaded != Value::Bool(true) {
        // the script defines window.axe; WebDriver runs it outside the page's CSP
        client
            .execute(&format!("{AXE}\n;return typeof window.axe;"), vec![])
            .await
            .expect("inject axe-core");
    }
    let result = client
        .execute_async(
            r#"const done = arguments[arguments.length - 1];
               axe.run(document, { resultTypes: ['violations'] })
                 .then(r => done(JSON.stringify(r.violations)))
                 .catch(e => done(JSON.stringify({ error: String(e) })));"#,
            vec![],
        )
        .await
        .expect("axe.run");
    let text = result.as_str().expect("axe result is a string");
    if let Ok(Value::Object(err)) = serde_json::from_str::<Value>(text) {
        panic!("axe.run failed: {}", Value::Object(err));
    }
    let all: Vec<Violation> = serde_json::from_str(text).expect("axe violations");
    all.into_iter()
        .filter(|v| matches!(v.impact.as_deref(), Some("serious" | "critical")))
        .collect()
}

fn truthy(v: &Value) -> bool {
    match v {
        Value::Null => false,
        Value::Bool(b) => *b,
        Value::Number(n) => n.as_f64() != Some(0.0),
        Value::String(s) => !s.is_empty(),
        _ => true,
    }
}

fn kill_group(pid: u32) {
    // SAFETY: plain syscall; a negative pid names the process group chromedriver leads
    unsafe {
        libc::kill(-(pid as i32), libc::SIGKILL);
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // chromedriver's /shutdown quits Chromium and waits for it, so its processes are
        // reaped by their parents instead of being left to init; killing is the backstop
        shutdown_driver(self.port);
        let deadline = Instant::now() + Duration::from_secs(3);
        while Instant::now() < deadline && matches!(self.driver.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(20));
        }
        kill_group(self.driver.id());
        let _ = self.driver.wait();
        // anything left of this browser: its group, and what runs on its profile (the crash
        // handler starts a group of its own)
        for _ in 0..100 {
            let left: Vec<u32> = group_pids(self.driver.id())
                .into_iter()
                .chain(pids_using(self.dir.path()))
                .collect();
            if left.is_empty() {
                break;
            }
            for pid in left {
                // SAFETY: plain syscall
                unsafe {
                    libc::kill(pid as i32, libc::SIGKILL);
                }
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Ask the chromedriver on `port` to close its sessions and exit (plain blocking HTTP: this
/// runs in Drop, maybe while panicking, without an async runtime to lean on).
fn shutdown_driver(port: u16) {
    use std::io::{Read, Write};
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let Ok(mut s) = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)) else {
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(b"GET /shutdown HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
    let _ = s.read_to_end(&mut Vec::new());
}

/// Processes (not zombies) whose command line mentions `dir`.
pub fn pids_using(dir: &Path) -> Vec<u32> {
    let needle = dir.to_string_lossy().into_owned();
    let mut pids = vec![];
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if String::from_utf8_lossy(&cmdline).contains(&needle) && !is_zombie(pid) {
            pids.push(pid);
        }
    }
    pids
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.trim_start().starts_with('Z'))
        })
        .unwrap_or(true)
}

/// Processes of the group `pgid` still running: for the test that checks the cleanup.
pub fn group_pids(pgid: u32) -> Vec<u32> {
    let mut pids = vec![];
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp …; comm may hold spaces, so split after the last ')'
        let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.first() == Some(&"Z") {
            continue;
        }
        if fields.get(2).and_then(|g| g.parse::<u32>().ok()) == Some(pgid) {
            pids.push(pid);
        }
    }
    pids
}

impl Browser {
    /// chromedriver's process group (its pid).
    pub fn process_group(&self) -> u32 {
        self.driver.id()
    }

    /// The temp dir holding the profile and the chromedriver log.
    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }
}

/// The harness itself, against a page the server has always served (`/health`) and a small
/// page of its own: navigation, text, waiting (and its failure message), scripts, axe (a page
/// with faults gives serious ones, a clean page none), screenshots, and no process left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harness_drives_chromium() {
    let server = crate::support::TestServer::start(false).await;
    let b = Browser::start().await;
    let group = b.process_group();
    let dir = b.dir();
    assert!(
        group_pids(group).len() > 2,
        "chromedriver and Chromium run in chromedriver's process group: {:?}",
        group_pids(group)
    );

    b.goto(&format!("{}/health", server.url)).await;
    assert!(b.text("body").await.contains(r#""status":"ok""#));
    assert!(b.document_cookie().await.is_empty());
    assert!(b.cookies().await.is_empty());
    // a JSON document has no language and no title: axe finds serious faults
    let faults = b.axe().await;
    assert!(
        faults.iter().any(|v| v.id == "html-has-lang"),
        "{}",
        describe(&faults)
    );

    let page = "<!doctype html><html lang=en><head><title>t</title></head><body><main>\
        <h1>Hello</h1><label for=n>Name</label><input id=n><button id=go>Go</button>\
        <p id=out></p></main><script>document.getElementById('go').onclick = () => \
        setTimeout(() => document.getElementById('out').textContent = 'hi ' + \
        document.getElementById('n').value, 300);</script></body></html>";
    b.goto(&format!("data:text/html,{}", page.replace('#', "%23")))
        .await;
    let mark = b.mark_document().await;
    b.fill("#n", "there").await;
    b.click("#go").await;
    assert_eq!(b.wait_text("#out", "hi").await, "hi there");
    assert!(b.same_document(&mark).await);
    let clean = b.axe().await;
    assert!(clean.is_empty(), "{}", describe(&clean));

    let shot = tempfile::tempdir().unwrap();
    let png = shot.path().join("page.png");
    b.screenshot_to(&png).await;
    assert!(std::fs::read(&png).unwrap().starts_with(b"\x89PNG"));

    // a wait that times out says what it waited for and what it saw last
    let b = std::sync::Arc::new(b);
    let b2 = b.clone();
    let failed = tokio::spawn(async move {
        b2.wait_until(
            "something that never happens",
            Duration::from_millis(200),
            || async { Err::<(), _>("still not".to_string()) },
        )
        .await
    })
    .await
    .expect_err("the wait panics")
    .into_panic();
    let message = failed.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(
        message.contains("something that never happens") && message.contains("still not"),
        "{message}"
    );

    drop(std::sync::Arc::into_inner(b).expect("one owner left"));
    assert_eq!(
        group_pids(group),
        Vec::<u32>::new(),
        "processes left behind"
    );
    assert_eq!(pids_using(&dir), Vec::<u32>::new(), "processes left behind");
    assert!(!dir.exists(), "the profile is removed");
}
