//! [`Text`]: the language's strings, an immutable reference-counted `str` behind one
//! pointer.
//!
//! Why not `Rc<str>`: that is a pointer and a length, 16 bytes, which made every
//! [`Value`](super::Value) 24 bytes, and every result variable of the evaluator (a value and
//! its bookkeeping) 48. The compiler is bound by memory, not by instructions: at gen_model
//! N=20,000 its result variables alone were 100 MB, and the hottest instructions were
//! cache misses on them. Here the length lives in the allocation, next to the count, so a
//! `Value` is 16 bytes and a result variable 40.

use std::alloc::{Layout, alloc, dealloc, handle_alloc_error};
use std::borrow::Borrow;
use std::cell::Cell;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::ops::Deref;
use std::ptr::NonNull;

/// The start of each allocation; the string's bytes follow it.
#[repr(C)]
struct Header {
    count: Cell<usize>,
    len: usize,
}

/// An immutable string shared by counting, like `Rc<str>` (and, like it, neither `Send`
/// nor `Sync`: the count is not atomic), one pointer wide.
pub struct Text {
    ptr: NonNull<Header>,
}

const _: () = assert!(std::mem::size_of::<Text>() == 8);
const _: () = assert!(std::mem::size_of::<Option<Text>>() == 8);

fn layout(len: usize) -> Layout {
    Layout::new::<Header>()
        .extend(Layout::array::<u8>(len).expect("a string fits in memory"))
        .expect("a string fits in memory")
        .0
}

impl Text {
    pub fn new(s: &str) -> Text {
        let layout = layout(s.len());
        // SAFETY: the layout is not zero-sized (it holds the header); the header is written
        // before the pointer escapes, and the bytes are copied into the space `layout`
        // reserved after it
        unsafe {
            let p = alloc(layout).cast::<Header>();
            let Some(ptr) = NonNull::new(p) else {
                handle_alloc_error(layout)
            };
            ptr.write(Header {
                count: Cell::new(1),
                len: s.len(),
            });
            std::ptr::copy_nonoverlapping(s.as_ptr(), Self::bytes(ptr), s.len());
            Text { ptr }
        }
    }

    /// Where the bytes of the string at `ptr` start.
    fn bytes(ptr: NonNull<Header>) -> *mut u8 {
        // SAFETY (of the add): the allocation is a header followed by the bytes
        unsafe { ptr.as_ptr().add(1).cast::<u8>() }
    }

    fn header(&self) -> &Header {
        // SAFETY: `ptr` stays valid while any `Text` of it is alive (we hold a count)
        unsafe { self.ptr.as_ref() }
    }

    pub fn as_str(&self) -> &str {
        let len = self.header().len;
        // SAFETY: `len` bytes copied from a `str` follow the header, and are never changed
        unsafe {
            std::str::from_utf8_unchecked(std::slice::from_raw_parts(Self::bytes(self.ptr), len))
        }
    }

    /// Both are the same allocation (a cheap equality test before comparing bytes).
    pub fn ptr_eq(a: &Text, b: &Text) -> bool {
        a.ptr == b.ptr
    }
}

impl Clone for Text {
    fn clone(&self) -> Text {
        let count = &self.header().count;
        // only reachable by forgetting clones in a loop; a wrapped count would free early
        let Some(more) = count.get().checked_add(1) else {
            std::process::abort()
        };
        count.set(more);
        Text { ptr: self.ptr }
    }
}

impl Drop for Text {
    fn drop(&mut self) {
        let count = &self.header().count;
        let left = count.get() - 1;
        count.set(left);
        if left == 0 {
            let len = self.header().len;
            // SAFETY: the last reference: nobody reads the allocation after this, and it
            // was made by `alloc` with this layout
            unsafe { dealloc(self.ptr.as_ptr().cast(), layout(len)) }
        }
    }
}

impl Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl Borrow<str> for Text {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl From<&str> for Text {
    fn from(s: &str) -> Text {
        Text::new(s)
    }
}

impl From<String> for Text {
    fn from(s: String) -> Text {
        Text::new(&s)
    }
}

impl PartialEq for Text {
    fn eq(&self, other: &Text) -> bool {
        Text::ptr_eq(self, other) || self.as_str() == other.as_str()
    }
}

impl Eq for Text {}

impl PartialOrd for Text {
    fn partial_cmp(&self, other: &Text) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Text {
    fn cmp(&self, other: &Text) -> std::cmp::Ordering {
        self.as_str().cmp(other.as_str())
    }
}

impl Hash for Text {
    /// As the `str`, so that maps keyed by `Text` can be searched with a `&str`.
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.as_str().hash(h)
    }
}

impl fmt::Debug for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Text {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self.as_str(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Contents, sharing and release: each clone reads the same bytes, and the last drop
    /// frees (run under Miri or a leak checker, a missed or a double free shows; here the
    /// counts are checked directly).
    #[test]
    fn clones_share_one_allocation_until_the_last_drop() {
        for s in ["", "a", "héllo wörld", &"x".repeat(10_000)] {
            let a = Text::from(s);
            assert_eq!(a.as_str(), s);
            let b = a.clone();
            assert!(Text::ptr_eq(&a, &b));
            assert_eq!(a.header().count.get(), 2);
            drop(a);
            assert_eq!(b.header().count.get(), 1);
            assert_eq!(&*b, s);
            assert_eq!(b, Text::from(s.to_string()));
        }
    }

    #[test]
    fn compares_hashes_and_prints_as_its_str() {
        use std::collections::HashMap;
        let mut m: HashMap<Text, u32> = HashMap::new();
        m.insert(Text::from("b"), 2);
        m.insert(Text::from("a"), 1);
        assert_eq!(m.get("a"), Some(&1));
        let (a, b) = (Text::from("a"), Text::from("b"));
        assert!(a < b);
        assert!(a.cmp(&a.clone()).is_eq());
        assert_eq!(
            format!("{:?} {}", Text::from("q\""), Text::from("q")),
            "\"q\\\"\" q"
        );
    }
}
