//! A bounded RESP request parser: multibulk arrays of bulk strings (what every client sends) and
//! inline commands (what a person types into telnet). Oversized or malformed input is an error
//! that closes the connection (Redis' "Protocol error" replies).

use bytes::{Buf, Bytes, BytesMut};

/// Largest single argument: Redis' proto-max-bulk-len (512 MB). Arguments above one upright
/// operation go to the cluster in pieces (the store's `large` module).
pub const ARG_BYTES_MAX: usize = 512 << 20;
/// Most arguments of one command.
pub const ARGS_MAX: usize = 64 * 1024;
/// Largest whole command (sum of its arguments), within what the store stages.
pub const COMMAND_BYTES_MAX: usize = (512 << 20) + (512 << 10);
/// Longest inline command or length line.
pub const INLINE_BYTES_MAX: usize = 64 * 1024;

/// A protocol violation; the text is the `-ERR` reply sent before closing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProtocolError(pub String);

fn protocol(what: &str) -> ProtocolError {
    ProtocolError(format!("ERR Protocol error: {what}"))
}

/// Finds the end of the line starting at `at`: the index of its `\r\n`.
fn line_end(buf: &[u8], at: usize) -> Result<Option<usize>, ProtocolError> {
    match buf[at..].windows(2).position(|w| w == b"\r\n") {
        Some(i) if i > INLINE_BYTES_MAX => Err(protocol("too big inline request")),
        Some(i) => Ok(Some(at + i)),
        None if buf.len() - at > INLINE_BYTES_MAX => Err(protocol("too big inline request")),
        None => Ok(None),
    }
}

fn number(bytes: &[u8]) -> Option<i64> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// Takes one command from the front of `buf`: `Ok(None)` if more bytes are needed; empty commands
/// (blank inline lines, `*0`) are skipped.
pub fn parse(buf: &mut BytesMut) -> Result<Option<Vec<Bytes>>, ProtocolError> {
    loop {
        if buf.is_empty() {
            return Ok(None);
        }
        if buf[0] != b'*' {
            let Some((used, argv)) = inline(buf)? else {
                return Ok(None);
            };
            buf.advance(used);
            if argv.is_empty() {
                continue;
            }
            return Ok(Some(argv));
        }
        match multibulk(buf)? {
            None => return Ok(None),
            Some((used, argv)) => {
                let frozen = buf.split_to(used).freeze();
                if argv.is_empty() {
                    continue;
                }
                return Ok(Some(argv.into_iter().map(|(s, e)| frozen.slice(s..e)).collect()));
            }
        }
    }
}

type Spans = Vec<(usize, usize)>;

fn multibulk(buf: &[u8]) -> Result<Option<(usize, Spans)>, ProtocolError> {
    let Some(end) = line_end(buf, 0)? else { return Ok(None) };
    let count = number(&buf[1..end]).ok_or_else(|| protocol("invalid multibulk length"))?;
    if count > ARGS_MAX as i64 {
        return Err(protocol("invalid multibulk length"));
    }
    let mut at = end + 2;
    let mut spans = Vec::with_capacity(count.clamp(0, 64) as usize);
    let mut total = 0usize;
    for _ in 0..count.max(0) {
        if at >= buf.len() {
            return Ok(None);
        }
        if buf[at] != b'$' {
            return Err(protocol(&format!("expected '$', got '{}'", buf[at] as char)));
        }
        let Some(end) = line_end(buf, at)? else { return Ok(None) };
        let len = number(&buf[at + 1..end]).ok_or_else(|| protocol("invalid bulk length"))?;
        if len < 0 || len as usize > ARG_BYTES_MAX {
            return Err(protocol("invalid bulk length"));
        }
        total += len as usize;
        if total > COMMAND_BYTES_MAX {
            return Err(protocol("command too big"));
        }
        let start = end + 2;
        let stop = start + len as usize;
        if buf.len() < stop + 2 {
            return Ok(None);
        }
        if &buf[stop..stop + 2] != b"\r\n" {
            return Err(protocol("invalid bulk terminator"));
        }
        spans.push((start, stop));
        at = stop + 2;
    }
    Ok(Some((at, spans)))
}

fn inline(buf: &[u8]) -> Result<Option<(usize, Vec<Bytes>)>, ProtocolError> {
    let end = match buf.iter().position(|&b| b == b'\n') {
        Some(i) if i > INLINE_BYTES_MAX => return Err(protocol("too big inline request")),
        Some(i) => i,
        None if buf.len() > INLINE_BYTES_MAX => return Err(protocol("too big inline request")),
        None => return Ok(None),
    };
    let line_stop = if end > 0 && buf[end - 1] == b'\r' { end - 1 } else { end };
    let args = split_args(&buf[..line_stop]).ok_or_else(|| protocol("unbalanced quotes in request"))?;
    Ok(Some((end + 1, args)))
}

/// Splits an inline command into arguments as Redis' `sdssplitargs` does: blanks separate them;
/// "double quotes" take `\n`, `\r`, `\t`, `\b`, `\a`, `\xHH` and `\` before any other
/// character; 'single quotes' take `\'`. A closing quote must end the argument. `None`: the
/// quotes do not balance.
fn split_args(line: &[u8]) -> Option<Vec<Bytes>> {
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while i < line.len() && line[i].is_ascii_whitespace() {
            i += 1;
        }
        if i >= line.len() {
            return Some(args);
        }
        let mut arg = Vec::new();
        let (mut double, mut single) = (false, false);
        loop {
            let c = line.get(i).copied();
            if double {
                match c? {
                    b'\\'
                        if line.get(i + 1) == Some(&b'x')
                            && line.get(i + 2).is_some_and(u8::is_ascii_hexdigit)
                            && line.get(i + 3).is_some_and(u8::is_ascii_hexdigit) =>
                    {
                        let hex = std::str::from_utf8(&line[i + 2..i + 4]).ok()?;
                        arg.push(u8::from_str_radix(hex, 16).ok()?);
                        i += 3;
                    }
                    b'\\' if i + 1 < line.len() => {
                        i += 1;
                        arg.push(match line[i] {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 8,
                            b'a' => 7,
                            other => other,
                        });
                    }
                    b'"' => {
                        // The closing quote must end the argument.
                        if line.get(i + 1).is_some_and(|n| !n.is_ascii_whitespace()) {
                            return None;
                        }
                        i += 1;
                        break;
                    }
                    other => arg.push(other),
                }
            } else if single {
                match c? {
                    b'\\' if line.get(i + 1) == Some(&b'\'') => {
                        i += 1;
                        arg.push(b'\'');
                    }
                    b'\'' => {
                        if line.get(i + 1).is_some_and(|n| !n.is_ascii_whitespace()) {
                            return None;
                        }
                        i += 1;
                        break;
                    }
                    other => arg.push(other),
                }
            } else {
                match c {
                    None => break,
                    Some(b) if b.is_ascii_whitespace() => break,
                    Some(b'"') => double = true,
                    Some(b'\'') => single = true,
                    Some(other) => arg.push(other),
                }
            }
            i += 1;
        }
        args.push(Bytes::from(arg));
    }
}

/// `argv` as a RESP multibulk command (what [`parse`] reads back).
pub fn encode_command(argv: &[Bytes]) -> Vec<u8> {
    let mut out = Vec::with_capacity(argv.iter().map(|a| a.len() + 16).sum::<usize>() + 16);
    out.extend_from_slice(format!("*{}\r\n", argv.len()).as_bytes());
    for arg in argv {
        out.extend_from_slice(format!("${}\r\n", arg.len()).as_bytes());
        out.extend_from_slice(arg);
        out.extend_from_slice(b"\r\n");
    }
    out
}

/// The start of a multibulk command once its first argument has arrived: how many arguments it
/// declares, and the first (the command's name). `None` if that has not arrived or the input is
/// not a well-formed multibulk start ([`parse`] says why).
pub fn head(buf: &[u8]) -> Option<(usize, &[u8])> {
    if buf.first() != Some(&b'*') {
        return None;
    }
    let end = line_end(buf, 0).ok()??;
    let count = usize::try_from(number(&buf[1..end])?).ok()?;
    let at = end + 2;
    if count == 0 || count > ARGS_MAX || buf.get(at) != Some(&b'$') {
        return None;
    }
    let end = line_end(buf, at).ok()??;
    let len = usize::try_from(number(&buf[at + 1..end])?).ok()?;
    let name = buf.get(end + 2..end + 2 + len)?;
    Some((count, name))
}

/// A multibulk command walked as it arrives, so that a reader can pass on what it has before the
/// rest comes (a large command is streamed to the cluster, not held whole). [`Scan::advance`]
/// checks the bytes as [`parse`] does.
#[derive(Debug, Default)]
pub struct Scan {
    /// Bytes at the front of the buffer walked so far (all of them the command's).
    scanned: usize,
    /// Arguments still to come; `None` until the `*N` line is read.
    args_left: Option<usize>,
    /// Bytes left of the argument being read, its CRLF included.
    bulk_left: usize,
    /// Bytes of the arguments so far.
    total: usize,
}

impl Scan {
    /// Bytes at the front of the buffer that belong to the command and were checked.
    pub fn scanned(&self) -> usize {
        self.scanned
    }

    /// The first `n` scanned bytes were taken off the front of the buffer.
    pub fn taken(&mut self, n: usize) {
        self.scanned -= n;
    }

    /// Walks on through `buf` (the buffer; its first [`Scan::scanned`] bytes were walked
    /// before): `true` once the command ends at `scanned()`.
    pub fn advance(&mut self, buf: &[u8]) -> Result<bool, ProtocolError> {
        loop {
            let available = buf.len() - self.scanned;
            if self.bulk_left > 2 {
                let data = (self.bulk_left - 2).min(available);
                if data == 0 {
                    return Ok(false);
                }
                self.scanned += data;
                self.bulk_left -= data;
                continue;
            }
            if self.bulk_left == 2 {
                if available < 2 {
                    return Ok(false);
                }
                if &buf[self.scanned..self.scanned + 2] != b"\r\n" {
                    return Err(protocol("invalid bulk terminator"));
                }
                self.scanned += 2;
                self.bulk_left = 0;
            }
            if self.args_left == Some(0) {
                return Ok(true);
            }
            if available == 0 {
                return Ok(false);
            }
            let Some(end) = line_end(buf, self.scanned)? else {
                return Ok(false);
            };
            let line = &buf[self.scanned..end];
            match self.args_left {
                None => {
                    let count = (line[0] == b'*').then(|| number(&line[1..])).flatten();
                    match count {
                        Some(n) if n <= ARGS_MAX as i64 => self.args_left = Some(n.max(0) as usize),
                        _ => return Err(protocol("invalid multibulk length")),
                    }
                }
                Some(left) => {
                    if line[0] != b'$' {
                        return Err(protocol(&format!("expected '$', got '{}'", line[0] as char)));
                    }
                    let len = number(&line[1..]).ok_or_else(|| protocol("invalid bulk length"))?;
                    if len < 0 || len as usize > ARG_BYTES_MAX {
                        return Err(protocol("invalid bulk length"));
                    }
                    self.total += len as usize;
                    if self.total > COMMAND_BYTES_MAX {
                        return Err(protocol("command too big"));
                    }
                    self.bulk_left = len as usize + 2;
                    self.args_left = Some(left - 1);
                }
            }
            self.scanned = end + 2;
        }
    }
}

/// Drops everything parsed so far (used after a protocol error).
pub fn discard(buf: &mut BytesMut) {
    let n = buf.len();
    buf.advance(n);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all(input: &[u8]) -> Result<Vec<Vec<Bytes>>, ProtocolError> {
        let mut buf = BytesMut::from(input);
        let mut out = Vec::new();
        while let Some(c) = parse(&mut buf)? {
            out.push(c);
        }
        Ok(out)
    }

    #[test]
    fn multibulk_inline_and_pipelines() {
        let got = all(b"*2\r\n$3\r\nGET\r\n$1\r\na\r\n*0\r\nPING\r\n  set  k v\r\n\r\n*1\r\n$4\r\nPI").unwrap();
        assert_eq!(got.len(), 3);
        assert_eq!(got[0], vec![Bytes::from("GET"), Bytes::from("a")]);
        assert_eq!(got[1], vec![Bytes::from("PING")]);
        assert_eq!(got[2], vec![Bytes::from("set"), Bytes::from("k"), Bytes::from("v")]);
    }

    #[test]
    fn inline_quotes_as_redis_splits_them() {
        let got = all(b"set \"a b\" 'c\\'d' \"\\x41\\n\"\r\n").unwrap();
        assert_eq!(
            got[0],
            vec![
                Bytes::from("set"),
                Bytes::from("a b"),
                Bytes::from("c'd"),
                Bytes::from("A\n")
            ]
        );
        assert!(
            all(b"set \"\"\"k\"\"\" v\r\n").is_err(),
            "a closing quote must end its argument"
        );
        assert!(all(b"set \"open v\r\n").is_err());
    }

    #[test]
    fn split_at_every_byte() {
        let input = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nva\r\nl\r\n";
        for cut in 0..input.len() {
            let mut buf = BytesMut::from(&input[..cut]);
            assert_eq!(parse(&mut buf).unwrap(), None, "cut {cut}");
            buf.extend_from_slice(&input[cut..]);
            let c = parse(&mut buf).unwrap().unwrap();
            assert_eq!(c[2], Bytes::from("va\r\nl"));
            assert!(buf.is_empty());
        }
    }

    /// Walks `input` as it arrives in pieces of `step` bytes, taking scanned bytes off the
    /// front now and then as a streaming reader does; what it took, and whether it ended.
    fn scan_in_steps(input: &[u8], step: usize) -> Result<(Vec<u8>, bool), ProtocolError> {
        let mut scan = Scan::default();
        let mut buf = BytesMut::new();
        let mut taken = Vec::new();
        for chunk in input.chunks(step) {
            buf.extend_from_slice(chunk);
            let done = scan.advance(&buf)?;
            if done || scan.scanned() > 7 {
                let n = scan.scanned();
                taken.extend_from_slice(&buf.split_to(n));
                scan.taken(n);
            }
            if done {
                return Ok((taken, true));
            }
        }
        Ok((taken, false))
    }

    #[test]
    fn a_scan_ends_where_parse_ends_however_the_bytes_arrive() {
        let command = b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$12\r\nva\r\nl\r\n\r\nue!\r\n";
        let mut input = command.to_vec();
        input.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
        for step in 1..input.len() {
            let (taken, done) = scan_in_steps(&input, step).unwrap();
            assert!(done, "step {step}");
            assert_eq!(taken, command, "step {step}");
        }
        assert_eq!(head(command), Some((3, &b"SET"[..])));
        assert_eq!(head(&command[..10]), None, "the name has not all arrived");
        assert_eq!(
            encode_command(&[Bytes::from("SET"), Bytes::from("k"), Bytes::from("va\r\nl\r\n\r\nue!")]),
            command
        );
        let (_, done) = scan_in_steps(&command[..command.len() - 1], 5).unwrap();
        assert!(!done, "the last byte is missing");
        for bad in [
            &b"*3\r\n$3\r\nSET\r\n$1\r\nkXX"[..],
            b"*1\r\n:3\r\n",
            b"*x\r\n",
            b"*1\r\n$-5\r\n",
        ] {
            assert!(scan_in_steps(bad, 3).is_err(), "{:?}", String::from_utf8_lossy(bad));
            assert!(all(bad).is_err());
        }
        let huge = format!("*2\r\n${}\r\n", ARG_BYTES_MAX + 1);
        assert!(scan_in_steps(huge.as_bytes(), 4).is_err());
    }

    #[test]
    fn malformed_and_oversized_are_errors() {
        assert!(all(b"*x\r\n").is_err());
        assert!(all(b"*1\r\n:3\r\n").is_err());
        assert!(all(b"*1\r\n$-5\r\n").is_err());
        assert!(all(b"*1\r\n$3\r\nabcde\r\n").is_err());
        assert!(all(format!("*1\r\n${}\r\n", ARG_BYTES_MAX + 1).as_bytes()).is_err());
        assert!(all(format!("*{}\r\n", ARGS_MAX + 1).as_bytes()).is_err());
        assert!(all(&vec![b'a'; INLINE_BYTES_MAX + 2]).is_err());
        // Above one operation but within proto-max-bulk-len: parsed (the gateway stages it).
        let mib = format!("*2\r\n$3\r\nGET\r\n${}\r\n{}\r\n", 1 << 20, "k".repeat(1 << 20));
        assert_eq!(all(mib.as_bytes()).unwrap()[0][1].len(), 1 << 20);
    }
}
