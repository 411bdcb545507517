//! How states are stored in Redis. The Lua code (`read_cells`,
//! `write_cells`, `read_log`, `block_end` in the Redis store's
//! `lua/layered.lua`) reads and writes the same bytes, with the bounds
//! [`lua_constants`](crate::lua_constants) gives it, so servers with and
//! without the module read each other's states.
//!
//! - Counter algorithms keep a string of decimal cells separated by one
//!   space, trailing cells after the time cell left out when 0: token
//!   bucket `full_at remainder rate`, GCRA `tat interval` (the rate and
//!   the interval only under a plan: `Limit::keeping_units`), fixed
//!   window `count last`, sliding window `current previous last`.
//! - The sliding log keeps a list of decimal timestamps, oldest first.
//! - The concurrency limit keeps its log in one string
//!   ([`Layout::LogText`]): the timestamps, oldest first, each
//!   [`LOG_ENTRY_DIGITS`] digits, separated by one space; a log longer
//!   than [`TEXT_LOG_MAX`] entries is kept as a list, as the sliding log.
//! - A block is the string `b<µs>` (or a list of that one item for the log).
//!
//! A value is a state only when its time cell (for the log: every entry)
//! lies in [`STORED_TIMES`], what a state Tollgate wrote always holds:
//! anything else is someone else's data, never overwritten.

use std::collections::VecDeque;
use std::fmt::Write as _;
use std::ops::Range;

use tollgate_limiter::{Layout, State, Timestamp};

/// The times a stored state may hold (µs): from the clock's
/// [`Timestamp::EARLIEST`] (2020-01-01) to 2101-01-01, excluded. A store
/// decides only up to [`Timestamp::LATEST`] (2100-01-01), but a state's
/// time may run ahead of the clock (a GCRA's TAT, by at most its longest
/// recovery, 14 days): the end leaves a year for that.
pub const STORED_TIMES: Range<u64> = Timestamp::EARLIEST.as_micros()..4_133_980_800_000_000;

const EARLIEST: u64 = STORED_TIMES.start;
const LATEST: u64 = STORED_TIMES.end;

/// The digits of every stored time (every time in [`STORED_TIMES`] has
/// as many), so that entry *i* of a log kept as text
/// ([`Layout::LogText`]) starts at byte `(i − 1) × (LOG_ENTRY_DIGITS + 1)`:
/// the Lua reads any entry without splitting the string, and edits the
/// log by cutting it at entry boundaries.
pub const LOG_ENTRY_DIGITS: usize = 16;

const _: () = assert!(EARLIEST >= 1_000_000_000_000_000 && LATEST <= 10_000_000_000_000_000);

/// The most entries a log kept as [`Layout::LogText`] holds as text;
/// a longer one is kept as a list, as the sliding log is. Every write
/// applies the rule, so a log moves to a list when it grows past this and
/// back to text when it shrinks to it. A short log is cheapest as one
/// string (one `GET`, one `SET`); a long one as a list, whose edits do not
/// copy every entry (in Lua, a long string costs the garbage collector in
/// proportion to its bytes: three times a list's commands at a thousand
/// entries).
pub const TEXT_LOG_MAX: usize = 32;

/// A decimal number as the Lua pattern `%d+` reads it (digits only), or
/// `None`. Numbers beyond `u64` are not states.
///
/// Read digit by digit: every call parses a dozen numbers, and going
/// through `str::parse` cost the module about a thousand instructions a
/// call.
pub(crate) fn digits(s: &[u8]) -> Option<u64> {
    if s.is_empty() {
        return None;
    }
    s.iter().try_fold(0u64, |n, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d <= 9)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// The end of the block `v` holds (`b<µs>` within [`STORED_TIMES`]), or `None`.
pub fn block_end(v: &[u8]) -> Option<u64> {
    let u = digits(v.strip_prefix(b"b")?)?;
    (EARLIEST..LATEST).contains(&u).then_some(u)
}

/// The counter state kept as `layout` in the string `v`, a block, or
/// `None` when `v` is not a state Tollgate wrote (a conflict).
///
/// ```
/// use tollgate_limiter::{Layout, State};
/// use tollgate_redis_protocol::read_cells;
/// let fixed_window = Layout::Cells { cells: 2, time_cell: 1 };
/// let t = 1_800_000_000_000_000u64;
/// assert_eq!(read_cells(fixed_window, format!("3 {t}").as_bytes()), Some(State::Cells([3, t, 0])));
/// assert_eq!(read_cells(fixed_window, format!("b{t}").as_bytes()), Some(State::Blocked(t)));
/// assert_eq!(read_cells(fixed_window, b"someone else's"), None);
/// ```
pub fn read_cells(layout: Layout, v: &[u8]) -> Option<State> {
    let Layout::Cells { cells, time_cell } = layout else {
        return None;
    };
    // Read part by part, and no further than the cells: a foreign value
    // may be of any size, and is never split whole.
    let mut read = [0u64; 3];
    let mut parts = 0;
    for part in v.split(|&b| b == b' ') {
        let cell = read.get_mut(parts).filter(|_| parts < cells);
        match (cell, digits(part)) {
            (Some(cell), Some(x)) => *cell = x,
            _ => return block_end(v).map(State::Blocked),
        }
        parts += 1;
    }
    // Cells after the time cell may have been left out (0).
    if parts <= time_cell {
        return block_end(v).map(State::Blocked);
    }
    (EARLIEST..LATEST)
        .contains(&read[time_cell])
        .then_some(State::Cells(read))
}

/// The text of counter cells as `layout` keeps them: its cells, but the
/// trailing ones after the time cell that are 0 (the token bucket's
/// remainder).
pub fn write_cells(layout: Layout, cells: [u64; 3]) -> String {
    let (mut n, time_cell) = match layout {
        Layout::Cells { cells, time_cell } => (cells, time_cell),
        // Never asked (a log is written as a log): every cell, as before,
        // rather than a panic inside Redis.
        Layout::Log | Layout::LogText => (3, 2),
    };
    while n > time_cell + 1 && cells[n - 1] == 0 {
        n -= 1;
    }
    match n {
        1 => cells[0].to_string(),
        2 => format!("{} {}", cells[0], cells[1]),
        _ => format!("{} {} {}", cells[0], cells[1], cells[2]),
    }
}

/// The text of a block until `until` (µs): `b<until>`, a counter key's
/// whole value or a log's one item.
pub fn block_text(until: u64) -> String {
    format!("b{until}")
}

/// The log or block kept as text ([`Layout::LogText`]) in the string `v`,
/// or `None` when `v` is not one Tollgate wrote (a conflict). An empty log
/// is never stored (its key is deleted), so an empty string is no state.
///
/// ```
/// use std::collections::VecDeque;
/// use tollgate_limiter::State;
/// use tollgate_redis_protocol::{read_log_text, write_log_text};
/// let log = VecDeque::from([1_800_000_000_000_000, 1_800_000_000_000_007]);
/// let text = write_log_text(&log);
/// assert_eq!(text, "1800000000000000 1800000000000007");
/// assert_eq!(read_log_text(text.as_bytes()), Some(State::Log(log)));
/// assert_eq!(read_log_text(b"someone else's"), None);
/// ```
pub fn read_log_text(v: &[u8]) -> Option<State> {
    if let Some(until) = block_end(v) {
        return Some(State::Blocked(until));
    }
    if v.is_empty() {
        return None;
    }
    // Sized by the value, but never past a log's longest text: a foreign
    // value may be of any size.
    let entries_in_v = v.len() / (LOG_ENTRY_DIGITS + 1) + 1;
    let mut entries = VecDeque::with_capacity(entries_in_v.min(TEXT_LOG_MAX + 1));
    for entry in v.split(|&b| b == b' ') {
        let at = Some(entry)
            .filter(|e| e.len() == LOG_ENTRY_DIGITS)
            .and_then(digits)
            .filter(|at| (EARLIEST..LATEST).contains(at))?;
        // Oldest first: a log out of order is no log Tollgate wrote.
        if entries.back().is_some_and(|&last| last > at) {
            return None;
        }
        entries.push_back(at);
    }
    Some(State::Log(entries))
}

/// The text a log kept as [`Layout::LogText`] is stored as (see
/// [`read_log_text`]); the caller deletes the key rather than store an
/// empty log.
pub fn write_log_text(entries: &VecDeque<u64>) -> String {
    let mut text = String::with_capacity(entries.len() * (LOG_ENTRY_DIGITS + 1));
    for (i, &at) in entries.iter().enumerate() {
        if i > 0 {
            text.push(' ');
        }
        push_entry(&mut text, at);
    }
    text
}

/// `at` as [`LOG_ENTRY_DIGITS`] decimal digits, digit by digit (the
/// formatter's padding cost the module more than the rest of a write). A
/// time too large for them — no stored time is — is written whole, and
/// reads back as no state.
fn push_entry(text: &mut String, at: u64) {
    if at >= 10u64.pow(LOG_ENTRY_DIGITS as u32) {
        let _ = write!(text, "{at}");
        return;
    }
    let mut digits = [b'0'; LOG_ENTRY_DIGITS];
    let mut rest = at;
    for digit in digits.iter_mut().rev() {
        *digit = b'0' + (rest % 10) as u8;
        rest /= 10;
    }
    text.extend(digits.iter().map(|&d| char::from(d)));
}

/// The time a list item of a log holds, or `None` when it is no entry
/// Tollgate wrote: every entry is the time of an admitted unit, which a
/// store only takes within [`STORED_TIMES`].
///
/// ```
/// use tollgate_redis_protocol::log_entry;
/// assert_eq!(log_entry(b"1800000000000000"), Some(1_800_000_000_000_000));
/// assert_eq!(log_entry(b"17"), None);
/// assert_eq!(log_entry(b"b1800000000000000"), None);
/// ```
pub fn log_entry(item: &[u8]) -> Option<u64> {
    digits(item).filter(|at| (EARLIEST..LATEST).contains(at))
}

/// Whether the text `v` of a log kept as [`Layout::LogText`] is the one
/// entry `at` alone: the log [`read_log_text`] reads as `[at]`, told
/// without reading it into a state (a concurrency limit's usual release:
/// one holder at a time, whose key then goes).
///
/// ```
/// use tollgate_redis_protocol::holds_alone;
/// assert!(holds_alone(b"1800000000000000", 1_800_000_000_000_000));
/// assert!(!holds_alone(b"1800000000000000 1800000000000000", 1_800_000_000_000_000));
/// assert!(!holds_alone(b"1800000000000001", 1_800_000_000_000_000));
/// ```
pub fn holds_alone(v: &[u8], at: u64) -> bool {
    v.len() == LOG_ENTRY_DIGITS && log_entry(v) == Some(at)
}

/// Reads a list item by item (oldest first) into the state it holds: a
/// log, a block (the one item `b<µs>`), or nothing Tollgate wrote. Items
/// are parsed where they lie, so reading a long log copies no entry.
pub struct LogReader {
    entries: VecDeque<u64>,
    block: Option<u64>,
    read: usize,
}

impl LogReader {
    /// A reader for a list of `len` items.
    pub fn with_capacity(len: usize) -> LogReader {
        LogReader {
            entries: VecDeque::with_capacity(len),
            block: None,
            read: 0,
        }
    }

    /// Take the next item; `false` when the list cannot be a state
    /// Tollgate wrote (the caller stops: a conflict).
    pub fn push(&mut self, item: &[u8]) -> bool {
        self.read += 1;
        if self.block.is_some() {
            // A block is a list of exactly one item.
            return false;
        }
        if self.read == 1 {
            if let Some(until) = block_end(item) {
                self.block = Some(until);
                return true;
            }
        }
        match log_entry(item) {
            Some(at) => {
                self.entries.push_back(at);
                true
            }
            None => false,
        }
    }

    /// The state of the items taken; `None` when the log's ends are out
    /// of order (its oldest entry after its newest: no log Tollgate wrote,
    /// and the Lua's rule for a list's ends).
    #[must_use]
    pub fn finish(self) -> Option<State> {
        match self.block {
            Some(until) => Some(State::Blocked(until)),
            None if self.entries.front() > self.entries.back() => None,
            None => Some(State::Log(self.entries)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The state of the list `items`, or `None` when it is not one.
    fn read_log(items: &[Vec<u8>]) -> Option<State> {
        let mut log = LogReader::with_capacity(items.len());
        if !items.iter().all(|item| log.push(item)) {
            return None;
        }
        log.finish()
    }

    const T: u64 = 1_780_000_000_000_000;

    /// The layout of the built-in algorithm `name`.
    fn of(name: &str) -> Layout {
        tollgate_limiter::Builtin::named(name).unwrap().layout
    }

    #[test]
    fn digits_read_what_str_parse_reads() {
        for text in ["0", "7", "0042", "18446744073709551615", "1800000000000000"] {
            assert_eq!(digits(text.as_bytes()), text.parse().ok(), "{text}");
        }
        for text in [
            "",
            "18446744073709551616",
            "-1",
            "+1",
            "1 ",
            "1a",
            "\u{661}",
        ] {
            assert_eq!(digits(text.as_bytes()), None, "{text:?}");
        }
    }

    #[test]
    fn counter_states_read_back_what_they_write() {
        for (code, cells) in [
            (of("token_bucket"), [T, 0, 0]),
            (of("token_bucket"), [T, 7, 0]),
            (of("gcra"), [T, 0, 0]),
            (of("fixed_window"), [3, T, 0]),
            (of("sliding_window"), [3, 4, T]),
        ] {
            let text = write_cells(code, cells);
            assert_eq!(
                read_cells(code, text.as_bytes()),
                Some(State::Cells(cells)),
                "{text}"
            );
        }
        assert_eq!(write_cells(of("token_bucket"), [T, 0, 0]), T.to_string());
        assert_eq!(
            write_cells(of("sliding_window"), [1, 2, T]),
            format!("1 2 {T}")
        );
    }

    #[test]
    fn what_tollgate_did_not_write_is_not_a_state() {
        let t = T.to_string();
        for (code, v) in [
            (of("gcra"), "hello".to_string()),
            (of("gcra"), "12".to_string()),
            (of("gcra"), format!("{t} 1 2")),
            (of("gcra"), format!("+{t}")),
            (of("gcra"), format!("{t} ")),
            (of("fixed_window"), format!("1  {t}")),
            (of("fixed_window"), "12 34".to_string()),
            (of("sliding_window"), format!("1 2 {t} 4")),
            (of("token_bucket"), format!("{t} 1 2 3")),
            (of("gcra"), "99999999999999999999999".to_string()),
            (of("gcra"), "b12".to_string()),
            (of("gcra"), String::new()),
        ] {
            assert_eq!(read_cells(code, v.as_bytes()), None, "{code:?} {v:?}");
        }
        assert_eq!(read_log(&[b"x".to_vec()]), None);
        assert_eq!(read_log(&[b"12".to_vec(), b"34".to_vec()]), None);
        assert_eq!(
            read_log(&[t.clone().into_bytes(), u64::MAX.to_string().into_bytes()]),
            None
        );
        assert_eq!(read_log(&[t.clone().into_bytes(), b"-1".to_vec()]), None);
    }

    #[test]
    fn logs_kept_as_text_read_back_what_they_write() {
        let t = T.to_string();
        for log in [vec![T], vec![T, T, T + 1], vec![EARLIEST, LATEST - 1]] {
            let formatted: Vec<String> = log.iter().map(|at| format!("{at:016}")).collect();
            assert_eq!(
                write_log_text(&VecDeque::from(log.clone())),
                formatted.join(" ")
            );
            let log = VecDeque::from(log);
            let text = write_log_text(&log);
            assert_eq!(
                read_log_text(text.as_bytes()),
                Some(State::Log(log)),
                "{text}"
            );
        }
        assert_eq!(
            read_log_text(format!("b{T}").as_bytes()),
            Some(State::Blocked(T))
        );
        for v in [
            String::new(),
            " ".to_string(),
            format!("{t} "),
            format!(" {t}"),
            format!("{t}  {t}"),
            format!("{} {t}", T + 1),
            format!("0{t}"),
            format!("{t} 12"),
            format!("{t},{t}"),
            format!("{t} b{t}"),
            (EARLIEST - 1).to_string(),
            LATEST.to_string(),
        ] {
            assert_eq!(read_log_text(v.as_bytes()), None, "{v:?}");
        }
    }

    #[test]
    fn blocks_read_the_same_for_every_algorithm() {
        let v = format!("b{T}");
        for code in [
            of("token_bucket"),
            of("gcra"),
            of("fixed_window"),
            of("sliding_window"),
        ] {
            assert_eq!(read_cells(code, v.as_bytes()), Some(State::Blocked(T)));
        }
        assert_eq!(read_log(&[v.clone().into_bytes()]), Some(State::Blocked(T)));
        assert_eq!(read_log(&[v.clone().into_bytes(), v.into_bytes()]), None);
        assert_eq!(
            read_log(&[T.to_string().into_bytes(), format!("b{T}").into_bytes()]),
            None
        );
        assert_eq!(block_end(format!("b{LATEST}").as_bytes()), None);
        assert_eq!(read_log(&[]), Some(State::Log(VecDeque::new())));
    }
}
