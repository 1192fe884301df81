//! The incremental compile (`compiler::incremental`): an export patched from the last
//! compile's memory must be the export a full compile makes, for any edit.
//!
//! The differential test edits a model at random (literals that may and may not be
//! patched, edits that change their type or make them interpolate, two edits at once,
//! comments, new statements) and compiles each state both ways. The other tests check what
//! the memory must notice besides the main file (a module's file, an environment variable
//! the model reads) and the command line end to end.

use std::path::{Path, PathBuf};

use steward::compiler::incremental::{self, cache};
use steward::compiler::{CompileOptions, CompileOutcome};
use steward::model::ExportFile;

use crate::support::{Rng, steward_bin};

/// A model with literals of every kind: patchable ones (plain contents, modes, a literal
/// of a constructor in a loop and in an implementation, a subtype with defaults), and ones
/// whose value something reads (an index, a condition, an interpolation, another resource,
/// an implementation, a content block, the agent).
fn model(files: &Path) -> String {
    let f = files.display();
    format!(
        r#"import fs
import exec

host = std::Host(name="localhost", os=std::linux)

entity Conf:
    string name
    int port = 80
end
implement Conf using std::none
c = Conf(name="alpha", port=8080)

fs::File(host=host, path="{f}/a", content="plain a", mode=644)
fs::File(host=host, path="{f}/b", content="port {{{{c.port}}}}", mode=600)
f3 = fs::File(host=host, path="{f}/c", content="read me", mode=640)
fs::File(host=host, path="{f}/d", content=f3.content, mode=644)
if c.name == "alpha":
    fs::File(host=host, path="{f}/e", content="cond", mode=644)
end
for n in ["x", "y"]:
    fs::File(host=host, path="{f}/loop-{{{{n}}}}", content="looped", mode=644)
end

entity Site:
    string motd
end
Site.host [1] -- std::Host
implement Site using site
implementation site for Site:
    fs::File(host=self.host, path="{f}/site", content=self.motd, mode=644)
    fs::File(host=self.host, path="{f}/site2", content="fixed in impl", mode=700)
end
Site(host=host, motd="hello")

fs::ConfigFile(host=host, path="{f}/cfg", content="cfg body")
fs::File(host=host, path="{f}/blk", content="body", prefix_content=[fs::Content(value="pre")])
fs::Directory(host=host, path="{f}", mode=755)
exec::Run(host=host, command="echo one", timeout=30)
std::print("printed {{{{c.port}}}}")
"#
    )
}

fn project(dir: &Path, main: &str) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("project.yml"), "name: inc\nmodulepath: libs\n").unwrap();
    std::fs::write(dir.join("main.cf"), main).unwrap();
}

fn options(dir: &Path) -> CompileOptions {
    CompileOptions {
        project_dir: dir.to_path_buf(),
        export: true,
        ..Default::default()
    }
}

/// The full compile: its outcome and what it printed.
fn full(dir: &Path) -> (CompileOutcome, Vec<String>) {
    let mut printed = Vec::new();
    let outcome = steward::compiler::compile(&options(dir), &mut |l| printed.push(l.to_string()));
    (outcome, printed)
}

/// The compile through the memory (written afterwards, as the commands do).
fn remembering(dir: &Path, memory: &Path) -> (CompileOutcome, Vec<String>) {
    let mut printed = Vec::new();
    let (outcome, pending) =
        incremental::compile(&options(dir), memory, &mut |l| printed.push(l.to_string()));
    if let Ok(Some(export)) = &outcome.result {
        pending.write(export);
    }
    (outcome, printed)
}

/// The content of the file resource whose path ends in `/name`.
fn content_of(o: &CompileOutcome, name: &str) -> String {
    let Ok(Some(e)) = &o.result else {
        panic!("{:?}", o.errors())
    };
    let r = e
        .resources
        .iter()
        .find(|r| r.id.0.ends_with(&format!("/{name}]")))
        .unwrap();
    r.attributes["content"].as_str().unwrap().to_string()
}

fn export_json(outcome: &CompileOutcome) -> Option<serde_json::Value> {
    match &outcome.result {
        Ok(Some(e)) => Some(serde_json::to_value(e).unwrap()),
        _ => None,
    }
}

/// The literals of `text` an edit may pick: strings and numbers after `=`.
fn literals(text: &str) -> Vec<(usize, usize)> {
    let re = regex::Regex::new(r#""[^"\n]*"|=\d+(\.\d+)?"#).unwrap();
    re.find_iter(text)
        .map(|m| {
            if m.as_str().starts_with('=') {
                (m.start() + 1, m.end())
            } else {
                (m.start(), m.end())
            }
        })
        .collect()
}

/// A new literal in place of `old`: mostly of the same kind, sometimes not.
fn new_literal(rng: &mut Rng, old: &str, step: usize) -> String {
    let words = [
        "x",
        "hello world",
        "",
        "é ü",
        "tab\\tnewline\\n",
        "a,b)c",
        "#no",
    ];
    if old.starts_with('"') {
        match rng.below(10) {
            0 => format!("{}", rng.below(1000)),
            1 => "\"now {{c.port}}\"".to_string(),
            2 => format!("r\"raw {step}\""),
            3 => format!("\"\"\"multi\nline {step}\"\"\""),
            _ => format!("\"{} {step}\"", words[rng.below(words.len())]),
        }
    } else {
        match rng.below(8) {
            0 => format!("\"{step}\""),
            1 => format!("{}.5", rng.below(100)),
            _ => format!("{}", rng.below(100_000)),
        }
    }
}

/// Edit `text` once: a literal replaced (once or twice), a comment, a new statement.
fn edit(rng: &mut Rng, text: &str, step: usize, files: &Path) -> (String, String) {
    match rng.below(20) {
        0 => (
            format!("{text}# a comment at step {step}\n"),
            "comment".into(),
        ),
        1 => (
            format!(
                "{text}fs::File(host=host, path=\"{}/new{step}\", content=\"new\")\n",
                files.display()
            ),
            "new statement".into(),
        ),
        n => {
            let mut text = text.to_string();
            let mut what = Vec::new();
            // one literal mostly, sometimes two or four (several sites patched at once)
            let count = match n {
                2..=4 => 2,
                5 => 4,
                _ => 1,
            };
            for _ in 0..count {
                let lits = literals(&text);
                // half the time one of the contents and modes (most of them patch)
                let favoured: Vec<(usize, usize)> = lits
                    .iter()
                    .copied()
                    .filter(|(s, _)| {
                        text[..*s].ends_with("content=") || text[..*s].ends_with("mode=")
                    })
                    .collect();
                let (start, end) = if rng.below(2) == 0 && !favoured.is_empty() {
                    favoured[rng.below(favoured.len())]
                } else {
                    lits[rng.below(lits.len())]
                };
                let old = text[start..end].to_string();
                let new = new_literal(rng, &old, step);
                what.push(format!("{old} -> {new}"));
                text.replace_range(start..end, &new);
            }
            (text, what.join(", "))
        }
    }
}

#[test]
fn random_literal_edits_patch_to_the_export_a_full_compile_makes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("project");
    let files = tmp.path().join("files");
    project(&dir, &model(&files));
    let memory = cache::path(&dir, "main.cf");
    let seed = std::env::var("STEWARD_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_1234_u64);
    let mut rng = Rng(seed);
    let (first, _) = remembering(&dir, &memory);
    assert!(first.is_ok(), "{:?}", first.errors());
    assert!(
        memory.exists(),
        "a compile that read nothing unchecked is remembered"
    );
    let (mut patched, mut unchanged, mut failed) = (0, 0, 0);
    let steps = 300;
    for step in 1..=steps {
        let text = std::fs::read_to_string(dir.join("main.cf")).unwrap();
        let (next, what) = edit(&mut rng, &text, step, &files);
        std::fs::write(dir.join("main.cf"), &next).unwrap();
        let (inc, inc_printed) = remembering(&dir, &memory);
        let (whole, whole_printed) = full(&dir);
        let context = format!("seed {seed:#x}, step {step}: {what}");
        assert_eq!(
            inc.is_ok(),
            whole.is_ok(),
            "{context}: the incremental compile {} where the full one {}",
            if inc.is_ok() { "succeeded" } else { "failed" },
            if whole.is_ok() { "succeeded" } else { "failed" },
        );
        if !whole.is_ok() {
            failed += 1;
            // a model that does not compile is put back (the next edit starts from one
            // that does)
            std::fs::write(dir.join("main.cf"), &text).unwrap();
            continue;
        }
        assert_eq!(
            export_json(&inc),
            export_json(&whole),
            "{context}: the patched export differs"
        );
        assert_eq!(inc_printed, whole_printed, "{context}: printed");
        match inc.patched {
            Some(0) => unchanged += 1,
            Some(_) => patched += 1,
            None => {}
        }
    }
    eprintln!("{steps} edits: {patched} patched, {unchanged} unchanged, {failed} did not compile");
    // the test is not vacuous: patches happened, and so did full compiles
    assert!(
        patched >= steps / 8,
        "only {patched} of {steps} edits were patched"
    );
    assert!(
        failed >= steps / 20,
        "only {failed} of {steps} edits did not compile"
    );
    assert!(
        patched + unchanged + failed < steps,
        "every edit was patched: the unpatchable literals were not tried"
    );
}

/// Each literal of the model, edited alone, is patched exactly when nothing reads it.
#[test]
fn a_literal_is_patched_only_when_nothing_but_its_field_reads_it() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("project");
    let files = tmp.path().join("files");
    let model = model(&files);
    project(&dir, &model);
    let memory = cache::path(&dir, "main.cf");
    let cases: &[(&str, &str, bool)] = &[
        ("content=\"plain a\"", "content=\"plain A\"", true),
        (
            "mode=644)\nfs::File(host=host, path=",
            "mode=604)\nfs::File(host=host, path=",
            true,
        ),
        ("content=\"looped\"", "content=\"loops\"", true),
        ("content=\"fixed in impl\"", "content=\"fixed\"", true),
        ("content=\"cfg body\"", "content=\"cfg\"", true),
        ("content=\"cond\"", "content=\"conditional\"", true),
        // read: an index, a condition, an interpolation, another resource, an
        // implementation, a block, the agent, a plugin argument
        ("path=\"", "path=\"/x", false),
        ("name=\"alpha\"", "name=\"beta\"", false),
        ("port=8080", "port=8081", false),
        ("content=\"read me\"", "content=\"read\"", false),
        ("motd=\"hello\"", "motd=\"hi\"", false),
        ("value=\"pre\"", "value=\"post\"", false),
        ("content=\"body\"", "content=\"bod\"", false),
        ("name=\"localhost\"", "name=\"otherhost\"", false),
        ("command=\"echo one\"", "command=\"echo two\"", false),
        // the type is checked: an int attribute given a string compiles in full (and fails)
        ("mode=640", "mode=\"640\"", false),
    ];
    for (old, new, patchable) in cases {
        std::fs::write(dir.join("main.cf"), &model).unwrap();
        let _ = std::fs::remove_file(&memory);
        let (first, _) = remembering(&dir, &memory);
        assert!(first.is_ok());
        assert!(model.contains(old), "{old}");
        std::fs::write(dir.join("main.cf"), model.replacen(old, new, 1)).unwrap();
        let (inc, _) = remembering(&dir, &memory);
        let (whole, _) = full(&dir);
        assert_eq!(export_json(&inc), export_json(&whole), "{old} -> {new}");
        assert_eq!(
            inc.patched.is_some(),
            *patchable,
            "{old} -> {new}: patched {:?}",
            inc.patched
        );
        if *patchable {
            assert_eq!(
                inc.patched,
                Some(if *old == "content=\"looped\"" { 2 } else { 1 })
            );
        }
    }
    // two sites in one edit: both patched
    std::fs::write(dir.join("main.cf"), &model).unwrap();
    let _ = std::fs::remove_file(&memory);
    assert!(remembering(&dir, &memory).0.is_ok());
    let two = model
        .replacen("content=\"plain a\"", "content=\"first\"", 1)
        .replacen("content=\"cfg body\"", "content=\"second one\"", 1)
        .replacen("mode=700", "mode=7", 1);
    std::fs::write(dir.join("main.cf"), &two).unwrap();
    let (inc, _) = remembering(&dir, &memory);
    assert_eq!(inc.patched, Some(3));
    assert_eq!(export_json(&inc), export_json(&full(&dir).0));
    // and then one of them again, from the memory the patch left
    std::fs::write(
        dir.join("main.cf"),
        two.replacen("\"second one\"", "\"2\"", 1),
    )
    .unwrap();
    let (inc, _) = remembering(&dir, &memory);
    assert_eq!(inc.patched, Some(1));
    assert_eq!(export_json(&inc), export_json(&full(&dir).0));
}

/// The memory notices what the model read besides its main file: a module's file, and an
/// environment variable; a model using Python plugins is not remembered.
#[test]
fn the_memory_is_not_used_when_a_module_or_a_variable_the_model_read_changed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("project");
    let files = tmp.path().join("files");
    let f = files.display();
    project(
        &dir,
        &format!(
            "import fs\nimport conf\nhost = std::Host(name=\"localhost\", os=std::linux)\n\
             fs::File(host=host, path=\"{f}/a\", content=conf::greeting, mode=644)\n\
             fs::File(host=host, path=\"{f}/b\", content=std::get_env(\"INC_TEST_VALUE\", \"none\"))\n\
             fs::File(host=host, path=\"{f}/c\", content=\"plain\")\n"
        ),
    );
    let module = dir.join("libs/conf");
    std::fs::create_dir_all(module.join("model")).unwrap();
    std::fs::write(module.join("module.yml"), "name: conf\nversion: 1.0.0\n").unwrap();
    std::fs::write(module.join("model/_init.cf"), "greeting = \"hello\"\n").unwrap();
    // a link back up in the module: stamped, not walked into
    std::os::unix::fs::symlink(&module, module.join("loop")).unwrap();
    let memory = cache::path(&dir, "main.cf");
    // SAFETY: this test alone reads and writes INC_TEST_VALUE
    unsafe { std::env::set_var("INC_TEST_VALUE", "one") };
    let (first, _) = remembering(&dir, &memory);
    assert_eq!(content_of(&first, "b"), "one");
    assert!(memory.exists());

    // the module's literal changes (with the same length: the stamp has the time too)
    std::thread::sleep(std::time::Duration::from_millis(10));
    std::fs::write(module.join("model/_init.cf"), "greeting = \"howdy\"\n").unwrap();
    let (second, _) = remembering(&dir, &memory);
    assert_eq!(second.patched, None, "a module's file changed");
    assert_eq!(content_of(&second, "a"), "howdy");

    // the variable changes
    unsafe { std::env::set_var("INC_TEST_VALUE", "two") };
    let (third, _) = remembering(&dir, &memory);
    assert_eq!(third.patched, None, "a variable the model read changed");
    assert_eq!(content_of(&third, "b"), "two");

    // and with nothing changed, the memory is used, and a plain literal patches
    let (fourth, _) = remembering(&dir, &memory);
    assert_eq!(fourth.patched, Some(0));
    let main = std::fs::read_to_string(dir.join("main.cf")).unwrap();
    std::fs::write(
        dir.join("main.cf"),
        main.replace("\"plain\"", "\"plainer\""),
    )
    .unwrap();
    let (fifth, _) = remembering(&dir, &memory);
    assert_eq!(fifth.patched, Some(1));
    assert_eq!(content_of(&fifth, "c"), "plainer");
    assert_eq!(content_of(&fifth, "b"), "two");
    unsafe { std::env::remove_var("INC_TEST_VALUE") };
}

fn steward(dir: &Path, args: &[&str]) -> std::process::Output {
    std::process::Command::new(steward_bin())
        .args(args)
        .arg("-p")
        .arg(dir)
        .env("STEWARD_LOG", "steward=debug")
        .output()
        .unwrap()
}

/// `steward export -j` patches, says so in its log, and writes what `--full` writes.
#[test]
fn export_patches_the_last_export_and_full_compiles_it_whole() {
    let tmp = tempfile::tempdir().unwrap();
    let dir: PathBuf = tmp.path().join("project");
    let files = tmp.path().join("files");
    let model = model(&files);
    project(&dir, &model);
    let out = tmp.path().join("out.json");
    let out_full = tmp.path().join("out-full.json");
    let o = steward(&dir, &["export", "-j", out.to_str().unwrap()]);
    assert!(o.status.success(), "{}", crate::support::output_text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("compiled in full"),
        "{}",
        crate::support::output_text(&o)
    );
    std::fs::write(
        dir.join("main.cf"),
        model.replace("\"plain a\"", "\"plain b\""),
    )
    .unwrap();
    let o = steward(&dir, &["export", "-j", out.to_str().unwrap()]);
    let log = crate::support::output_text(&o);
    assert!(o.status.success(), "{log}");
    assert!(
        log.contains("compile patched from the last one's memory"),
        "{log}"
    );
    let o = steward(
        &dir,
        &["export", "--full", "-j", out_full.to_str().unwrap()],
    );
    assert!(o.status.success(), "{}", crate::support::output_text(&o));
    let read =
        |p: &Path| -> ExportFile { serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap() };
    let (patched, whole) = (read(&out), read(&out_full));
    assert_eq!(
        serde_json::to_value(&patched).unwrap(),
        serde_json::to_value(&whole).unwrap()
    );
    assert!(std::fs::read_to_string(&out).unwrap().contains("plain b"));
    // byte for byte the same file
    assert_eq!(
        std::fs::read(&out).unwrap(),
        std::fs::read(&out_full).unwrap()
    );
}

/// `steward export` to a server: a patched export goes as the resources the patch changed,
/// and the server stores what a full compile's export would be. When the server's newest
/// version is not the one the patch is based on, the export goes as any export does.
#[tokio::test(flavor = "multi_thread")]
async fn an_exported_patch_stores_the_version_a_full_compile_would() {
    let (srv, c, env, dir) =
        crate::deploy::deploying_env("incremental", serde_json::json!({})).await;
    let project_dir = dir.path().join("project");
    let files = dir.path().join("files");
    let model = model(&files);
    project(&project_dir, &model);
    let export = |extra: &[&str]| {
        let o = std::process::Command::new(steward_bin())
            .arg("export")
            .args(extra)
            .arg("-p")
            .arg(&project_dir)
            .env("STEWARD_SERVER", &srv.url)
            .env("STEWARD_TOKEN", srv.admin.as_deref().unwrap())
            .env("STEWARD_ENV", &env)
            .env("XDG_CACHE_HOME", dir.path().join("cache"))
            .env("STEWARD_LOG", "steward=debug")
            .output()
            .unwrap();
        let text = crate::support::output_text(&o);
        assert!(o.status.success(), "{text}");
        text
    };
    // the newest stored version, by id, against what a full compile of the project exports
    let check_stored = |what: &'static str| {
        let c = &c;
        let env = &env;
        let project_dir = &project_dir;
        async move {
            let versions = c.versions(env).await.unwrap();
            let newest = versions[0]["number"].as_i64().unwrap() as i32;
            let stored = c.version_resources(env, newest).await.unwrap();
            let (whole, _) = full(project_dir);
            let Ok(Some(whole)) = whole.result else {
                panic!("{what}: the model compiles")
            };
            assert_eq!(stored.len(), whole.resources.len(), "{what}");
            for r in &whole.resources {
                let s = stored
                    .iter()
                    .find(|s| s.resource_id == r.id.0)
                    .unwrap_or_else(|| panic!("{what}: {} stored", r.id));
                assert_eq!(
                    s.attributes,
                    serde_json::Value::Object(r.attributes.clone()),
                    "{what}: {}",
                    r.id
                );
            }
        }
    };
    let first = export(&[]);
    assert!(first.contains("compiled in full"), "{first}");
    check_stored("the first export").await;

    std::fs::write(
        project_dir.join("main.cf"),
        model
            .replace("\"plain a\"", "\"plain b\"")
            .replace("mode=700", "mode=711"),
    )
    .unwrap();
    let second = export(&[]);
    assert!(
        second.contains("compile patched from the last one's memory"),
        "{second}"
    );
    assert!(
        second.contains("uploaded the changes of a patched export"),
        "{second}"
    );
    assert!(second.contains("sent as its changes"), "{second}");
    check_stored("a patch sent as its changes").await;

    // another version arrives meanwhile: the patch's base is not the newest any more
    let (other, _) = full(&project_dir);
    let Ok(Some(other)) = other.result else {
        panic!()
    };
    c.upload(&env, &other, serde_json::json!({})).await.unwrap();
    std::fs::write(
        project_dir.join("main.cf"),
        model
            .replace("\"plain a\"", "\"plain c\"")
            .replace("mode=700", "mode=711"),
    )
    .unwrap();
    let third = export(&[]);
    assert!(
        third.contains("compile patched from the last one's memory"),
        "{third}"
    );
    assert!(
        !third.contains("uploaded the changes of a patched export"),
        "{third}"
    );
    check_stored("a patch whose base moved").await;

    // and the next one fits again
    std::fs::write(
        project_dir.join("main.cf"),
        model
            .replace("\"plain a\"", "\"plain d\"")
            .replace("mode=700", "mode=711"),
    )
    .unwrap();
    let fourth = export(&[]);
    assert!(
        fourth.contains("uploaded the changes of a patched export"),
        "{fourth}"
    );
    check_stored("a patch after one whose base moved").await;
}

/// A template the model renders is an input: the memory notices when it changes, and a
/// literal beside it still patches.
#[test]
fn a_template_the_model_renders_is_checked_by_the_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("project");
    let f = tmp.path().join("files");
    let f = f.display();
    project(
        &dir,
        &format!(
            "import fs\nhost = std::Host(name=\"localhost\", os=std::linux)\n\
             port = 8080\n\
             fs::File(host=host, path=\"{f}/conf\", content=std::template(\"inc/site.j2\"))\n\
             fs::File(host=host, path=\"{f}/plain\", content=\"plain\")\n"
        ),
    );
    std::fs::create_dir_all(dir.join("templates")).unwrap();
    std::fs::write(dir.join("templates/site.j2"), "listen {{ port }}\n").unwrap();
    let memory = cache::path(&dir, "main.cf");
    let (first, _) = remembering(&dir, &memory);
    assert_eq!(content_of(&first, "conf"), "listen 8080");
    assert!(
        memory.exists(),
        "a model rendering a template is remembered"
    );
    std::thread::sleep(std::time::Duration::from_millis(10));
    std::fs::write(dir.join("templates/site.j2"), "listen {{ port }};\n").unwrap();
    let (second, _) = remembering(&dir, &memory);
    assert_eq!(second.patched, None, "the template changed");
    assert_eq!(content_of(&second, "conf"), "listen 8080;");
    // the variable the template reads is read: its literal is not a site
    let main = std::fs::read_to_string(dir.join("main.cf")).unwrap();
    std::fs::write(
        dir.join("main.cf"),
        main.replace("port = 8080", "port = 8081"),
    )
    .unwrap();
    let (third, _) = remembering(&dir, &memory);
    assert_eq!(third.patched, None);
    assert_eq!(content_of(&third, "conf"), "listen 8081;");
    let main = std::fs::read_to_string(dir.join("main.cf")).unwrap();
    std::fs::write(
        dir.join("main.cf"),
        main.replace("\"plain\"", "\"plainer\""),
    )
    .unwrap();
    let (fourth, _) = remembering(&dir, &memory);
    assert_eq!(fourth.patched, Some(1));
    assert_eq!(content_of(&fourth, "plain"), "plainer");
    assert_eq!(content_of(&fourth, "conf"), "listen 8081;");
}
