//! Just enough RESP2 to run the harness's setup commands over plain TCP,
//! without a Redis client library.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpStream};
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

/// One command on a fresh connection (RESP2 array of bulk strings).
pub(crate) fn call(addr: SocketAddr, args: &[&str]) -> std::io::Result<Reply> {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_millis(500))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    stream.set_nodelay(true)?;
    let mut request = format!("*{}\r\n", args.len()).into_bytes();
    for arg in args {
        request.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        request.extend_from_slice(arg.as_bytes());
        request.extend_from_slice(b"\r\n");
    }
    (&stream).write_all(&request)?;
    read_reply(&mut BufReader::new(stream))
}

fn read_reply(reader: &mut impl BufRead) -> std::io::Result<Reply> {
    let bad = |what: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, what.to_string());
    let mut line = String::new();
    if reader.read_line(&mut line)? == 0 {
        return Err(bad("connection closed"));
    }
    let line = line.trim_end_matches(['\r', '\n']);
    let (kind, rest) = line.split_at(1.min(line.len()));
    let number = || rest.parse::<i64>().map_err(|_| bad("a bad length"));
    Ok(match kind {
        "+" => Reply::Status(rest.to_string()),
        "-" => Reply::Error(rest.to_string()),
        ":" => Reply::Int(number()?),
        "$" => {
            let len = number()?;
            if len < 0 {
                Reply::Bulk(None)
            } else {
                let mut buf = vec![0u8; len as usize + 2];
                std::io::Read::read_exact(reader, &mut buf)?;
                buf.truncate(len as usize);
                Reply::Bulk(Some(buf))
            }
        }
        "*" => {
            let len = number()?;
            if len < 0 {
                Reply::Array(None)
            } else {
                let mut items = Vec::with_capacity(len as usize);
                for _ in 0..len {
                    items.push(read_reply(reader)?);
                }
                Reply::Array(Some(items))
            }
        }
        _ => return Err(bad("an unknown reply type")),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse() {
        let mut input: &[u8] = b"*3\r\n+OK\r\n:42\r\n$3\r\nabc\r\n";
        assert_eq!(
            read_reply(&mut input).unwrap(),
            Reply::Array(Some(vec![
                Reply::Status("OK".into()),
                Reply::Int(42),
                Reply::Bulk(Some(b"abc".to_vec())),
            ]))
        );
        let mut input: &[u8] = b"-MOVED 1 127.0.0.1:1\r\n";
        assert!(read_reply(&mut input).unwrap().is_error());
        let mut input: &[u8] = b"*2\r\n$2\r\nip\r\n*1\r\n:7\r\n";
        assert_eq!(read_reply(&mut input).unwrap().strings(), ["ip", "7"]);
    }
}
