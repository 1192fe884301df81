//! Patching a memory's export: the edits that make the new main file of the old one, each
//! inside a site, and the export with the targets' fields set to the new values.

use std::path::Path;

use super::{
    Export, Key, Loaded, NextMemory, Part, Patched, SITE_RECORD, SiteType, load, new_generation,
    u32_at,
};
use crate::compiler::incremental::field_json;
use crate::model::export_lines;

/// The export of the project's current state from the memory at `path`, when the compile
/// it remembers was made with `key` and the project differs from it at most inside one
/// site. `Err` says why not (the caller compiles in full).
pub fn patch(path: &Path, key: &Key, main_path: &Path) -> Result<Patched, String> {
    let started = std::time::Instant::now();
    let loaded = load(path)?;
    let read = started.elapsed();
    if loaded.header.key != *key {
        return Err("the memory is of another compiler or other options".into());
    }
    loaded.header.inputs.unchanged()?;
    let new_main = read_whole(main_path).map_err(|e| format!("{}: {e}", main_path.display()))?;
    let patched = patch_loaded(loaded, new_main)?;
    tracing::debug!(
        read_ms = read.as_secs_f64() * 1e3,
        patched_ms = started.elapsed().as_secs_f64() * 1e3,
        "memory patched"
    );
    Ok(patched)
}

/// The file at `path`, read into a buffer whose pages are faulted in at once
/// ([`crate::alloc::populated`]: 9 MB of main file at 100,000 resources).
fn read_whole(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let len = file.metadata()?.len() as usize;
    // one more byte: a file that grew meanwhile is read to its end all the same
    let mut text = crate::alloc::populated(len + 1);
    file.read_to_end(&mut text)?;
    Ok(text)
}

/// The export of `new_main` from the memory `loaded` (see [`patch`]).
pub(super) fn patch_loaded(mut loaded: Loaded, new_main: Vec<u8>) -> Result<Patched, String> {
    let old_main = loaded.main();
    if new_main == old_main {
        let generation = loaded.header.generation;
        return Ok(Patched {
            prints: loaded.header.inputs.prints.clone(),
            lines: loaded.export.clone(),
            changed: Vec::new(),
            base_generation: generation,
            next: Some(NextMemory(None, generation)),
            count: None,
        });
    }
    let edits = edits(&loaded, old_main, &new_main)?;
    // a patch of a patch still spliced (a memory kept in this process): its export is put
    // together first
    if loaded.export.as_whole().is_none() {
        loaded.export = Export::whole(Part::whole(loaded.export.to_arc()));
    }
    let whole: &[u8] = loaded.export.as_whole().expect("put together above");
    // the export with the targets' fields set
    let lines = match export_lines::split(whole) {
        Some(Ok(lines)) => lines,
        _ => return Err("the memory's export does not read".into()),
    };
    let count = lines.resources.len();
    let mut replaced: std::collections::HashMap<usize, (Vec<u8>, crate::model::Resource)> =
        Default::default();
    for (t, json) in edits.iter().flat_map(|e| {
        let (.., first, count) = loaded.site(e.site);
        let json = field_json(&e.value);
        loaded
            .targets(first, count)
            .into_iter()
            .map(move |t| (t, json.clone()))
    }) {
        let at = t.resource as usize;
        let line = lines
            .resources
            .get(at)
            .ok_or("the memory's sites name a resource it does not have")?;
        let mut resource = match replaced.remove(&at) {
            Some((_, r)) => r,
            None => export_lines::Lines::resource(line)
                .map_err(|e| format!("the memory's export does not read ({e})"))?,
        };
        let field = loaded
            .header
            .fields
            .get(t.field as usize)
            .ok_or("a memory with broken sites")?;
        match resource.attributes.get_mut(field) {
            Some(v) => *v = json.clone(),
            None => return Err("the memory's sites name a field the resource has not".into()),
        }
        let line = serde_json::to_vec(&resource).map_err(|e| e.to_string())?;
        replaced.insert(at, (line, resource));
    }
    // where each replaced line is in the export, and its new bytes
    let base = whole.as_ptr() as usize;
    let place = |at: usize| {
        let old = lines.resources[at];
        (old.as_ptr() as usize - base, old.len())
    };
    if replaced.len() <= IN_PLACE && loaded.export.as_whole().is_some_and(Part::is_alone) {
        // a few lines, in an export nothing else holds: swapped in the export itself, each
        // moving what follows it, rather than the whole export copied (32 MB at 100,000
        // resources: its page faults alone are ~10 ms)
        let mut swaps: Vec<(usize, usize, &[u8])> = replaced
            .iter()
            .map(|(&at, (line, _))| {
                let (from, len) = place(at);
                (from, len, line.as_slice())
            })
            .collect();
        // from the last: the places of those before stay as they were
        swaps.sort_by_key(|s| std::cmp::Reverse(s.0));
        drop(lines);
        let part = loaded.export.whole_mut().expect("nothing swapped");
        let export = part.make_mut();
        for (at, len, line) in swaps {
            export.splice(at..at + len, line.iter().copied());
        }
        part.fit();
    } else {
        // the lines are swapped where they are read (mapped from the memory's file, or a
        // buffer something else holds), and the export is put together only if somebody
        // asks for the whole: a patched upload sends the changed resources only, and the
        // next memory is written in pieces
        let swaps: Vec<(usize, usize, Vec<u8>)> = replaced
            .iter()
            .map(|(&at, (line, _))| {
                let (from, len) = place(at);
                (from, len, line.clone())
            })
            .collect();
        drop(lines);
        let base = loaded.export.as_whole().expect("nothing swapped").clone();
        loaded.export = Export::spliced(base, swaps);
    }
    // each site moved with the edits before it; an edited one has its new extent (the
    // records changed where they are: sites after the first edit move)
    let records = loaded.sites.make_mut();
    let mut delta: isize = 0;
    let mut next_edit = edits.iter().peekable();
    let first = edits.first().map_or(0, |e| e.site);
    for i in first..u32_at(records, 0) as usize {
        let at = 4 + i * SITE_RECORD;
        let (start, old_end) = (
            u32_at(records, at) as isize,
            u32_at(records, at + 4) as isize,
        );
        // the start moves with the edits before the site, the end with its own too
        let start = start + delta;
        let end = match next_edit.next_if(|e| e.site == i) {
            Some(e) => {
                delta = e.new_end as isize - old_end;
                e.new_end as isize
            }
            None => old_end + delta,
        };
        records[at..at + 4].copy_from_slice(&(start as u32).to_le_bytes());
        records[at + 4..at + 8].copy_from_slice(&(end as u32).to_le_bytes());
    }
    loaded.sites.fit();
    let prints = loaded.header.inputs.prints.clone();
    let base_generation = loaded.header.generation;
    let mut changed: Vec<(usize, crate::model::Resource)> =
        replaced.into_iter().map(|(at, (_, r))| (at, r)).collect();
    changed.sort_by_key(|c| c.0);
    loaded.main = Part::whole(new_main.into());
    Ok(Patched {
        lines: loaded.export.clone(),
        changed,
        prints,
        base_generation,
        next: Some(NextMemory(Some(loaded), new_generation())),
        count: Some(count),
    })
}

/// Lines a patch swaps in the export itself at most; more, and the export is rebuilt.
const IN_PLACE: usize = 8;

/// A site whose literal is another one in the new main file.
struct SiteEdit {
    site: usize,
    /// The end of the new literal in the new file.
    new_end: usize,
    value: crate::compiler::value::Value,
}

/// How far a literal's token may reach past the site's start (a token longer than this is
/// compiled in full).
const LITERAL_WINDOW: usize = 1 << 16;

/// The edits that make `new` of `old`, when each difference is inside a site and the new
/// text there is one literal the site's attributes take; `Err` says why not.
fn edits(loaded: &Loaded, old: &[u8], new: &[u8]) -> Result<Vec<SiteEdit>, String> {
    let not_inside = || "the change is not inside a literal that can be patched".to_string();
    let mut edits: Vec<SiteEdit> = Vec::new();
    let (mut i, mut j) = (0usize, 0usize);
    loop {
        let same = common_prefix(&old[i..], &new[j..]);
        i += same;
        j += same;
        if i == old.len() && j == new.len() {
            return Ok(edits);
        }
        // the site at or before the difference, after the last one edited
        let site = last_site_at_or_before(loaded, i).ok_or_else(not_inside)?;
        if edits.last().is_some_and(|e| e.site >= site) {
            return Err(not_inside());
        }
        let (start, end, ty, ..) = loaded.site(site);
        let (start, end) = (start as usize, end as usize);
        if i > end {
            return Err(not_inside());
        }
        // where the site starts in the new file: everything between it and the last edit
        // is the same
        let new_start = j - (i - start);
        // the first byte decides where the token before it ends: the same, or a digit for a
        // digit
        if old[start] != new[new_start]
            && !(old[start].is_ascii_digit() && new[new_start].is_ascii_digit())
        {
            return Err(not_inside());
        }
        let window = &new[new_start..new.len().min(new_start + LITERAL_WINDOW)];
        let text = match std::str::from_utf8(window) {
            Ok(t) => t,
            Err(e) => std::str::from_utf8(&window[..e.valid_up_to()]).expect("valid up to"),
        };
        let token = crate::compiler::lexer::first_token(text)
            .filter(|t| t.span.start == 0 && (t.span.end as usize) < text.len())
            .ok_or("the change is not a literal any more")?;
        let value = crate::compiler::incremental::token_value(&token.tok)
            .ok_or("the change is not a literal any more")?;
        let ty = SiteType::from_u8(ty).ok_or("a memory with broken sites")?;
        if !ty.accepts(&value) {
            return Err("the new value is not of the attribute's type".into());
        }
        let new_end = new_start + token.span.end as usize;
        edits.push(SiteEdit {
            site,
            new_end,
            value,
        });
        // from the literals' ends on, the texts must be the same again
        i = end;
        j = new_end;
    }
}

/// How many bytes `a` and `b` begin with alike (compared a block at a time).
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    const BLOCK: usize = 4096;
    let n = a.len().min(b.len());
    let mut at = 0;
    while at + BLOCK <= n && a[at..at + BLOCK] == b[at..at + BLOCK] {
        at += BLOCK;
    }
    at + a[at..n]
        .iter()
        .zip(&b[at..n])
        .take_while(|(x, y)| x == y)
        .count()
}

/// The last site starting at or before byte `at` of the old main file.
fn last_site_at_or_before(loaded: &Loaded, at: usize) -> Option<usize> {
    let (mut lo, mut hi) = (0usize, loaded.site_count());
    while lo < hi {
        let mid = (lo + hi) / 2;
        if loaded.site(mid).0 as usize <= at {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    lo.checked_sub(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn common_prefix_compares_whole_blocks_and_the_rest() {
        let a = vec![7u8; 10_000];
        let mut b = a.clone();
        assert_eq!(common_prefix(&a, &b), 10_000);
        b[9_000] = 8;
        assert_eq!(common_prefix(&a, &b), 9_000);
        assert_eq!(common_prefix(&a[..5], &b), 5);
        assert_eq!(common_prefix(b"", b"x"), 0);
    }
}
