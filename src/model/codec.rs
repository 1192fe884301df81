//! A small binary encoding for what a process keeps for its next start (the scheduler's
//! snapshot, the store's newest manifest): little-endian integers, length-prefixed UTF-8
//! strings, a tag byte for options, timestamps in microseconds. Reading is bounded by the
//! bytes given: a length or count larger than what is left is an error before anything is
//! allocated for it, never a panic.

use chrono::{DateTime, Utc};

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("the data ends early")]
    Truncated,
    #[error("the data holds a value this encoding does not have")]
    Invalid,
    #[error("the data holds text that is not UTF-8")]
    Text,
}

#[derive(Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    pub fn bytes(&mut self, b: &[u8]) {
        self.0.extend_from_slice(b);
    }
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn str(&mut self, s: &str) {
        self.u32(s.len() as u32);
        self.0.extend_from_slice(s.as_bytes());
    }
    pub fn strs(&mut self, list: &[String]) {
        self.u32(list.len() as u32);
        for s in list {
            self.str(s);
        }
    }
    pub fn opt_str(&mut self, s: Option<&str>) {
        match s {
            Some(s) => {
                self.u8(1);
                self.str(s);
            }
            None => self.u8(0),
        }
    }
    pub fn opt_time(&mut self, t: Option<DateTime<Utc>>) {
        match t {
            Some(t) => {
                self.u8(1);
                self.i64(t.timestamp_micros());
            }
            None => self.u8(0),
        }
    }
}

pub struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], CodecError> {
        if self.0.len() < n {
            return Err(CodecError::Truncated);
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    pub fn u8(&mut self) -> Result<u8, CodecError> {
        Ok(self.take(1)?[0])
    }
    pub fn u32(&mut self) -> Result<u32, CodecError> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().expect("4 bytes"),
        ))
    }
    pub fn i64(&mut self) -> Result<i64, CodecError> {
        Ok(i64::from_le_bytes(
            self.take(8)?.try_into().expect("8 bytes"),
        ))
    }
    /// A count of items that each take at least one byte: one larger than what is left is
    /// refused before anything is allocated for it.
    pub fn count(&mut self) -> Result<usize, CodecError> {
        let n = self.u32()? as usize;
        if n > self.0.len() {
            return Err(CodecError::Truncated);
        }
        Ok(n)
    }
    /// A string borrowed from the bytes (nothing allocated).
    pub fn str(&mut self) -> Result<&'a str, CodecError> {
        let n = self.u32()? as usize;
        std::str::from_utf8(self.take(n)?).map_err(|_| CodecError::Text)
    }
    pub fn string(&mut self) -> Result<String, CodecError> {
        let n = self.u32()? as usize;
        let bytes = self.take(n)?;
        std::str::from_utf8(bytes)
            .map(str::to_string)
            .map_err(|_| CodecError::Text)
    }
    pub fn strings(&mut self) -> Result<Vec<String>, CodecError> {
        let n = self.count()?;
        let mut list = Vec::with_capacity(n);
        for _ in 0..n {
            list.push(self.string()?);
        }
        Ok(list)
    }
    pub fn opt_string(&mut self) -> Result<Option<String>, CodecError> {
        match self.u8()? {
            0 => Ok(None),
            1 => self.string().map(Some),
            _ => Err(CodecError::Invalid),
        }
    }
    pub fn opt_time(&mut self) -> Result<Option<DateTime<Utc>>, CodecError> {
        match self.u8()? {
            0 => Ok(None),
            1 => DateTime::from_timestamp_micros(self.i64()?)
                .map(Some)
                .ok_or(CodecError::Invalid),
            _ => Err(CodecError::Invalid),
        }
    }
}
