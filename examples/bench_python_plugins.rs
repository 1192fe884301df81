//! Python plugin benchmark: `cargo run --release --example bench_python_plugins -- [N] [CALLS]`
//!
//! 1. The cost of one Python plugin call: a model with CALLS calls of a trivial Python
//!    plugin against the same model calling a built-in (Rust) plugin; the difference per call,
//!    a compile calling no Python plugin, and the host's start (what a first call adds to it;
//!    with `--real-std` also for a plugin that imports std's Python, which the host imports
//!    only on such a need).
//! 2. The generated benchmark model (`../shared/bench/gen_model.py N`, or
//!    `$STEWARD_BENCH_GEN`: the generator `bench_compile` ports), extended so that every
//!    host calls a Python plugin taking the host (it reads `name` and the `dc` relation
//!    through the proxy): Steward's time, and the reference compiler's on the same project
//!    when `~/inmanta-ref/bin/inmanta` (or `$INMANTA_BIN`) exists.
//!
//! The plugin host runs in a fresh virtualenv made from `python3` on `PATH` (as Inmanta
//! projects run in one), or on `$STEWARD_BENCH_PYTHON`.
//!
//! `--real-std` (first argument): every project pins the real std in its `requirements.txt`
//! (`inmanta-module-std==8.1.0`, installed with pip and all its dependencies into the
//! virtualenv, as an Inmanta user's project has it): its `.cf` files are the real std's,
//! the plugin host's interpreter starts while the compiler loads them, and std's Python
//! (jinja2, pydantic, …) is imported when something needs it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use steward::compiler::{self, CompileOptions};

const PLUGINS: &str = r#"
from inmanta.plugins import plugin


@plugin
def inc(n: "int") -> "int":
    return n + 1


@plugin
def label(host: "std::Entity") -> "string":
    return f"{host.name}@{host.dc.name}"


@plugin
def inc_std(n: "int") -> "int":
    # needs std's Python: with the real std pinned, the host imports it for this call
    import inmanta_plugins.std

    return n + 1
"#;

/// The real std a `--real-std` run pins.
const REAL_STD: &str = "inmanta-module-std==8.1.0";

static REAL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

fn real_std() -> bool {
    REAL.load(std::sync::atomic::Ordering::Relaxed)
}

/// The virtualenv [`python`] made, removed by [`remove_venv`] (a static is never dropped).
static VENV: std::sync::Mutex<Option<tempfile::TempDir>> = std::sync::Mutex::new(None);

fn remove_venv() {
    drop(VENV.lock().unwrap().take());
}

fn python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            if let Some(p) = std::env::var_os("STEWARD_BENCH_PYTHON") {
                return PathBuf::from(p);
            }
            let made = tempfile::tempdir().unwrap();
            let dir = made.path().to_path_buf();
            *VENV.lock().unwrap() = Some(made);
            let mut venv = Command::new("python3");
            venv.args(["-m", "venv"]);
            if !real_std() {
                venv.arg("--without-pip");
            }
            let ok = venv
                .arg(dir.join("venv"))
                .status()
                .is_ok_and(|s| s.success());
            assert!(ok, "python3 -m venv failed");
            if real_std() {
                let ok = Command::new(dir.join("venv/bin/pip"))
                    .args(["install", "-q", "--disable-pip-version-check", REAL_STD])
                    .status()
                    .is_ok_and(|s| s.success());
                assert!(ok, "pip install {REAL_STD} failed");
            }
            dir.join("venv/bin/python3")
        })
        .clone()
}

fn write_project(dir: &Path, main: &str) {
    std::fs::write(dir.join("project.yml"), "name: bench\nmodulepath: libs\n").unwrap();
    std::fs::write(dir.join("main.cf"), main).unwrap();
    if real_std() {
        std::fs::write(dir.join("requirements.txt"), format!("{REAL_STD}\n")).unwrap();
    }
    let m = dir.join("libs/pybench");
    std::fs::create_dir_all(m.join("model")).unwrap();
    std::fs::create_dir_all(m.join("plugins")).unwrap();
    std::fs::write(
        m.join("module.yml"),
        "name: pybench\nversion: 1.0.0\nlicense: Apache 2.0\n",
    )
    .unwrap();
    std::fs::write(m.join("model/_init.cf"), "").unwrap();
    std::fs::write(m.join("plugins/__init__.py"), PLUGINS).unwrap();
}

/// Compile, fail loudly, return (seconds, printed lines).
fn compile(dir: &Path) -> (f64, Vec<String>) {
    let mut lines = Vec::new();
    let start = Instant::now();
    let outcome = compiler::compile(
        &CompileOptions {
            project_dir: dir.to_path_buf(),
            python: Some(python()),
            ..Default::default()
        },
        &mut |l| lines.push(l.to_string()),
    );
    let t = start.elapsed().as_secs_f64();
    if let Err(errors) = &outcome.result {
        for e in errors {
            eprintln!("{}", e.resolve(&outcome.sources));
        }
        remove_venv();
        std::process::exit(2);
    }
    (t, lines)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn per_call(calls: usize) {
    let model = |f: &str| {
        let mut m = String::from("import pybench\n");
        for i in 0..calls {
            m.push_str(&format!("x{i} = {f}({i})\n"));
        }
        m
    };
    let py = tempfile::tempdir().unwrap();
    write_project(py.path(), &model("pybench::inc"));
    let rust = tempfile::tempdir().unwrap();
    // a built-in plugin of the same shape (an int in, a value out)
    write_project(rust.path(), &model("std::is_unknown"));
    let one = tempfile::tempdir().unwrap();
    write_project(
        one.path(),
        &model("pybench::inc")
            .lines()
            .take(2)
            .collect::<Vec<_>>()
            .join("\n"),
    );
    let one_std = tempfile::tempdir().unwrap();
    write_project(one_std.path(), "import pybench\nx0 = pybench::inc_std(0)\n");
    let empty = tempfile::tempdir().unwrap();
    write_project(empty.path(), "import pybench\n");
    let runs = 5;
    let t_py = median((0..runs).map(|_| compile(py.path()).0).collect());
    let t_rust = median((0..runs).map(|_| compile(rust.path()).0).collect());
    let t_one = median((0..runs).map(|_| compile(one.path()).0).collect());
    let t_one_std = median((0..runs).map(|_| compile(one_std.path()).0).collect());
    let t_empty = median((0..runs).map(|_| compile(empty.path()).0).collect());
    println!(
        "plugin calls: {calls} Python calls {:.3} s, {calls} built-in calls {:.3} s => {:.1} us per Python call",
        t_py,
        t_rust,
        (t_py - t_rust) / calls as f64 * 1e6
    );
    println!("compile calling no Python plugin: {:.1} ms", t_empty * 1e3);
    // the first call's cost over that compile: with std pinned, its interpreter started
    // already to say where the installed modules are
    println!(
        "plugin host start (inmanta compat + module import, first call): {:.1} ms",
        (t_one - t_empty) * 1e3
    );
    if real_std() {
        println!(
            "plugin host start with std's Python imported (a plugin importing it): {:.1} ms",
            (t_one_std - t_empty) * 1e3
        );
    }
    // the whole compile of a model with one Python plugin call, against the reference's
    if let Some(r) = reference_median(one.path()) {
        println!(
            "one Python plugin call: Steward {t_one:.3} s, reference {r:.3} s => {:.1}x faster",
            r / t_one
        );
    }
}

/// The reference's median compile time of `dir` over three runs, after a warm-up (it fills
/// its cache); `None` without the reference, or when it fails.
fn reference_median(dir: &Path) -> Option<f64> {
    reference(dir)?;
    let refs: Vec<f64> = (0..3).filter_map(|_| reference(dir)).collect();
    (!refs.is_empty()).then(|| median(refs))
}

fn model_with_labels(n: usize) -> (String, Vec<String>) {
    let gen_script = std::env::var_os("STEWARD_BENCH_GEN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/bench/gen_model.py")
        });
    let out = tempfile::tempdir().unwrap();
    let status = Command::new("python3")
        .arg(&gen_script)
        .arg(n.to_string())
        .arg(out.path())
        .status()
        .unwrap_or_else(|e| panic!("{}: {e}", gen_script.display()));
    assert!(status.success(), "{} failed", gen_script.display());
    let model = std::fs::read_to_string(out.path().join("main.cf")).unwrap();
    let mut expected: Vec<String> = std::fs::read_to_string(out.path().join("expected_output.txt"))
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let mut model = format!("import pybench\n{model}");
    model.push_str(
        "\nentity Label:\n    string text\nend\nLabel.host [1] -- Host.pylabel [1]\n\
         implement Label using std::none\n\
         implementation py_label for Host:\n    Label(host=self, text=pybench::label(self))\nend\n\
         implement Host using py_label\n\
         nlabels = std::count([h.pylabel.text for h in reg.hosts])\n\
         std::print(\"labels={{nlabels}}\")\n",
    );
    expected.push(format!("labels={n}"));
    expected.sort();
    (model, expected)
}

fn reference(dir: &Path) -> Option<f64> {
    let bin = std::env::var_os("INMANTA_BIN")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join("inmanta-ref/bin/inmanta"))
        })?;
    if !bin.exists() {
        return None;
    }
    let start = Instant::now();
    let out = Command::new(&bin)
        .arg("compile")
        .current_dir(dir)
        .output()
        .ok()?;
    let t = start.elapsed().as_secs_f64();
    if !out.status.success() {
        eprintln!(
            "reference compile failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        return None;
    }
    Some(t)
}

fn main() {
    let mut args = std::env::args().skip(1).peekable();
    if args.peek().is_some_and(|a| a == "--real-std") {
        args.next();
        REAL.store(true, std::sync::atomic::Ordering::Relaxed);
        println!("projects pin {REAL_STD}: the real std is loaded");
    }
    let n: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(1000);
    let calls: usize = args.next().and_then(|a| a.parse().ok()).unwrap_or(10_000);
    per_call(calls);

    let dir = tempfile::tempdir().unwrap();
    let (model, expected) = model_with_labels(n);
    write_project(dir.path(), &model);
    let mut times = Vec::new();
    for _ in 0..3 {
        let (t, mut lines) = compile(dir.path());
        lines.sort();
        if lines != expected {
            eprintln!("MISMATCH: output differs from the generator's expectation");
            remove_venv();
            std::process::exit(1);
        }
        times.push(t);
    }
    let ours = median(times);
    println!("benchmark model N={n} with a Python plugin call per host: Steward {ours:.3} s");
    match reference_median(dir.path()) {
        Some(r) => println!(
            "reference (inmanta compile) {r:.3} s => Steward is {:.1}x faster",
            r / ours
        ),
        None => println!("reference compiler not found or failed: no comparison"),
    }
    remove_venv();
}
