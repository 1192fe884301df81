//! The export file as the compiler writes it: JSON with one resource per line.
//!
//! ```text
//! {"format":1,"resources":[
//! {"id":"fs::File[localhost,path=/a]",…},
//! {"id":"fs::File[localhost,path=/b]",…}
//! ],"undefined":[],"metadata":{…}}
//! ```
//!
//! It is the same document as any other JSON layout of it. The layout is for readers that
//! kept the previous export's lines (the server compiling a commit of a branch it compiled
//! before): an unchanged resource is the same bytes, so only the lines that differ are
//! parsed. JSON strings can not hold a raw line end (it is written `\n`), so a line is
//! always one resource. People get a file that `diff` and `grep` read resource by resource.

use std::io::Write;

use super::{ExportFile, Resource};

/// What the first line ends with.
const OPENING: &[u8] = b"\"resources\":[";

/// The shortest line a resource can have: `{"id":"","type":"","agent":"","attributes":{}}`
/// with its comma.
const SHORTEST_LINE: usize = 47;

/// Write `export` in this layout. An export without resources is one line.
pub fn write(export: &ExportFile, w: &mut impl Write) -> std::io::Result<()> {
    let rest = ExportFile {
        resources: Vec::new(),
        undefined: export.undefined.clone(),
        metadata: export.metadata.clone(),
        handlers: export.handlers.clone(),
        code: export.code.clone(),
        unknowns: export.unknowns.clone(),
        format: export.format,
    };
    let text = serde_json::to_vec(&rest)?;
    // `format` is a number and comes first: the first `"resources":[]` is the field
    let at = find(&text, b"\"resources\":[]").expect("an export has resources");
    let (head, tail) = (&text[..at + OPENING.len()], &text[at + OPENING.len()..]);
    if export.resources.is_empty() {
        return w.write_all(&text);
    }
    w.write_all(head)?;
    for (i, r) in export.resources.iter().enumerate() {
        w.write_all(if i == 0 { b"\n" } else { b",\n" })?;
        serde_json::to_writer(&mut *w, r)?;
    }
    w.write_all(b"\n")?;
    w.write_all(tail)
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// An export file in this layout, split: its resources' lines, unparsed, and the rest of it.
pub struct Lines<'a> {
    /// Everything but the resources (which are left empty).
    pub rest: ExportFile,
    /// Each resource's JSON, without the line end or the comma.
    pub resources: Vec<&'a [u8]>,
}

impl Lines<'_> {
    /// Parse one resource's line.
    pub fn resource(line: &[u8]) -> Result<Resource, serde_json::Error> {
        serde_json::from_slice(line)
    }

    /// Parse every resource (on the machine's cores) into the whole export.
    pub fn parse_all(self) -> Result<ExportFile, serde_json::Error> {
        let parsed = super::par_map(&self.resources, |l| Self::resource(l));
        let mut export = self.rest;
        export.resources = parsed.into_iter().collect::<Result<_, _>>()?;
        Ok(export)
    }
}

/// `text` split into its resources' lines, or `None` when it is not in this layout (written
/// by something else: it is then parsed whole). An error: in this layout, but what is not a
/// resource's line does not parse.
pub fn split(text: &[u8]) -> Option<Result<Lines<'_>, serde_json::Error>> {
    let (head, middle, tail) = parts(text)?;
    // every line costs the reader a slice and a hash: a file of a given size has at most so
    // many resources' lines, however it was written (the server reads what a commit's
    // compile left, up to 256 MiB: as two-byte lines that was gigabytes)
    let most = middle.len() / SHORTEST_LINE + 1;
    // (the line ends found with the vector search, in one pass: 100,000 lines, 32 MB, in a
    // few ms; the room guessed from the size, grown if the lines are shorter)
    let mut resources: Vec<&[u8]> = Vec::with_capacity((middle.len() / 256 + 1).min(most));
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', middle) {
        if resources.len() + 1 >= most {
            return Some(Err(too_many_lines(middle.len())));
        }
        resources.push(middle[start..end].strip_suffix(b",")?);
        start = end + 1;
    }
    resources.push(&middle[start..]);
    Some(rest_of(head, tail).map(|rest| Lines { rest, resources }))
}

fn too_many_lines(bytes: usize) -> serde_json::Error {
    serde::de::Error::custom(format!(
        "more resource lines than fit in {bytes} bytes: a resource's line is at least {SHORTEST_LINE} bytes"
    ))
}

/// Everything in `text` but its resources, without looking at their lines (`None`: not in
/// this layout).
pub fn rest(text: &[u8]) -> Option<Result<ExportFile, serde_json::Error>> {
    let (head, _, tail) = parts(text)?;
    Some(rest_of(head, tail))
}

/// The first line, the resources' lines and the last line of `text`.
fn parts(text: &[u8]) -> Option<(&[u8], &[u8], &[u8])> {
    // a file ends with a line end
    let text = text.strip_suffix(b"\n").unwrap_or(text);
    let first = memchr::memchr(b'\n', text)?;
    let last = memchr::memrchr(b'\n', text)?;
    let head = &text[..first];
    let tail = &text[last + 1..];
    if !head.ends_with(OPENING) || !tail.starts_with(b"]") || last <= first {
        return None;
    }
    Some((head, &text[first + 1..last], tail))
}

/// The document with no resources.
fn rest_of(head: &[u8], tail: &[u8]) -> Result<ExportFile, serde_json::Error> {
    let mut rest = Vec::with_capacity(head.len() + tail.len());
    rest.extend_from_slice(head);
    rest.extend_from_slice(tail);
    serde_json::from_slice::<ExportFile>(&rest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ExportMetadata, ResourceId};

    fn export(n: usize) -> ExportFile {
        ExportFile {
            format: 1,
            resources: (0..n)
                .map(|i| Resource {
                    id: ResourceId(format!("fs::File[h,path=/f{i}]")),
                    type_name: "fs::File".into(),
                    agent: "h".into(),
                    attributes: serde_json::json!({
                        "path": format!("/f{i}"),
                        // line ends, a nested "resources":[] and brackets inside values
                        "content": format!("line one\nline two {i}\n\"resources\":[]\n],"),
                        "nested": {"resources": [], "x": [1, {"y": "]"}]},
                    })
                    .as_object()
                    .unwrap()
                    .clone(),
                    requires: if i > 0 {
                        vec![ResourceId(format!("fs::File[h,path=/f{}]", i - 1))]
                    } else {
                        vec![]
                    },
                })
                .collect(),
            undefined: vec![ResourceId("fs::File[h,path=/f0]".into())],
            metadata: ExportMetadata::default(),
            handlers: Default::default(),
            code: [("\"resources\":[]".to_string(), "x\n]".to_string())].into(),
            unknowns: vec![],
        }
    }

    #[test]
    fn one_resource_per_line_and_the_same_document() {
        for n in [0, 1, 2, 5] {
            let e = export(n);
            let mut text = Vec::new();
            write(&e, &mut text).unwrap();
            if n == 2 {
                // as a file ends
                text.push(b'\n');
            }
            // the same document as any JSON layout
            let read: ExportFile = serde_json::from_slice(&text).unwrap();
            assert_eq!(
                serde_json::to_value(&read).unwrap(),
                serde_json::to_value(&e).unwrap()
            );
            let lines = text.iter().filter(|&&b| b == b'\n').count() - usize::from(n == 2);
            if n == 0 {
                assert_eq!(lines, 0);
                assert!(split(&text).is_none(), "one line: read whole");
                continue;
            }
            assert_eq!(lines, n + 1, "{}", String::from_utf8_lossy(&text));
            let split = split(&text).unwrap().unwrap();
            assert_eq!(split.resources.len(), n);
            for (line, r) in split.resources.iter().zip(&e.resources) {
                assert_eq!(*line, serde_json::to_vec(r).unwrap().as_slice());
            }
            assert!(split.rest.resources.is_empty());
            assert_eq!(split.rest.code, e.code);
            assert_eq!(split.rest.undefined, e.undefined);
            let whole = split.parse_all().unwrap();
            assert_eq!(
                serde_json::to_value(&whole).unwrap(),
                serde_json::to_value(&e).unwrap()
            );
        }
    }

    #[test]
    fn other_layouts_are_read_whole() {
        let e = export(3);
        let compact = serde_json::to_vec(&e).unwrap();
        assert!(split(&compact).is_none());
        let pretty = serde_json::to_vec_pretty(&e).unwrap();
        assert!(split(&pretty).is_none());
        // two resources on one line: the line is not one resource
        let mut text = Vec::new();
        write(&e, &mut text).unwrap();
        let s = String::from_utf8(text).unwrap();
        let joined = s.replacen(",\n", ",", 1);
        let lines = split(joined.as_bytes()).unwrap().unwrap();
        assert_eq!(lines.resources.len(), 2);
        assert!(Lines::resource(lines.resources[0]).is_err());
        // a line without its comma is not this layout
        let cut = s.replacen(",\n", "\n", 1);
        assert!(split(cut.as_bytes()).is_none());
        // the rest does not parse
        let broken = s.replace("\"undefined\"", "\"undefined");
        assert!(split(broken.as_bytes()).unwrap().is_err());
    }

    #[test]
    fn more_lines_than_resources_fit_in_the_file_are_refused_before_they_are_kept() {
        // the shortest resources there are, one per line: read
        let shortest = r#"{"id":"","type":"","agent":"","attributes":{}}"#;
        assert_eq!(shortest.len() + 1, SHORTEST_LINE);
        let mut none = Vec::new();
        write(&export(0), &mut none).unwrap();
        let none = String::from_utf8(none).unwrap();
        let file = |line: &str, n: usize| {
            let lines = format!("\"resources\":[\n{}\n]", vec![line; n].join(",\n"));
            none.replacen("\"resources\":[]", &lines, 1) + "\n"
        };
        for n in [1, 2, 1000] {
            let text = file(shortest, n);
            let lines = split(text.as_bytes()).unwrap().unwrap();
            assert_eq!(lines.resources.len(), n);
        }
        // shorter lines: more than the file can hold, refused as a whole
        let e = match split(file("{}", 1000).as_bytes()) {
            Some(Err(e)) => e.to_string(),
            _ => panic!("1,000 lines of 3 bytes were taken"),
        };
        assert!(e.contains("more resource lines than fit in"), "{e}");
    }
}
