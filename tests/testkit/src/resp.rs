//! The harness's setup commands, one per fresh plain connection, and
//! their replies in a form tests match on.

use std::net::SocketAddr;
use std::time::Duration;

/// A reply to a command sent by the harness (RESP2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK` and other simple strings.
    Status(String),
    /// `-ERR …` and other error replies.
    Error(String),
    /// `:<n>`.
    Int(i64),
    /// `$<len>`; `None` for the null bulk string.
    Bulk(Option<Vec<u8>>),
    /// `*<len>`; `None` for the null array.
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The reply as text (status, error or bulk string).
    pub fn text(&self) -> Option<String> {
        match self {
            Reply::Status(s) | Reply::Error(s) => Some(s.clone()),
            Reply::Bulk(Some(b)) => Some(String::from_utf8_lossy(b).into_owned()),
            _ => None,
        }
    }

    /// Whether the reply is an error.
    pub fn is_error(&self) -> bool {
        matches!(self, Reply::Error(_))
    }
}

impl Reply {
    /// Every string and integer in the reply, in order, arrays flattened
    /// (`SENTINEL MASTER`'s field-value list becomes alternating lines).
    pub fn strings(&self) -> Vec<String> {
        match self {
            Reply::Array(Some(items)) => items.iter().flat_map(Reply::strings).collect(),
            Reply::Int(n) => vec![n.to_string()],
            other => other.text().into_iter().collect(),
        }
    }
}

/// One command on a fresh connection, through the `redis` crate's
/// synchronous client.
pub(crate) fn call(addr: SocketAddr, args: &[&str]) -> std::io::Result<Reply> {
    let (name, rest) = args
        .split_first()
        .ok_or_else(|| std::io::Error::other("no command"))?;
    let client = redis::Client::open(format!("redis://{addr}/")).map_err(std::io::Error::other)?;
    let mut con = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .map_err(std::io::Error::other)?;
    con.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(std::io::Error::other)?;
    let mut cmd = redis::cmd(name);
    for arg in rest {
        cmd.arg(*arg);
    }
    match cmd.query::<redis::Value>(&mut con) {
        Ok(value) => Ok(reply_of(value)),
        Err(e) => match e.code() {
            Some(code) => Ok(Reply::Error(error_text(code, e.detail()))),
            None => Err(std::io::Error::other(e)),
        },
    }
}

/// An error reply's text as the server sent it: its code, then its
/// detail.
fn error_text(code: &str, detail: Option<&str>) -> String {
    match detail {
        Some(detail) => format!("{code} {detail}"),
        None => code.to_string(),
    }
}

/// The reply a `redis::Value` stands for (RESP2's kinds; the connection
/// never asks for RESP3).
fn reply_of(value: redis::Value) -> Reply {
    use redis::Value;
    match value {
        Value::Nil => Reply::Bulk(None),
        Value::Int(n) => Reply::Int(n),
        Value::BulkString(bytes) => Reply::Bulk(Some(bytes)),
        Value::Array(items) | Value::Set(items) => {
            Reply::Array(Some(items.into_iter().map(reply_of).collect()))
        }
        Value::SimpleString(s) => Reply::Status(s),
        Value::Okay => Reply::Status("OK".to_string()),
        Value::ServerError(e) => Reply::Error(error_text(e.code(), e.details())),
        other => Reply::Status(format!("{other:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_become_replies() {
        use redis::Value;
        let array = Value::Array(vec![
            Value::Okay,
            Value::Int(42),
            Value::BulkString(b"abc".to_vec()),
            Value::Nil,
        ]);
        assert_eq!(
            reply_of(array),
            Reply::Array(Some(vec![
                Reply::Status("OK".into()),
                Reply::Int(42),
                Reply::Bulk(Some(b"abc".to_vec())),
                Reply::Bulk(None),
            ]))
        );
        assert_eq!(
            error_text("MOVED", Some("1 127.0.0.1:1")),
            "MOVED 1 127.0.0.1:1"
        );
        let nested = Value::Array(vec![
            Value::BulkString(b"ip".to_vec()),
            Value::Array(vec![Value::Int(7)]),
        ]);
        assert_eq!(reply_of(nested).strings(), ["ip", "7"]);
    }
}
