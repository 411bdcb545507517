//! Reading `INFO commandstats`: how many times Redis ran each command and
//! how long each call took it, for tests that count calls and benches that
//! report Redis CPU per call.
//!
//! ```
//! use tollgate_testkit::command_stats::command_stats;
//!
//! let info = "# Commandstats\r\ncmdstat_fcall:calls=3,usec=21,usec_per_call=7.00,rejected_calls=0,failed_calls=0\r\n";
//! let stats = command_stats(info);
//! assert_eq!(stats["fcall"].calls, 3);
//! assert_eq!(stats["fcall"].usec_per_call, 7.0);
//! ```

use std::collections::HashMap;

/// One command's line of `INFO commandstats`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CommandStats {
    /// Calls since the last `CONFIG RESETSTAT`.
    pub calls: u64,
    /// Microseconds Redis spent executing one call, on average.
    pub usec_per_call: f64,
}

/// Every command's figures in an `INFO commandstats` reply, by the name
/// Redis gives it (`fcall`, `evalsha`, `script|load`); lines that do not
/// parse are left out.
pub fn command_stats(info: &str) -> HashMap<String, CommandStats> {
    info.lines()
        .filter_map(|line| {
            let (name, fields) = line.trim_end().strip_prefix("cmdstat_")?.split_once(':')?;
            let field = |key: &str| {
                fields
                    .split(',')
                    .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
            };
            Some((
                name.to_string(),
                CommandStats {
                    calls: field("calls")?.parse().ok()?,
                    usec_per_call: field("usec_per_call")?.parse().ok()?,
                },
            ))
        })
        .collect()
}
