//! Reading a child's output line by line with a limit on each line (the async counterpart of
//! [`crate::executor::limits::read_line_bounded`]): whatever an executor, an SSH target or a
//! handler behind them prints, a line never takes more memory than its limit.

use tokio::io::{AsyncBufRead, AsyncBufReadExt};

pub use crate::executor::limits::Line;

/// Read one line of at most `max` bytes; a longer one is read to its end and thrown away.
pub async fn next_line<R: AsyncBufRead + Unpin>(r: &mut R, max: usize) -> std::io::Result<Line> {
    let mut buf: Vec<u8> = Vec::new();
    let mut seen = 0usize;
    let mut too_long = false;
    loop {
        let chunk = r.fill_buf().await?;
        if chunk.is_empty() {
            if seen == 0 && buf.is_empty() {
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

/// Read `r` to its end, keeping only its last `max` bytes (what a process said last
/// explains why it failed).
pub async fn read_tail<R: tokio::io::AsyncRead + Unpin>(mut r: R, max: usize) -> String {
    use tokio::io::AsyncReadExt;
    let mut kept: std::collections::VecDeque<u8> = std::collections::VecDeque::new();
    let mut buf = [0u8; 8192];
    while let Ok(n) = r.read(&mut buf).await {
        if n == 0 {
            break;
        }
        kept.extend(&buf[..n]);
        let over = kept.len().saturating_sub(max);
        kept.drain(..over);
    }
    let (a, b) = kept.as_slices();
    String::from_utf8_lossy(&[a, b].concat()).into_owned()
}

/// Read `r` to its end, keeping only its first `max` bytes.
pub async fn read_head<R: tokio::io::AsyncRead + Unpin>(mut r: R, max: usize) -> Vec<u8> {
    use tokio::io::AsyncReadExt;
    let mut kept = Vec::new();
    let mut buf = [0u8; 8192];
    while let Ok(n) = r.read(&mut buf).await {
        if n == 0 {
            break;
        }
        let room = max.saturating_sub(kept.len()).min(n);
        kept.extend_from_slice(&buf[..room]);
    }
    kept
}

/// Run `c` to its end like `Command::output`, keeping the first `max` bytes of its stdout
/// and the last `max` bytes of its stderr: a remote shell that prints without end costs no
/// more than that.
pub async fn output_bounded(
    mut c: tokio::process::Command,
    max: usize,
) -> std::io::Result<std::process::Output> {
    c.stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let mut child = c.spawn()?;
    let out = child.stdout.take().expect("piped");
    let err = child.stderr.take().expect("piped");
    let (stdout, stderr, status) =
        tokio::join!(read_head(out, max), read_tail(err, max), child.wait());
    Ok(std::process::Output {
        status: status?,
        stdout,
        stderr: stderr.into_bytes(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn long_lines_are_skipped_and_short_ones_read() {
        let mut input = b"one\n".to_vec();
        input.extend(std::iter::repeat_n(b'y', 50_000));
        input.extend_from_slice(b"\ntwo");
        let mut r = tokio::io::BufReader::with_capacity(512, &input[..]);
        assert_eq!(
            next_line(&mut r, 100).await.unwrap(),
            Line::Text("one".into())
        );
        assert_eq!(next_line(&mut r, 100).await.unwrap(), Line::TooLong(50_000));
        assert_eq!(
            next_line(&mut r, 100).await.unwrap(),
            Line::Text("two".into())
        );
        assert_eq!(next_line(&mut r, 100).await.unwrap(), Line::End);
        let tail = read_tail(&b"abcdefghij"[..], 4).await;
        assert_eq!(tail, "ghij");
    }
}
