//! Compile benchmark: `cargo run --release --example bench_compile -- N [RUNS]`
//!
//! Generates the compile-kind model of ../shared/bench/gen_model.py for N hosts (the same
//! text, ported here so the benchmark needs nothing outside the project), compiles it RUNS
//! times, each in a fresh process of its own that ends after it (as `steward compile` does:
//! the compiler's memory is left to the exit, not freed), checks the std::print lines
//! against the generator's expectation, and prints the median time and the peak memory
//! (VmHWM) of a run.

use std::fmt::Write as _;
use std::time::Instant;

use steward::compiler::{self, CompileOptions};

// The allocator of the `steward` binary, so that this measures what `steward compile` does.
#[global_allocator]
static ALLOCATOR: steward::alloc::Allocator = steward::alloc::Allocator;

const HOSTS_PER_DC: usize = 25;

const STATIC_MODEL: &str = r#""""
Generated benchmark model (compile kind). Core language + std plugins only.
"""

typedef port_t as int matching self > 0 and self < 65536
typedef role_t as string matching self in ["web", "db", "worker"]

entity Registry:
    """Collects everything, so that the totals can be counted at the end."""
    string name
end
index Registry(name)
implement Registry using std::none

entity Datacenter:
    string name
    string region = "eu-west"
    int racks = 4
end
index Datacenter(name)
Datacenter.registry [1] -- Registry.datacenters [0:]
implement Datacenter using std::none

entity Node:
    """Abstract base of managed machines."""
    string name
    string? description = null
    string[] tags = []
end

entity Host extends Node:
    string ip
    role_t role = "web"
    bool monitored = true
    int cpus = 2
end
index Host(name)

Host.dc [1] -- Datacenter.hosts [0:]
Host.db [0:1] -- Host.clients [0:]
Host.registry [0:1] -- Registry.hosts [0:]

entity Service:
    string name
    port_t port
    bool enabled = true
end
index Service(host, name)
Service.host [1] -- Host.services [0:]
Service.depends_on [0:] -- Service.dependents [0:]

entity File:
    string path
    string content
    int mode = 644
    string owner = "root"
end
index File(host, path)
File.host [1] -- Host.files [0:]
File.registry [0:1] -- Registry.files [0:]

entity ConfigFile extends File:
    """A file with stricter defaults."""
    int mode = 640
    string owner = "app"
end

entity Check:
    string name
    int interval = 60
end
index Check(name)
Check.service [1] -- Service.checks [0:]
Check.registry [0:1] -- Registry.checks [0:]

entity FirewallRule:
    string name
    port_t port
    string action = "allow"
end
index FirewallRule(host, port)
FirewallRule.host [1] -- Host.rules [0:]
FirewallRule.registry [0:1] -- Registry.rules [0:]

implementation hostBase for Host:
    self.registry = Registry[name="global"]
    ConfigFile(host=self, path="/etc/hostname", content="{{self.name}}")
    ConfigFile(host=self, path="/etc/hosts", content="127.0.0.1 localhost {{self.ip}} {{self.name}}")
    if self.role == "db":
        File(host=self, path="/etc/motd", content="database server {{self.name}} in {{self.dc.name}}")
    else:
        File(host=self, path="/etc/motd", content="{{self.role}} server {{self.name}}", mode=444)
    end
end

implementation webStack for Host:
    Service(host=self, name="nginx", port=443)
    app = Service(host=self, name="app", port=8080)
    if self.db is defined:
        app.depends_on = Service[host=self.db, name="postgres"]
    end
end

implementation dbStack for Host:
    Service(host=self, name="postgres", port=5432)
end

implementation workerStack for Host:
    Service(host=self, name="worker", port=9000)
    Service(host=self, name="queue", port=5672)
end

implementation firewall for Host:
    for s in self.services:
        FirewallRule(host=self, port=s.port, name="allow-{{s.name}}", registry=self.registry)
    end
end

implement Host using hostBase, firewall
implement Host using webStack when self.role == "web"
implement Host using dbStack when self.role == "db"
implement Host using workerStack when self.role == "worker"

implementation fileRegister for File:
    self.registry = self.host.registry
end
implement File using fileRegister
implement ConfigFile using parents

implementation serviceConfig for Service:
    ConfigFile(host=self.host, path="/etc/{{self.name}}/{{self.name}}.conf",
               content="name={{self.name}} port={{self.port}} host={{self.host.name}}")
end

implementation monitoring for Service:
    Check(service=self, name="check-{{self.name}}-{{self.host.name}}", registry=self.host.registry)
end

implementation tls for Service:
    File(host=self.host, path="/etc/ssl/{{self.name}}.pem", content="CERT {{self.host.name}}", mode=600)
end

implement Service using serviceConfig
implement Service using monitoring when self.host.monitored
implement Service using tls when self.port == 443

implement FirewallRule using std::none
implement Check using std::none
"#;

fn services(role: &str) -> &'static [(&'static str, u32)] {
    match role {
        "db" => &[("postgres", 5432)],
        "web" => &[("nginx", 443), ("app", 8080)],
        _ => &[("worker", 9000), ("queue", 5672)],
    }
}

/// The model text, the expected print lines (sorted) and the instance count.
fn generate(n: usize) -> (String, Vec<String>, usize) {
    let ndc = n.div_ceil(HOSTS_PER_DC);
    let regions = ["eu-west", "eu-central", "us-east"];
    let mut m = String::new();
    m.push_str(STATIC_MODEL);
    m.push_str("\n\nreg = Registry(name=\"global\")\n\n");
    for d in 0..ndc {
        writeln!(
            m,
            "Datacenter(name=\"dc{d:04}\", region=\"{}\", registry=reg)",
            regions[d % 3]
        )
        .unwrap();
    }
    m.push('\n');
    let (mut files, mut svcs, mut checks, mut rules) = (0, 0, 0, 0);
    let mut dc_hosts = vec![0usize; ndc];
    for i in 0..n {
        let dc = i / HOSTS_PER_DC;
        let pos = i % HOSTS_PER_DC;
        let role = if pos == 0 {
            "db"
        } else {
            ["web", "web", "worker"][(pos - 1) % 3]
        };
        let name = format!("host{i:06}");
        let ip = format!("10.{}.{}.{}", (i >> 16) & 255, (i >> 8) & 255, i & 255);
        let db = if role == "web" {
            Some(format!("host{:06}", dc * HOSTS_PER_DC))
        } else {
            None
        };
        let monitored = i % 7 != 3;
        let cpus = 2 + (i % 4) * 2;
        let mut args = vec![
            format!("name=\"{name}\""),
            format!("ip=\"{ip}\""),
            format!("dc=Datacenter[name=\"dc{dc:04}\"]"),
        ];
        if role != "web" {
            args.push(format!("role=\"{role}\""));
        }
        if let Some(db) = &db {
            args.push(format!("db=Host[name=\"{db}\"]"));
        }
        if !monitored {
            args.push("monitored=false".into());
        }
        if cpus != 2 {
            args.push(format!("cpus={cpus}"));
        }
        if i % 10 == 0 {
            args.push(format!("tags=[\"rack{}\", \"{role}\"]", i % 4));
        }
        writeln!(m, "Host({})", args.join(", ")).unwrap();
        let s = services(role);
        dc_hosts[dc] += 1;
        svcs += s.len();
        rules += s.len();
        files += 3;
        for (_, port) in s {
            files += 1;
            if *port == 443 {
                files += 1;
            }
            if monitored {
                checks += 1;
            }
        }
    }
    m.push_str("\nnhosts = std::count(reg.hosts)\nnfiles = std::count(reg.files)\nnchecks = std::count(reg.checks)\nnrules = std::count(reg.rules)\n");
    m.push_str("std::print(\"total hosts={{nhosts}} files={{nfiles}} checks={{nchecks}} rules={{nrules}}\")\n\n");
    m.push_str("for dc in reg.datacenters:\n    nh = std::count(dc.hosts)\n    label = std::upper(dc.name)\n    llen = std::length(label)\n    std::print(\"{{label}} {{dc.region}} hosts={{nh}} len={{llen}}\")\nend\n");
    let mut expected = vec![format!(
        "total hosts={n} files={files} checks={checks} rules={rules}"
    )];
    for (d, hosts) in dc_hosts.iter().enumerate() {
        let label = format!("DC{d:04}");
        expected.push(format!(
            "{label} {} hosts={hosts} len={}",
            regions[d % 3],
            label.len()
        ));
    }
    expected.sort();
    (m, expected, 1 + ndc + n + svcs + files + checks + rules)
}

fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<f64>().ok())
            })
        })
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

/// One timed compile in this process, which then ends, as `steward compile` runs: the
/// compiler's memory is not freed (`process_ends_after`), and the peak memory is this
/// compile's alone. Prints `time_s peak_rss_mb instances` for the parent.
fn run_one(dir: &std::path::Path, n: usize) -> ! {
    let (_, expected, _) = generate(n);
    let mut lines = Vec::new();
    let start = Instant::now();
    let outcome = compiler::compile(
        &CompileOptions {
            project_dir: dir.to_path_buf(),
            main_file: None,
            export: false,
            process_ends_after: true,
            ..Default::default()
        },
        &mut |l| lines.push(l.to_string()),
    );
    let elapsed = start.elapsed();
    if let Err(errors) = &outcome.result {
        for e in errors {
            eprintln!("{}", e.resolve(&outcome.sources));
        }
        std::process::exit(2);
    }
    lines.sort();
    if lines != expected {
        eprintln!("MISMATCH: output differs from the generator's expectation");
        std::process::exit(1);
    }
    println!(
        "{} {} {}",
        elapsed.as_secs_f64(),
        peak_rss_mb(),
        outcome.stats.instances
    );
    std::process::exit(0)
}

const CHILD: &str = "BENCH_COMPILE_PROJECT";

fn main() {
    // as `steward compile` runs
    steward::alloc::tune_for_a_one_shot_compile();
    let mut args = std::env::args().skip(1);
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let runs: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1);
    if let Some(dir) = std::env::var_os(CHILD) {
        run_one(std::path::Path::new(&dir), n);
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let (model, expected, instances) = generate(n);
    std::fs::write(
        dir.path().join("project.yml"),
        "name: bench\nmodulepath: libs\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("main.cf"), model).unwrap();
    // each run in a process of its own, so that each is a first compile in a fresh
    // process and its memory is its own, as with `steward compile`
    let exe = std::env::current_exe().expect("own executable");
    let mut times = Vec::new();
    let mut peak: f64 = 0.0;
    for run in 0..runs {
        let out = std::process::Command::new(&exe)
            .arg(n.to_string())
            .env(CHILD, dir.path())
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("run the compile");
        if !out.status.success() {
            std::process::exit(out.status.code().unwrap_or(2));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let fields: Vec<&str> = text.split_whitespace().collect();
        let (time, rss, compiled): (f64, f64, usize) = match fields.as_slice() {
            [t, r, c] => (
                t.parse().unwrap_or(f64::NAN),
                r.parse().unwrap_or(f64::NAN),
                c.parse().unwrap_or(0),
            ),
            _ => panic!("unexpected output of a run: {text}"),
        };
        times.push(time);
        peak = peak.max(rss);
        println!(
            "run {}: N={n} instances={instances} (compiled {compiled}) time {time:.3} s",
            run + 1
        );
    }
    times.sort_by(|a, b| a.partial_cmp(b).unwrap());
    println!(
        "N={n} instances={instances} median {:.3} s, peak RSS {peak:.0} MB, output OK ({} lines)",
        times[times.len() / 2],
        expected.len()
    );
}
