//! Showing a deploy while it runs, from the server's progress document
//! (`GET …/versions/{n}/progress`).
//!
//! On a terminal: a live `indicatif` bar (settled / total) with the counts by state and the
//! resource being worked on. Otherwise (stdout or stderr is not a terminal, or `--json`):
//! plain lines on stderr, one per change and at most two a second, so logs and pipes stay
//! readable and stdout stays for the result.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::Value;

use crate::store::state::FAILED;

/// Plain-line mode prints a changed line at most this often.
const LINE_INTERVAL: Duration = Duration::from_millis(500);

pub struct DeployProgress {
    live: bool,
    bar: Option<ProgressBar>,
    last_line: String,
    last_print: Option<Instant>,
}

impl DeployProgress {
    /// A bar when both stdout and stderr are terminals and `json` is off; plain lines otherwise.
    pub fn new(json: bool) -> DeployProgress {
        let live = !json && std::io::stdout().is_terminal() && std::io::stderr().is_terminal();
        DeployProgress {
            live,
            bar: None,
            last_line: String::new(),
            last_print: None,
        }
    }

    /// The bar, drawn from the first document on (so it never shows an empty 0/0).
    fn bar(&mut self, total: u64) -> &ProgressBar {
        self.bar.get_or_insert_with(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            bar.set_style(
                ProgressStyle::with_template("{spinner} [{bar:24}] {pos}/{len} {wide_msg}")
                    .expect("a valid template")
                    .progress_chars("#>-"),
            );
            bar.enable_steady_tick(Duration::from_millis(120));
            bar
        })
    }

    /// Show the latest progress document.
    pub fn update(&mut self, p: &Value) {
        let c = Counts::of(p);
        match self.live {
            true => {
                let bar = self.bar(c.total);
                bar.set_length(c.total);
                bar.set_position(c.settled);
                bar.set_message(match p["working_on"].get(0).and_then(Value::as_str) {
                    Some(rid) => format!("{} · {rid}", c.summary()),
                    None => c.summary(),
                });
            }
            false => {
                let line = format!("progress: {}/{}: {}", c.settled, c.total, c.summary());
                let due = self.last_print.is_none_or(|t| t.elapsed() >= LINE_INTERVAL);
                if line != self.last_line && (due || p["done"] == true) {
                    eprintln!("{line}");
                    self.last_print = Some(Instant::now());
                    self.last_line = line;
                }
            }
        }
    }

    /// A line of its own, above the bar (or plainly).
    pub fn note(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None => eprintln!("{line}"),
        }
    }

    /// Leave the final state on screen.
    pub fn finish(self) {
        if let Some(bar) = self.bar {
            bar.finish();
            // the bar stays where it is; what follows (on stdout) starts on a line of its own
            eprintln!();
        }
    }
}

/// The numbers a person follows, from one progress document.
struct Counts {
    total: u64,
    settled: u64,
    deployed: u64,
    failed: u64,
    deploying: u64,
    waiting: u64,
}

impl Counts {
    fn of(p: &Value) -> Counts {
        let count = |s: &str| p["by_status"][s].as_u64().unwrap_or(0);
        let total = p["total"].as_u64().unwrap_or(0);
        let (deploying, waiting) = (count("deploying"), count("available"));
        Counts {
            total,
            settled: total.saturating_sub(deploying + waiting),
            deployed: count("deployed"),
            failed: FAILED.iter().map(|s| count(s)).sum(),
            deploying,
            waiting,
        }
    }

    fn summary(&self) -> String {
        format!(
            "{} deployed · {} failed · {} deploying · {} waiting",
            self.deployed, self.failed, self.deploying, self.waiting
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_from_a_progress_document() {
        let p = serde_json::json!({
            "total": 10,
            "by_status": {"deployed": 4, "failed": 1, "skipped": 1, "deploying": 2, "available": 2}
        });
        let c = Counts::of(&p);
        assert_eq!((c.total, c.settled, c.failed), (10, 6, 2));
        assert_eq!(
            c.summary(),
            "4 deployed · 2 failed · 2 deploying · 2 waiting"
        );
    }
}
