//! Physical lines of a file, gzip or not, with a bound on their length
//! and a count of the bytes taken from the file.

use std::io::{self, BufRead, BufReader, Read};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The longest line (or CSV record) read; longer ones are skipped to their
/// end without being kept.
pub(super) const MAX_LINE: usize = 1 << 20;

const BUF: usize = 64 * 1024;

/// Counts the bytes read through it (the file's own bytes, so compressed
/// ones for gzip): what a progress bar shows against the file size.
struct Counting {
    inner: Box<dyn Read + Send>,
    count: Arc<AtomicU64>,
}

impl Read for Counting {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}

/// What [`Lines::next`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Got {
    /// A line (its terminator kept, if it had one).
    Line,
    /// A line past the budget: read to its end; what was appended is its
    /// first `budget + 1` bytes (enough to tell the format).
    TooLong,
    /// Nothing more.
    Eof,
}

/// Physical lines, numbered.
pub(super) struct Lines {
    inner: Box<dyn BufRead + Send>,
    /// Lines read so far (the last one's number).
    pub(super) line: u64,
    /// Whether the input is gzip (for error messages).
    pub(super) gzip: bool,
    count: Arc<AtomicU64>,
}

impl Lines {
    /// Wraps `input`, looking at its first two bytes for gzip's magic.
    pub(super) fn new(mut input: Box<dyn Read + Send>) -> io::Result<Lines> {
        let count = Arc::new(AtomicU64::new(0));
        let mut magic = [0u8; 2];
        let mut have = 0;
        while have < 2 {
            match input.read(&mut magic[have..]) {
                Ok(0) => break,
                Ok(n) => have += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let gzip = magic[..have] == [0x1f, 0x8b];
        // The magic bytes are counted when read again through the chain.
        let raw = Counting {
            inner: Box::new(io::Cursor::new(magic).take(have as u64).chain(input)),
            count: Arc::clone(&count),
        };
        let inner: Box<dyn BufRead + Send> = if gzip {
            // Multi-member: `cat a.gz b.gz` and some log shippers' output.
            let decoder = flate2::bufread::MultiGzDecoder::new(BufReader::with_capacity(BUF, raw));
            Box::new(BufReader::with_capacity(BUF, decoder))
        } else {
            Box::new(BufReader::with_capacity(BUF, raw))
        };
        Ok(Lines {
            inner,
            line: 0,
            gzip,
            count,
        })
    }

    /// Bytes taken from the file so far.
    pub(super) fn bytes_read(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// Appends the next line, terminator included, to `buf`, unless its
    /// content (terminator excluded) is over `budget` bytes.
    pub(super) fn next(&mut self, buf: &mut Vec<u8>, budget: usize) -> io::Result<Got> {
        // One more byte than the content may hold, for the `\n`.
        let limit = budget as u64 + 1;
        let n = (&mut self.inner).take(limit).read_until(b'\n', buf)?;
        if n == 0 {
            return Ok(Got::Eof);
        }
        self.line += 1;
        if buf.last() == Some(&b'\n') || (n as u64) < limit {
            return Ok(Got::Line);
        }
        self.inner.skip_until(b'\n')?;
        Ok(Got::TooLong)
    }
}
