//! Bounds on what handlers report, so that one handler's output can not exhaust the
//! server's memory, its database or its leases (docs/integrations.md, "Limits").
//!
//! A handler's output is whatever its code (or the command it ran) printed: a log record, a
//! change set or a protocol line may be any size. Everything crossing a process boundary is
//! read incrementally with a limit ([`read_line_bounded`], [`HeadTail`]), and every result is
//! cut to the limits below ([`bound_result`]) by the executor that produced it and again by
//! the server that receives it (an executor on a managed machine is not trusted to have done
//! it). What is cut is replaced by a marker saying how much and why, never dropped silently.

use std::io::BufRead;

use serde_json::Value;

use super::protocol::{LogLine, WorkResult};
use crate::model::diff::AttributeChange;

/// One log record's message.
pub const MAX_LOG_MESSAGE: usize = 64 * 1024;
/// One log record's fields, as JSON.
pub const MAX_LOG_FIELDS: usize = 64 * 1024;
/// All log records of one action.
pub const MAX_ACTION_LOG: usize = 1024 * 1024;
/// One value (current or desired) of an attribute change, as JSON.
pub const MAX_CHANGE_VALUE: usize = 64 * 1024;
/// The whole change set of one action, as JSON.
pub const MAX_CHANGES: usize = 1024 * 1024;
/// The state a handler reports after an action, as JSON.
pub const MAX_STATE: usize = 1024 * 1024;
/// One line of the protocols executors and handler processes speak (a result within the
/// limits above is a few MiB at most).
pub const MAX_PROTOCOL_LINE: usize = 16 * 1024 * 1024;
/// One work item line (it carries a resource, which an upload of at most 64 MiB holds).
pub const MAX_WORK_LINE: usize = 160 * 1024 * 1024;
/// What `exec::Run` keeps of a command's stdout and of its stderr: the first and the last
/// half of this.
pub const MAX_COMMAND_OUTPUT: usize = 16 * 1024;

/// `s` cut to at most `max` bytes (on a character boundary), with a marker saying how much
/// was cut; `what` names the limit in the marker.
pub fn cut_text(s: &mut String, max: usize, what: &str) {
    if s.len() <= max {
        return;
    }
    let total = s.len();
    let keep = s.floor_char_boundary(max.saturating_sub(160));
    s.truncate(keep);
    s.push_str(&format!(
        " … [cut: {} of {total} bytes dropped; {what} keeps at most {}]",
        total - keep,
        human(max)
    ));
}

/// `n` bytes as KiB or MiB.
pub fn human(n: usize) -> String {
    if n >= 1024 * 1024 && n.is_multiple_of(1024 * 1024) {
        format!("{} MiB", n / (1024 * 1024))
    } else if n >= 1024 && n.is_multiple_of(1024) {
        format!("{} KiB", n / 1024)
    } else {
        format!("{n} bytes")
    }
}

/// The size of `v` as JSON.
fn json_len(v: &Value) -> usize {
    serde_json::to_vec(v).map(|b| b.len()).unwrap_or(usize::MAX)
}

/// A marker standing for a value that was too large.
fn cut_marker(len: usize, what: &str, max: usize) -> Value {
    Value::String(format!(
        "[cut: a value of {len} bytes; {what} keeps at most {} per value]",
        human(max)
    ))
}

/// The fields of one record within [`MAX_LOG_FIELDS`]: the largest values are replaced by
/// markers first; if the keys alone are too many, the rest are dropped and `steward_cut`
/// says how many.
fn bound_fields(fields: &mut serde_json::Map<String, Value>) {
    let mut sizes: Vec<(usize, String)> = fields
        .iter()
        .map(|(k, v)| (k.len() + json_len(v) + 4, k.clone()))
        .collect();
    let mut total: usize = sizes.iter().map(|(n, _)| *n).sum();
    if total <= MAX_LOG_FIELDS {
        return;
    }
    sizes.sort_by_key(|s| std::cmp::Reverse(s.0));
    for (size, key) in &sizes {
        if total <= MAX_LOG_FIELDS {
            return;
        }
        let marker = cut_marker(*size, "a log record's field", MAX_LOG_FIELDS);
        let new = key.len() + json_len(&marker) + 4;
        if new < *size {
            fields.insert(key.clone(), marker);
            total = total - size + new;
        }
    }
    if total > MAX_LOG_FIELDS {
        let mut kept = serde_json::Map::new();
        let mut used = 0;
        let mut dropped = 0usize;
        for (k, v) in std::mem::take(fields) {
            let n = k.len() + json_len(&v) + 4;
            if used + n <= MAX_LOG_FIELDS / 2 {
                used += n;
                kept.insert(k, v);
            } else {
                dropped += 1;
            }
        }
        kept.insert(
            "steward_cut".into(),
            Value::String(format!(
                "{dropped} fields dropped: a log record keeps at most {} of fields",
                human(MAX_LOG_FIELDS)
            )),
        );
        *fields = kept;
    }
}

/// A record's size as JSON, as it is stored (with a comma between records).
fn record_len(l: &LogLine) -> usize {
    serde_json::to_vec(l)
        .map(|b| b.len() + 1)
        .unwrap_or(usize::MAX)
}

/// The records of one action within [`MAX_ACTION_LOG`]: each record cut to its own limits,
/// then the first records and the last ones (where the error that ended the action is)
/// kept, one record in between saying how many were dropped.
pub fn bound_messages(messages: &mut Vec<LogLine>) {
    for l in messages.iter_mut() {
        cut_text(&mut l.level, 16, "a log level");
        cut_text(&mut l.message, MAX_LOG_MESSAGE, "a log message");
        bound_fields(&mut l.fields);
    }
    let sizes: Vec<usize> = messages.iter().map(record_len).collect();
    let total: usize = sizes.iter().sum();
    if total <= MAX_ACTION_LOG {
        return;
    }
    // room for the marker record
    let budget = MAX_ACTION_LOG - 1024;
    let tail_budget = budget / 4;
    let mut tail_start = messages.len();
    let mut tail_used = 0;
    while tail_start > 0 && tail_used + sizes[tail_start - 1] <= tail_budget {
        tail_start -= 1;
        tail_used += sizes[tail_start];
    }
    let mut head_end = 0;
    let mut head_used = 0;
    while head_end < tail_start && head_used + sizes[head_end] <= budget - tail_used {
        head_used += sizes[head_end];
        head_end += 1;
    }
    let dropped = tail_start - head_end;
    let dropped_bytes: usize = sizes[head_end..tail_start].iter().sum();
    let at = messages
        .get(head_end)
        .map(|l| l.at)
        .unwrap_or_else(chrono::Utc::now);
    let tail = messages.split_off(tail_start);
    messages.truncate(head_end);
    let mut fields = serde_json::Map::new();
    fields.insert("dropped_records".into(), dropped.into());
    fields.insert("dropped_bytes".into(), dropped_bytes.into());
    messages.push(LogLine {
        level: "warning".into(),
        message: format!(
            "{dropped} log records ({dropped_bytes} bytes) dropped here: an action keeps at most {} of logs",
            human(MAX_ACTION_LOG)
        ),
        fields,
        at,
    });
    messages.extend(tail);
}

/// A change set within its limits: each value cut to [`MAX_CHANGE_VALUE`], then, past
/// [`MAX_CHANGES`], the remaining attributes dropped and `steward:cut` saying how many.
pub fn bound_changes(changes: &mut std::collections::BTreeMap<String, AttributeChange>) {
    let mut total = 0;
    let mut dropped = 0usize;
    let mut kept = std::collections::BTreeMap::new();
    for (mut name, mut c) in std::mem::take(changes) {
        cut_text(&mut name, 1024, "an attribute name");
        for v in [&mut c.current, &mut c.desired] {
            let n = json_len(v);
            if n > MAX_CHANGE_VALUE {
                *v = cut_marker(n, "a change", MAX_CHANGE_VALUE);
            }
        }
        let n = name.len() + json_len(&c.current) + json_len(&c.desired) + 32;
        if total + n > MAX_CHANGES {
            dropped += 1;
            continue;
        }
        total += n;
        kept.insert(name, c);
    }
    if dropped > 0 {
        kept.insert(
            "steward:cut".into(),
            AttributeChange {
                current: Value::Null,
                desired: Value::String(format!(
                    "{dropped} more changed attributes not kept: a change set keeps at most {}",
                    human(MAX_CHANGES)
                )),
            },
        );
    }
    *changes = kept;
}

/// Facts one action may report, and the size of a fact's name and value.
pub const MAX_FACTS: usize = 1000;
pub const MAX_FACT_NAME: usize = 255;
pub const MAX_FACT_VALUE: usize = 64 * 1024;

/// Everything a result carries within the limits of this module.
pub fn bound_result(r: &mut WorkResult) {
    if r.facts.len() > MAX_FACTS {
        let dropped = r.facts.len() - MAX_FACTS;
        r.facts.truncate(MAX_FACTS);
        r.messages.push(LogLine {
            level: "warning".into(),
            message: format!(
                "{dropped} more facts dropped: an action reports at most {MAX_FACTS} facts"
            ),
            fields: Default::default(),
            at: chrono::Utc::now(),
        });
    }
    // a fact whose name is too long is no fact a model can ask for: dropped, and said so
    let before = r.facts.len();
    r.facts
        .retain(|f| !f.name.is_empty() && f.name.chars().count() <= MAX_FACT_NAME);
    if r.facts.len() < before {
        r.messages.push(LogLine {
            level: "warning".into(),
            message: format!(
                "{} facts with an empty name or one over {MAX_FACT_NAME} characters dropped",
                before - r.facts.len()
            ),
            fields: Default::default(),
            at: chrono::Utc::now(),
        });
    }
    for f in &mut r.facts {
        cut_text(&mut f.value, MAX_FACT_VALUE, "a fact");
    }
    bound_messages(&mut r.messages);
    bound_changes(&mut r.changes);
    if let Some(state) = &mut r.state {
        for v in state.values_mut() {
            let n = json_len(v);
            if n > MAX_CHANGE_VALUE {
                *v = cut_marker(n, "a resource's reported state", MAX_CHANGE_VALUE);
            }
        }
        if json_len(&Value::Object(state.clone())) > MAX_STATE {
            r.state = None;
        }
    }
}

/// One line read with a limit.
#[derive(Debug, PartialEq)]
pub enum Line {
    /// The line, without its end of line.
    Text(String),
    /// Longer than the limit: this many bytes were read and thrown away (up to its end).
    TooLong(usize),
    /// The stream ended.
    End,
}

/// Read one line of at most `max` bytes; a longer one is read to its end without keeping
/// it (memory stays bounded whatever the other side sends). Invalid UTF-8 is replaced.
pub fn read_line_bounded<R: BufRead>(r: &mut R, max: usize) -> std::io::Result<Line> {
    let mut buf: Vec<u8> = Vec::new();
    let mut seen = 0usize;
    let mut too_long = false;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            if seen == 0 {
                return Ok(Line::End);
            }
            break;
        }
        let (part, done) = match chunk.iter().position(|b| *b == b'\n') {
            Some(i) => (&chunk[..i], Some(i + 1)),
            None => (chunk, None),
        };
        seen += part.len();
        if !too_long {
            if buf.len() + part.len() > max {
                too_long = true;
                buf = Vec::new();
            } else {
                buf.extend_from_slice(part);
            }
        }
        let used = done.unwrap_or(chunk.len());
        r.consume(used);
        if done.is_some() {
            break;
        }
    }
    if too_long {
        return Ok(Line::TooLong(seen));
    }
    Ok(Line::Text(match String::from_utf8(buf) {
        Ok(s) => s,
        Err(e) => String::from_utf8_lossy(e.as_bytes()).into_owned(),
    }))
}

/// The output of a command kept within a bound while it is read: its first and its last
/// `max / 2` bytes, and how many it wrote in all.
pub struct HeadTail {
    max: usize,
    head: Vec<u8>,
    tail: std::collections::VecDeque<u8>,
    total: usize,
}

impl HeadTail {
    pub fn new(max: usize) -> HeadTail {
        HeadTail {
            max,
            head: Vec::new(),
            tail: std::collections::VecDeque::new(),
            total: 0,
        }
    }

    pub fn push(&mut self, mut bytes: &[u8]) {
        self.total += bytes.len();
        let head_room = (self.max / 2).saturating_sub(self.head.len());
        let into_head = head_room.min(bytes.len());
        self.head.extend_from_slice(&bytes[..into_head]);
        bytes = &bytes[into_head..];
        let keep = self.max - self.max / 2;
        if bytes.len() >= keep {
            self.tail.clear();
            self.tail.extend(&bytes[bytes.len() - keep..]);
        } else {
            let over = (self.tail.len() + bytes.len()).saturating_sub(keep);
            self.tail.drain(..over);
            self.tail.extend(bytes);
        }
    }

    /// Read `r` to its end (a read error ends it too).
    pub fn read_all<R: std::io::Read>(max: usize, mut r: R) -> HeadTail {
        let mut out = HeadTail::new(max);
        let mut buf = [0u8; 8192];
        loop {
            match r.read(&mut buf) {
                Ok(0) => return out,
                Ok(n) => out.push(&buf[..n]),
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(_) => return out,
            }
        }
    }

    /// The text kept, with a marker where bytes were dropped.
    pub fn text(&self) -> String {
        let head = String::from_utf8_lossy(&self.head);
        let (a, b) = self.tail.as_slices();
        let tail_bytes = [a, b].concat();
        let tail = String::from_utf8_lossy(&tail_bytes);
        let dropped = self.total - self.head.len() - tail_bytes.len();
        if dropped == 0 {
            format!("{head}{tail}")
        } else {
            format!(
                "{head}\n… [cut: {dropped} of {} bytes of output dropped; the first and last {} are kept]\n{tail}",
                self.total,
                human(self.max / 2)
            )
        }
    }

    pub fn total(&self) -> usize {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(level: &str, message: String) -> LogLine {
        LogLine {
            level: level.into(),
            message,
            fields: Default::default(),
            at: chrono::Utc::now(),
        }
    }

    #[test]
    fn a_huge_message_is_cut_with_a_marker() {
        let mut m = vec![line("info", "é".repeat(300_000))];
        bound_messages(&mut m);
        assert!(m[0].message.len() <= MAX_LOG_MESSAGE);
        assert!(
            m[0].message.contains("[cut: "),
            "{}",
            &m[0].message[60_000..]
        );
        assert!(m[0].message.contains("a log message keeps at most 64 KiB"));
    }

    #[test]
    fn huge_fields_become_markers_and_many_fields_are_dropped() {
        let mut l = line("info", "x".into());
        l.fields
            .insert("blob".into(), Value::String("y".repeat(1 << 20)));
        l.fields.insert("small".into(), Value::from(1));
        let mut m = vec![l];
        bound_messages(&mut m);
        assert_eq!(m[0].fields["small"], 1);
        assert!(m[0].fields["blob"].as_str().unwrap().starts_with("[cut: "));
        let mut l = line("info", "x".into());
        for i in 0..50_000 {
            l.fields.insert(format!("field-{i}"), Value::from(i));
        }
        let mut m = vec![l];
        bound_messages(&mut m);
        let size = json_len(&Value::Object(m[0].fields.clone()));
        assert!(size <= MAX_LOG_FIELDS, "{size}");
        assert!(
            m[0].fields["steward_cut"]
                .as_str()
                .unwrap()
                .contains("fields dropped")
        );
    }

    #[test]
    fn an_action_keeps_its_first_and_last_records_within_the_limit() {
        let mut m: Vec<LogLine> = (0..5000)
            .map(|i| line("info", format!("{i} {}", "z".repeat(1000))))
            .collect();
        m.push(line("error", "the end".into()));
        bound_messages(&mut m);
        let total: usize = m.iter().map(record_len).sum();
        assert!(total <= MAX_ACTION_LOG, "{total}");
        assert!(m[0].message.starts_with("0 "));
        assert_eq!(m.last().unwrap().message, "the end");
        let marker = m
            .iter()
            .find(|l| l.message.contains("dropped here"))
            .unwrap();
        assert!(marker.fields["dropped_records"].as_u64().unwrap() > 3000);
    }

    #[test]
    fn change_sets_are_bounded() {
        let mut c = std::collections::BTreeMap::new();
        c.insert(
            "a_content".to_string(),
            AttributeChange {
                current: Value::String("a".repeat(200_000)),
                desired: Value::String("b".into()),
            },
        );
        for i in 0..100_000 {
            c.insert(
                format!("attr{i}"),
                AttributeChange {
                    current: Value::from(i),
                    desired: Value::from(i + 1),
                },
            );
        }
        bound_changes(&mut c);
        assert!(
            c["a_content"]
                .current
                .as_str()
                .unwrap()
                .starts_with("[cut: ")
        );
        assert_eq!(c["a_content"].desired, "b");
        assert!(c.contains_key("steward:cut"));
        let size: usize = c
            .iter()
            .map(|(k, v)| k.len() + json_len(&v.current) + json_len(&v.desired) + 32)
            .sum();
        assert!(size <= MAX_CHANGES + 1024);
    }

    #[test]
    fn lines_over_the_limit_are_skipped_to_their_end() {
        let mut input = Vec::new();
        input.extend_from_slice(b"short\n");
        input.extend(std::iter::repeat_n(b'x', 100_000));
        input.extend_from_slice(b"\nafter\nlast");
        let mut r = std::io::BufReader::with_capacity(1024, &input[..]);
        assert_eq!(
            read_line_bounded(&mut r, 1000).unwrap(),
            Line::Text("short".into())
        );
        assert_eq!(
            read_line_bounded(&mut r, 1000).unwrap(),
            Line::TooLong(100_000)
        );
        assert_eq!(
            read_line_bounded(&mut r, 1000).unwrap(),
            Line::Text("after".into())
        );
        assert_eq!(
            read_line_bounded(&mut r, 1000).unwrap(),
            Line::Text("last".into())
        );
        assert_eq!(read_line_bounded(&mut r, 1000).unwrap(), Line::End);
    }

    #[test]
    fn command_output_keeps_its_head_and_tail() {
        let mut out = HeadTail::new(100);
        for i in 0..10_000 {
            out.push(format!("{i}\n").as_bytes());
        }
        let text = out.text();
        assert!(text.starts_with("0\n1\n"));
        assert!(text.ends_with("9998\n9999\n"));
        assert!(text.contains("bytes of output dropped"));
        let small = HeadTail::read_all(100, &b"hello"[..]);
        assert_eq!(small.text(), "hello");
    }
}
