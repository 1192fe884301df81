//! The server's incremental compile (src/sources/compile/patch.rs): a pushed commit that
//! changes only literals of `main.cf` is patched from the last compile, without a checkout
//! or a compiler run, and stores what a full compile of it stores; anything else compiles in
//! full. What a commit's own code writes is never taken for the compiler's memory.

use std::collections::BTreeMap;

use serde_json::json;

use crate::gitops_support::{Repo, compiled, export_here, follow, read, webhook_url};
use crate::support::{Rng, TestServer, wait_deployed};

/// The detail of a report's stage `name`.
fn detail(report: &serde_json::Value, name: &str) -> String {
    report["stages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .map(|s| s["detail"].as_str().unwrap().to_string())
        .unwrap_or_default()
}

fn stage_names(report: &serde_json::Value) -> Vec<String> {
    report["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_string())
        .collect()
}

/// A version's resources by id, with their attributes.
async fn resources(
    c: &steward::client::Client,
    env: &str,
    n: i32,
) -> BTreeMap<String, serde_json::Value> {
    c.version_resources(env, n)
        .await
        .unwrap()
        .into_iter()
        .map(|r| (r.resource_id, json!([r.hash, r.requires, r.undefined])))
        .collect()
}

/// What a step of the random sequence changes.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Edit {
    /// one file's content (a literal): patched
    Content,
    /// two files' contents at once: patched
    TwoContents,
    /// a file's mode (an integer literal): patched
    Mode,
    /// nothing in the project (an empty commit): patched, nothing changed
    Nothing,
    /// a file added (a new constructor): compiled in full
    NewFile,
    /// a file of the project other than main.cf: compiled in full
    OtherFile,
}

/// A random sequence of pushes. Those that change only literals of `main.cf` are patched
/// (the compile stage says so; no checkout ran) and the others compile in full; each
/// version has the content hash and resources that a full compile of the same commit,
/// stored whole in another environment, has; its files are deployed with their contents
/// and modes.
#[tokio::test(flavor = "multi_thread")]
async fn literal_edits_are_patched_and_store_what_a_full_compile_stores() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let whole = c
        .create_environment("whole", "whole", None)
        .await
        .unwrap()
        .id
        .to_string();
    let mut rng = Rng(0x0DDB_A11C_0FFE_E123);
    // name -> (content, mode)
    let mut files: BTreeMap<String, (String, u32)> = (0..6)
        .map(|i| (format!("f{i}"), (format!("v0-{i}"), 644)))
        .collect();
    let model = |files: &BTreeMap<String, (String, u32)>| {
        let mut m =
            String::from("import fs\nhost = std::Host(name=\"localhost\", os=std::linux)\n");
        for (name, (content, mode)) in files {
            m.push_str(&format!(
                "fs::File(host=host, path=\"{}/{name}\", content=\"{content}\", mode={mode})\n",
                repo.out.display()
            ));
        }
        m
    };
    let mut env: Option<String> = None;
    let mut next = 6;
    let mut counts: BTreeMap<String, usize> = BTreeMap::new();
    for step in 0..16 {
        let edit = match step {
            0 => Edit::NewFile,
            // each kind at least once, then at random
            1 => Edit::Content,
            2 => Edit::OtherFile,
            3 => Edit::Content,
            4 => Edit::Mode,
            5 => Edit::Nothing,
            6 => Edit::NewFile,
            7 => Edit::TwoContents,
            _ => [
                Edit::Content,
                Edit::Content,
                Edit::TwoContents,
                Edit::Mode,
                Edit::NewFile,
                Edit::OtherFile,
            ][rng.below(6)],
        };
        let names: Vec<String> = files.keys().cloned().collect();
        let mut pick = || names[rng.below(names.len())].clone();
        match edit {
            Edit::Content => {
                let f = pick();
                files.get_mut(&f).unwrap().0 = format!("v{step}-{f}");
            }
            Edit::TwoContents => {
                let (a, b) = (pick(), pick());
                files.get_mut(&a).unwrap().0 = format!("v{step}-a");
                files.get_mut(&b).unwrap().0 = format!("v{step}-long-{}", "x".repeat(step));
            }
            Edit::Mode => {
                let f = pick();
                let m = &mut files.get_mut(&f).unwrap().1;
                *m = if *m == 644 { 600 } else { 644 };
            }
            Edit::Nothing => {}
            Edit::NewFile if step > 0 => {
                files.insert(format!("f{next}"), (format!("new-{next}"), 644));
                next += 1;
            }
            Edit::NewFile => {}
            Edit::OtherFile => {
                std::fs::write(repo.work.join("README"), format!("step {step}\n")).unwrap();
            }
        }
        let commit = repo.commit(&model(&files), &format!("step {step}: {edit:?}"));
        let env = match &env {
            Some(e) => {
                repo.push_ok();
                e
            }
            None => {
                let e = follow(&c, "patched", &repo, json!({})).await;
                repo.install_post_receive(&webhook_url(&srv.url, &e), "s3cret");
                repo.push_ok();
                env.insert(e)
            }
        };
        let report = compiled(&c, env, &commit, 30).await;
        assert_eq!(report["status"], "success", "step {step}: {report:#}");
        let compile = detail(&report, "compile");
        let patched = !matches!(edit, Edit::NewFile | Edit::OtherFile);
        if patched {
            assert!(
                compile.contains("patched from the compile of"),
                "step {step} ({edit:?}): {compile}"
            );
            assert!(
                !stage_names(&report).contains(&"checkout".to_string()),
                "step {step}: {report:#}"
            );
            let changed = match edit {
                Edit::Nothing => "0 changed",
                Edit::TwoContents => "",
                _ => "1 changed",
            };
            assert!(compile.contains(changed), "step {step}: {compile}");
        } else {
            assert!(
                compile.contains("the compiler ran"),
                "step {step} ({edit:?}): {compile}"
            );
            if step > 0 && edit == Edit::OtherFile {
                assert!(
                    compile
                        .contains("not patched from the last compile: more than main.cf changed"),
                    "step {step}: {compile}"
                );
            }
        }
        *counts.entry(format!("{edit:?}")).or_default() += 1;
        let v = report["version"].as_i64().unwrap() as i32;

        // the same commit compiled in full, stored whole
        let w = c
            .upload(&whole, &export_here(&repo), json!({}))
            .await
            .unwrap()["number"]
            .as_i64()
            .unwrap() as i32;
        let (gv, wv) = (
            c.version(env, v).await.unwrap(),
            c.version(&whole, w).await.unwrap(),
        );
        assert_eq!(gv["content_hash"], wv["content_hash"], "step {step}");
        assert_eq!(
            resources(&c, env, v).await,
            resources(&c, &whole, w).await,
            "step {step}"
        );
        wait_deployed(&c, env, v, 30).await;
        for (name, (content, mode)) in &files {
            let path = repo.out.join(name);
            assert_eq!(
                read(&path).as_deref(),
                Some(content.as_str()),
                "step {step}: {name}"
            );
            use std::os::unix::fs::PermissionsExt;
            let on_disk = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(
                format!("{on_disk:o}"),
                mode.to_string(),
                "step {step}: {name}"
            );
        }
    }
    eprintln!("edits: {counts:?}");
}

/// A project in a sub-directory of the repository (the source's `path`): a commit changing
/// only what is beside it is patched with nothing changed (its project is the same tree), a
/// literal inside it is patched, and what the model prints is in the report as a compile's
/// output is.
#[tokio::test(flavor = "multi_thread")]
async fn a_project_in_a_sub_directory_is_patched_by_its_own_tree() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let model = |content: &str| {
        format!(
            "import fs\nhost = std::Host(name=\"localhost\", os=std::linux)\n\
             std::print(\"deploying\")\n\
             fs::File(host=host, path=\"{}/sub\", content=\"{content}\", mode=644)\n",
            repo.out.display()
        )
    };
    let first = repo.commit_in("site", &model("one"), "first");
    let env = follow(&c, "sub", &repo, json!({"path": "site"})).await;
    repo.install_post_receive(&webhook_url(&srv.url, &env), "s3cret");
    repo.push_ok();
    let report = compiled(&c, &env, &first, 30).await;
    assert_eq!(report["status"], "success", "{report:#}");
    assert!(detail(&report, "compile").contains("the compiler ran"));

    // beside the project: the same tree, nothing changed
    std::fs::write(repo.work.join("NOTES"), "not the project\n").unwrap();
    let beside = repo.commit_in("site", &model("one"), "notes");
    repo.push_ok();
    let report = compiled(&c, &env, &beside, 30).await;
    assert_eq!(report["status"], "success", "{report:#}");
    let compile = detail(&report, "compile");
    assert!(
        compile.contains("1 resources, 0 changed: patched"),
        "{compile}"
    );
    assert_eq!(
        report["stdout"].as_str().unwrap(),
        "deploying\n",
        "{report:#}"
    );

    let second = repo.commit_in("site", &model("two"), "second");
    repo.push_ok();
    let report = compiled(&c, &env, &second, 30).await;
    assert_eq!(report["status"], "success", "{report:#}");
    let compile = detail(&report, "compile");
    assert!(
        compile.contains("1 resources, 1 changed: patched"),
        "{compile}"
    );
    let v = report["version"].as_i64().unwrap() as i32;
    wait_deployed(&c, &env, v, 30).await;
    assert_eq!(read(&repo.out.join("sub")).as_deref(), Some("two"));
}

const EVIL_CF: &str =
    "# a module whose plugin leaves a file where the server reads the compiler's\n";

/// The plugin: it shouts, and leaves `forged.bin` (beside the module) in the compile's
/// workdir under the name of the compiler's sites file.
const EVIL_PY: &str = r#"
import os
import shutil

from inmanta.plugins import plugin


@plugin
def shout(s: "string") -> "string":
    forged = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "forged.bin")
    shutil.copyfile(forged, os.path.join(os.getcwd(), os.pardir, "sites"))
    return s.upper()
"#;

/// A project whose plugin forges the compiler's sites file (see
/// [`a_sites_file_a_commits_code_writes_is_never_used`]): its first commit, with the word
/// `hello`; `main(word)` is its main file with another word.
fn forging_project(repo: &Repo) -> (String, impl Fn(&str) -> String + '_) {
    use steward::compiler::incremental::{PatchSites, Site, SiteType, Target, cache};
    let main = |word: &str| {
        format!(
            "import fs\nimport evil\nhost = std::Host(name=\"localhost\", os=std::linux)\n\
             fs::File(host=host, path=\"{}/shout\", content=evil::shout(\"{word}\"), mode=644)\n",
            repo.out.display()
        )
    };
    // the forged memory: the literal "hello" of this very main.cf, into the content of the
    // export's first (only) resource
    let first = main("hello");
    let start = first.find("\"hello\"").unwrap() as u32;
    let sites = PatchSites {
        sites: vec![Site {
            start,
            end: start + 7,
            ty: SiteType::String,
            targets: vec![Target {
                resource: 0,
                field: 0,
            }],
        }],
        fields: vec!["content".into()],
    };
    let lib = repo.work.join("libs/evil");
    std::fs::create_dir_all(lib.join("model")).unwrap();
    std::fs::create_dir_all(lib.join("plugins")).unwrap();
    std::fs::write(lib.join("module.yml"), "name: evil\nversion: 1.0.0\n").unwrap();
    std::fs::write(lib.join("model/_init.cf"), EVIL_CF).unwrap();
    std::fs::write(lib.join("plugins/__init__.py"), EVIL_PY).unwrap();
    cache::save(
        &lib.join("forged.bin"),
        &cache::Memory {
            generation: cache::new_generation(),
            key: cache::Key::new(&repo.work, "main.cf", &Default::default(), None),
            inputs: Default::default(),
            main: first.as_bytes(),
            sites: &sites,
            export: &[],
        },
    )
    .unwrap();
    let commit = repo.commit(&first, "a plugin that forges the compiler's memory");
    (commit, main)
}

/// The attack on the memory: a commit whose plugin writes a well-formed sites file where
/// the compiler writes its own, claiming that the literal a plugin reads goes as it is into
/// a file's content. If the server kept it, the next commit changing that literal would be
/// patched to the literal (`bye`) where the model says the plugin's answer (`BYE`).
#[tokio::test(flavor = "multi_thread")]
async fn a_sites_file_a_commits_code_writes_is_never_used() {
    let srv = TestServer::start_deploying().await;
    let c = srv.admin_client();
    let repo = Repo::new();
    let (commit, main) = forging_project(&repo);
    let env = follow(&c, "forged", &repo, json!({})).await;
    repo.install_post_receive(&webhook_url(&srv.url, &env), "s3cret");
    repo.push_ok();
    let report = compiled(&c, &env, &commit, 60).await;
    assert_eq!(report["status"], "success", "{report:#}");
    let v = report["version"].as_i64().unwrap() as i32;
    wait_deployed(&c, &env, v, 30).await;
    assert_eq!(read(&repo.out.join("shout")).as_deref(), Some("HELLO"));

    // only the literal changes: the commit is compiled, and the plugin's answer deployed
    let commit = repo.commit(&main("bye"), "another word");
    repo.push_ok();
    let report = compiled(&c, &env, &commit, 60).await;
    assert_eq!(report["status"], "success", "{report:#}");
    let compile = detail(&report, "compile");
    let v = report["version"].as_i64().unwrap() as i32;
    wait_deployed(&c, &env, v, 30).await;
    assert_eq!(
        read(&repo.out.join("shout")).as_deref(),
        Some("BYE"),
        "{compile}"
    );
    assert!(compile.contains("the compiler ran"), "{compile}");
}

/// The same attack on a server run by an ordinary user (its compiles as that user, in
/// namespaces), and that such a server patches a project with no code: the version the
/// forged memory would make is never stored, the one a literal edit makes is.
#[tokio::test(flavor = "multi_thread")]
async fn a_server_that_is_not_root_patches_but_never_from_a_forged_sites_file() {
    use crate::attacker::unprivileged::{NOBODY, open_to, unprivileged_server};
    let test = "a_server_that_is_not_root_patches_but_never_from_a_forged_sites_file";
    let Some(srv) = unprivileged_server(test).await else {
        return;
    };
    let c = srv.client.clone();
    let repo = Repo::new();
    let (first, main) = forging_project(&repo);
    repo.push_ok();
    open_to(&repo, NOBODY);
    let env = follow(&c, "forged", &repo, json!({})).await;
    let report = compiled(&c, &env, &first, 120).await;
    assert_eq!(report["status"], "success", "{report:#}");
    let second = repo.commit(&main("bye"), "another word");
    push_to_theirs(&repo);
    c.trigger_compile(&env, None).await.unwrap();
    let report = compiled(&c, &env, &second, 120).await;
    assert_eq!(report["status"], "success", "{report:#}");
    let compile = detail(&report, "compile");
    let v = report["version"].as_i64().unwrap() as i32;
    // what a full compile of the commit stores: the plugin's answer
    assert_eq!(
        resources(&c, &env, v).await,
        resources_of(&export_here(&repo)),
        "{compile}"
    );
    assert!(compile.contains("the compiler ran"), "{compile}");

    // a project with no code: its literal edit is patched by this server too
    let repo = Repo::new();
    let model = |word: &str| {
        format!(
            "import fs\nhost = std::Host(name=\"localhost\", os=std::linux)\n\
             fs::File(host=host, path=\"/nonexistent/plain\", content=\"{word}\", mode=644)\n"
        )
    };
    let first = repo.commit(&model("one"), "plain");
    repo.push_ok();
    open_to(&repo, NOBODY);
    let env = follow(&c, "plain", &repo, json!({})).await;
    let report = compiled(&c, &env, &first, 120).await;
    assert_eq!(report["status"], "success", "{report:#}");
    let second = repo.commit(&model("two"), "two");
    push_to_theirs(&repo);
    c.trigger_compile(&env, None).await.unwrap();
    let report = compiled(&c, &env, &second, 120).await;
    assert_eq!(report["status"], "success", "{report:#}");
    let compile = detail(&report, "compile");
    assert!(compile.contains("1 changed: patched"), "{compile}");
    let v = report["version"].as_i64().unwrap() as i32;
    assert_eq!(
        resources(&c, &env, v).await,
        resources_of(&export_here(&repo))
    );
}

/// Push to an origin that `open_to` gave another user (git refuses a repository another
/// user owns unless told it is safe).
fn push_to_theirs(repo: &Repo) {
    crate::gitops_support::git_ok(
        &repo.work,
        &[
            "push",
            "-q",
            "--receive-pack=git -c safe.directory=* receive-pack",
            "origin",
            "HEAD:main",
        ],
    );
}

/// An export's resources as [`resources`] lists a version's.
fn resources_of(export: &steward::model::ExportFile) -> BTreeMap<String, serde_json::Value> {
    let undefined: std::collections::HashSet<&str> =
        export.undefined.iter().map(|u| u.0.as_str()).collect();
    export
        .resources
        .iter()
        .map(|r| {
            let requires: Vec<String> = r.requires.iter().map(|q| q.0.clone()).collect();
            (
                r.id.0.clone(),
                json!([r.hash(), requires, undefined.contains(r.id.0.as_str())]),
            )
        })
        .collect()
}
