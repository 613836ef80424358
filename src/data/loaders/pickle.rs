//! A reader for the data subset of Python's pickle format, protocols 0 to 5: `None`, booleans,
//! integers (up to 64 bits), floats, `str`, `bytes`, lists, tuples, dicts and sets, shared
//! references through the memo, plus the two object kinds that data pickles contain —
//! numpy arrays and numpy scalars of booleans, integers and floats, and protocol 2's encodings of
//! `bytes`, `bytearray` and `set` (`_codecs.encode`, `builtins.bytes`, …) — which are turned into
//! plain lists and numbers.
//!
//! Used for the revisited Oxford/Paris ground truth (`gnd_roxford5k.pkl`, `gnd_rparis6k.pkl`).
//! The opcodes and their encodings are those of CPython's `Lib/pickletools.py`. Nothing is ever
//! executed: any other class (`GLOBAL` / `STACK_GLOBAL` naming something else) is an error naming
//! the class, so a pickle can never run code here.

use crate::error::{Error, Result};
use std::collections::HashMap;
use std::path::Path;

/// A decoded Python value.
#[derive(Debug, Clone, PartialEq)]
pub enum PickleValue {
    /// `None`.
    None,
    /// `True` / `False`.
    Bool(bool),
    /// An `int` that fits in 64 bits (also numpy integer scalars).
    Int(i64),
    /// A `float` (also numpy float scalars).
    Float(f64),
    /// A `str`.
    Str(String),
    /// A `bytes` or `bytearray`.
    Bytes(Vec<u8>),
    /// A `list` (also a numpy array, as nested lists in C order).
    List(Vec<PickleValue>),
    /// A `tuple`.
    Tuple(Vec<PickleValue>),
    /// A `dict`, entries in insertion order.
    Dict(Vec<(PickleValue, PickleValue)>),
    /// A `set` or `frozenset`.
    Set(Vec<PickleValue>),
}

impl PickleValue {
    /// The value of the string key `key` of a dict.
    pub fn get(&self, key: &str) -> Option<&PickleValue> {
        match self {
            PickleValue::Dict(entries) => entries
                .iter()
                .find(|(k, _)| matches!(k, PickleValue::Str(s) if s == key))
                .map(|(_, v)| v),
            _ => None,
        }
    }

    /// The items of a list or tuple.
    pub fn as_list(&self) -> Option<&[PickleValue]> {
        match self {
            PickleValue::List(v) | PickleValue::Tuple(v) => Some(v),
            _ => None,
        }
    }

    /// An integer (booleans count as 0 / 1, as in Python).
    pub fn as_i64(&self) -> Option<i64> {
        match self {
            PickleValue::Int(v) => Some(*v),
            PickleValue::Bool(b) => Some(*b as i64),
            _ => None,
        }
    }

    /// A float, or an integer converted to float.
    pub fn as_f64(&self) -> Option<f64> {
        match self {
            PickleValue::Float(v) => Some(*v),
            PickleValue::Int(v) => Some(*v as f64),
            _ => None,
        }
    }

    /// A string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            PickleValue::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// Reads a pickle file; errors name the file and the byte offset of the problem.
pub fn read_pickle(path: impl AsRef<Path>) -> Result<PickleValue> {
    let path = path.as_ref();
    let bytes = super::read_bytes(path)?;
    parse_pickle(&bytes).map_err(|msg| Error::file(path, format!("pickle: {msg}")))
}

/// Decodes the bytes of one pickle (see [`read_pickle`]).
pub fn parse_pickle(bytes: &[u8]) -> std::result::Result<PickleValue, String> {
    let mut m = Machine {
        b: bytes,
        pos: 0,
        nodes: Vec::new(),
        stack: Vec::new(),
        memo: HashMap::new(),
    };
    let root = m.run()?;
    m.value(root, 0)
}

/// A node of the object graph built by the pickle machine; containers refer to other nodes by
/// index, so that memoised objects mutated later (`APPENDS` after `MEMOIZE`) are shared.
#[derive(Debug, Clone)]
enum Node {
    None,
    Bool(bool),
    Int(i64),
    Float(f64),
    Str(String),
    Bytes(Vec<u8>),
    List(Vec<usize>),
    Tuple(Vec<usize>),
    Dict(Vec<(usize, usize)>),
    Set(Vec<usize>),
    Global(String, String),
    Object {
        class: usize,
        args: usize,
        state: Option<usize>,
    },
}

#[derive(Debug, Clone, Copy)]
enum Slot {
    Mark,
    Node(usize),
}

struct Machine<'a> {
    b: &'a [u8],
    pos: usize,
    nodes: Vec<Node>,
    stack: Vec<Slot>,
    memo: HashMap<u64, usize>,
}

/// Nesting beyond this is treated as a cycle (a container holding itself) or garbage.
const MAX_DEPTH: usize = 512;

type R<T> = std::result::Result<T, String>;

impl Machine<'_> {
    fn take(&mut self, n: usize) -> R<&[u8]> {
        let start = self.pos;
        let end = start
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| format!("truncated: {n} bytes needed at byte {start}"))?;
        self.pos = end;
        Ok(&self.b[start..end])
    }

    fn byte(&mut self) -> R<u8> {
        Ok(self.take(1)?[0])
    }

    fn le<const N: usize>(&mut self) -> R<[u8; N]> {
        Ok(self.take(N)?.try_into().expect("N bytes"))
    }

    /// A newline-terminated argument (protocol 0), as latin-1 text: the encoding of
    /// `raw-unicode-escape` and of Python 2 string literals, and a superset of ASCII.
    fn line(&mut self) -> R<String> {
        let start = self.pos;
        let len = self.b[start..]
            .iter()
            .position(|&c| c == b'\n')
            .ok_or_else(|| format!("unterminated text argument at byte {start}"))?;
        let s = self.take(len)?.iter().map(|&c| c as char).collect();
        self.pos += 1;
        Ok(s)
    }

    fn push(&mut self, node: Node) {
        self.nodes.push(node);
        self.stack.push(Slot::Node(self.nodes.len() - 1));
    }

    fn pop(&mut self, at: usize) -> R<usize> {
        match self.stack.pop() {
            Some(Slot::Node(i)) => Ok(i),
            Some(Slot::Mark) => Err(format!("unexpected mark at byte {at}")),
            None => Err(format!("stack underflow at byte {at}")),
        }
    }

    fn top(&self, at: usize) -> R<usize> {
        match self.stack.last() {
            Some(Slot::Node(i)) => Ok(*i),
            _ => Err(format!("no object on the stack at byte {at}")),
        }
    }

    /// Pops everything down to the topmost mark (and the mark).
    fn pop_mark(&mut self, at: usize) -> R<Vec<usize>> {
        let k = self
            .stack
            .iter()
            .rposition(|s| matches!(s, Slot::Mark))
            .ok_or_else(|| format!("no mark on the stack at byte {at}"))?;
        let items = self.stack[k + 1..]
            .iter()
            .map(|s| match s {
                Slot::Node(i) => *i,
                Slot::Mark => unreachable!("topmost mark"),
            })
            .collect();
        self.stack.truncate(k);
        Ok(items)
    }

    fn memo_put(&mut self, key: u64, at: usize) -> R<()> {
        let i = self.top(at)?;
        self.memo.insert(key, i);
        Ok(())
    }

    fn memo_get(&mut self, key: u64, at: usize) -> R<()> {
        let i = *self
            .memo
            .get(&key)
            .ok_or_else(|| format!("memo key {key} not found at byte {at}"))?;
        self.stack.push(Slot::Node(i));
        Ok(())
    }

    fn extend_list(&mut self, list: usize, items: Vec<usize>, at: usize) -> R<()> {
        match &mut self.nodes[list] {
            Node::List(v) | Node::Set(v) => {
                v.extend(items);
                Ok(())
            }
            _ => Err(format!("append to a non-list at byte {at}")),
        }
    }

    fn set_items(&mut self, dict: usize, items: Vec<usize>, at: usize) -> R<()> {
        if !items.len().is_multiple_of(2) {
            return Err(format!("odd number of dict items at byte {at}"));
        }
        match &mut self.nodes[dict] {
            Node::Dict(v) => {
                for kv in items.chunks(2) {
                    v.push((kv[0], kv[1]));
                }
                Ok(())
            }
            _ => Err(format!("set item on a non-dict at byte {at}")),
        }
    }

    fn str_arg(&mut self, n: usize, at: usize) -> R<()> {
        let s = String::from_utf8(self.take(n)?.to_vec())
            .map_err(|_| format!("invalid UTF-8 string at byte {at}"))?;
        self.push(Node::Str(s));
        Ok(())
    }

    fn bytes_arg(&mut self, n: usize) -> R<()> {
        let v = self.take(n)?.to_vec();
        self.push(Node::Bytes(v));
        Ok(())
    }

    fn usize_arg(len: u64, at: usize) -> R<usize> {
        usize::try_from(len).map_err(|_| format!("length {len} too large at byte {at}"))
    }

    /// Runs the opcodes up to `STOP` and returns the root node.
    fn run(&mut self) -> R<usize> {
        loop {
            let at = self.pos;
            let op = self
                .byte()
                .map_err(|_| "no STOP opcode: truncated pickle".to_string())?;
            match op {
                b'.' => return self.pop(at),
                b'\x80' => {
                    let proto = self.byte()?;
                    if proto > 5 {
                        return Err(format!("unsupported protocol {proto}"));
                    }
                }
                b'\x95' => {
                    self.take(8)?; // FRAME: a length hint only.
                }
                b'(' => self.stack.push(Slot::Mark),
                b'0' => {
                    self.stack
                        .pop()
                        .ok_or_else(|| format!("stack underflow at byte {at}"))?;
                }
                b'1' => {
                    self.pop_mark(at)?;
                }
                b'2' => {
                    let i = self.top(at)?;
                    self.stack.push(Slot::Node(i));
                }
                b'N' => self.push(Node::None),
                b'\x88' => self.push(Node::Bool(true)),
                b'\x89' => self.push(Node::Bool(false)),
                b'J' => {
                    let v = i32::from_le_bytes(self.le()?);
                    self.push(Node::Int(v as i64));
                }
                b'K' => {
                    let v = self.byte()?;
                    self.push(Node::Int(v as i64));
                }
                b'M' => {
                    let v = u16::from_le_bytes(self.le()?);
                    self.push(Node::Int(v as i64));
                }
                b'\x8a' | b'\x8b' => {
                    let n = if op == b'\x8a' {
                        self.byte()? as usize
                    } else {
                        let n = i32::from_le_bytes(self.le()?);
                        usize::try_from(n).map_err(|_| format!("negative LONG4 at byte {at}"))?
                    };
                    let v = long_from_le(self.take(n)?)
                        .ok_or_else(|| format!("integer wider than 64 bits at byte {at}"))?;
                    self.push(Node::Int(v));
                }
                b'I' => {
                    let s = self.line()?;
                    let node = match s.as_str() {
                        "00" => Node::Bool(false),
                        "01" => Node::Bool(true),
                        t => Node::Int(
                            t.parse()
                                .map_err(|_| format!("bad INT '{t}' at byte {at}"))?,
                        ),
                    };
                    self.push(node);
                }
                b'L' => {
                    let s = self.line()?;
                    let t = s.strip_suffix('L').unwrap_or(&s);
                    let v = t
                        .parse()
                        .map_err(|_| format!("bad LONG '{s}' at byte {at}"))?;
                    self.push(Node::Int(v));
                }
                b'G' => {
                    let v = f64::from_be_bytes(self.le()?);
                    self.push(Node::Float(v));
                }
                b'F' => {
                    let s = self.line()?;
                    let v = s
                        .parse()
                        .map_err(|_| format!("bad FLOAT '{s}' at byte {at}"))?;
                    self.push(Node::Float(v));
                }
                b'X' => {
                    let n = u32::from_le_bytes(self.le()?) as usize;
                    self.str_arg(n, at)?;
                }
                b'\x8c' => {
                    let n = self.byte()? as usize;
                    self.str_arg(n, at)?;
                }
                b'\x8d' => {
                    let n = Self::usize_arg(u64::from_le_bytes(self.le()?), at)?;
                    self.str_arg(n, at)?;
                }
                b'V' => {
                    let s = self.line()?;
                    let v = raw_unicode_unescape(&s)
                        .ok_or_else(|| format!("bad UNICODE escape at byte {at}"))?;
                    self.push(Node::Str(v));
                }
                b'T' => {
                    // Python 2 `str`; Python 3 reads it as text (ASCII/latin-1 by default).
                    let n = u32::from_le_bytes(self.le()?) as usize;
                    let s = self.take(n)?.iter().map(|&c| c as char).collect();
                    self.push(Node::Str(s));
                }
                b'U' => {
                    let n = self.byte()? as usize;
                    let s = self.take(n)?.iter().map(|&c| c as char).collect();
                    self.push(Node::Str(s));
                }
                b'S' => {
                    let s = self.line()?;
                    let v = python_string_literal(&s)
                        .ok_or_else(|| format!("bad STRING literal at byte {at}"))?;
                    self.push(Node::Str(v));
                }
                b'B' => {
                    let n = u32::from_le_bytes(self.le()?) as usize;
                    self.bytes_arg(n)?;
                }
                b'C' => {
                    let n = self.byte()? as usize;
                    self.bytes_arg(n)?;
                }
                b'\x8e' | b'\x96' => {
                    let n = Self::usize_arg(u64::from_le_bytes(self.le()?), at)?;
                    self.bytes_arg(n)?;
                }
                b']' => self.push(Node::List(Vec::new())),
                b')' => self.push(Node::Tuple(Vec::new())),
                b'}' => self.push(Node::Dict(Vec::new())),
                b'\x8f' => self.push(Node::Set(Vec::new())),
                b'l' => {
                    let items = self.pop_mark(at)?;
                    self.push(Node::List(items));
                }
                b't' => {
                    let items = self.pop_mark(at)?;
                    self.push(Node::Tuple(items));
                }
                b'\x91' => {
                    let items = self.pop_mark(at)?;
                    self.push(Node::Set(items));
                }
                b'd' => {
                    let items = self.pop_mark(at)?;
                    self.push(Node::Dict(Vec::new()));
                    let d = self.top(at)?;
                    self.set_items(d, items, at)?;
                }
                b'\x85' | b'\x86' | b'\x87' => {
                    let n = (op - b'\x84') as usize;
                    let mut items = Vec::with_capacity(n);
                    for _ in 0..n {
                        items.push(self.pop(at)?);
                    }
                    items.reverse();
                    self.push(Node::Tuple(items));
                }
                b'a' => {
                    let item = self.pop(at)?;
                    let list = self.top(at)?;
                    self.extend_list(list, vec![item], at)?;
                }
                b'e' | b'\x90' => {
                    let items = self.pop_mark(at)?;
                    let list = self.top(at)?;
                    self.extend_list(list, items, at)?;
                }
                b's' => {
                    let v = self.pop(at)?;
                    let k = self.pop(at)?;
                    let d = self.top(at)?;
                    self.set_items(d, vec![k, v], at)?;
                }
                b'u' => {
                    let items = self.pop_mark(at)?;
                    let d = self.top(at)?;
                    self.set_items(d, items, at)?;
                }
                b'p' => {
                    let s = self.line()?;
                    let k = s
                        .parse()
                        .map_err(|_| format!("bad PUT '{s}' at byte {at}"))?;
                    self.memo_put(k, at)?;
                }
                b'q' => {
                    let k = self.byte()? as u64;
                    self.memo_put(k, at)?;
                }
                b'r' => {
                    let k = u32::from_le_bytes(self.le()?) as u64;
                    self.memo_put(k, at)?;
                }
                b'\x94' => {
                    let k = self.memo.len() as u64;
                    self.memo_put(k, at)?;
                }
                b'g' => {
                    let s = self.line()?;
                    let k = s
                        .parse()
                        .map_err(|_| format!("bad GET '{s}' at byte {at}"))?;
                    self.memo_get(k, at)?;
                }
                b'h' => {
                    let k = self.byte()? as u64;
                    self.memo_get(k, at)?;
                }
                b'j' => {
                    let k = u32::from_le_bytes(self.le()?) as u64;
                    self.memo_get(k, at)?;
                }
                b'c' => {
                    let module = self.line()?;
                    let name = self.line()?;
                    self.push(Node::Global(module, name));
                }
                b'\x93' => {
                    let name = self.pop(at)?;
                    let module = self.pop(at)?;
                    match (&self.nodes[module], &self.nodes[name]) {
                        (Node::Str(m), Node::Str(n)) => {
                            let g = Node::Global(m.clone(), n.clone());
                            self.push(g);
                        }
                        _ => return Err(format!("STACK_GLOBAL without strings at byte {at}")),
                    }
                }
                b'R' | b'\x81' => {
                    let args = self.pop(at)?;
                    let class = self.pop(at)?;
                    self.push(Node::Object {
                        class,
                        args,
                        state: None,
                    });
                }
                b'b' => {
                    let state = self.pop(at)?;
                    let obj = self.top(at)?;
                    match &mut self.nodes[obj] {
                        Node::Object { state: s, .. } => *s = Some(state),
                        _ => return Err(format!("BUILD on a non-object at byte {at}")),
                    }
                }
                other => {
                    return Err(format!(
                        "unsupported opcode 0x{other:02x} at byte {at} (only plain data, numpy \
                         arrays and numpy scalars are supported)"
                    ))
                }
            }
        }
    }

    /// Converts node `i` (and its children) into a value.
    fn value(&self, i: usize, depth: usize) -> R<PickleValue> {
        if depth > MAX_DEPTH {
            return Err("nesting deeper than 512 levels (a cyclic structure?)".into());
        }
        let all = |v: &[usize]| -> R<Vec<PickleValue>> {
            v.iter().map(|&j| self.value(j, depth + 1)).collect()
        };
        Ok(match &self.nodes[i] {
            Node::None => PickleValue::None,
            Node::Bool(b) => PickleValue::Bool(*b),
            Node::Int(v) => PickleValue::Int(*v),
            Node::Float(v) => PickleValue::Float(*v),
            Node::Str(s) => PickleValue::Str(s.clone()),
            Node::Bytes(b) => PickleValue::Bytes(b.clone()),
            Node::List(v) => PickleValue::List(all(v)?),
            Node::Tuple(v) => PickleValue::Tuple(all(v)?),
            Node::Set(v) => PickleValue::Set(all(v)?),
            Node::Dict(kv) => PickleValue::Dict(
                kv.iter()
                    .map(|&(k, v)| Ok((self.value(k, depth + 1)?, self.value(v, depth + 1)?)))
                    .collect::<R<Vec<_>>>()?,
            ),
            Node::Global(m, n) => return Err(format!("a bare reference to {m}.{n}")),
            Node::Object { class, args, state } => {
                let Node::Global(module, name) = &self.nodes[*class] else {
                    return Err("an object whose class is not a global".into());
                };
                // The arguments may name a class (numpy's `_reconstruct(ndarray, …)`): such a
                // direct argument becomes its dotted name; nothing is ever called.
                let args = match &self.nodes[*args] {
                    Node::Tuple(items) => PickleValue::Tuple(
                        items
                            .iter()
                            .map(|&j| match &self.nodes[j] {
                                Node::Global(m, n) => Ok(PickleValue::Str(format!("{m}.{n}"))),
                                _ => self.value(j, depth + 1),
                            })
                            .collect::<R<Vec<_>>>()?,
                    ),
                    _ => self.value(*args, depth + 1)?,
                };
                let state = state.map(|s| self.value(s, depth + 1)).transpose()?;
                objects::object(module, name, args, state)?
            }
        })
    }
}

/// A little-endian two's-complement integer of at most 8 bytes (`LONG1` / `LONG4`).
fn long_from_le(b: &[u8]) -> Option<i64> {
    if b.is_empty() {
        return Some(0);
    }
    if b.len() > 8 {
        // Accept wider encodings whose extra bytes are pure sign extension.
        let sign = if b[7] & 0x80 != 0 { 0xff } else { 0 };
        if b[8..].iter().any(|&x| x != sign) {
            return None;
        }
        return long_from_le(&b[..8]);
    }
    let mut buf = if b[b.len() - 1] & 0x80 != 0 {
        [0xffu8; 8]
    } else {
        [0u8; 8]
    };
    buf[..b.len()].copy_from_slice(b);
    Some(i64::from_le_bytes(buf))
}

/// Decodes the raw-unicode-escape text of protocol 0's `UNICODE`.
fn raw_unicode_unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\\' && matches!(chars.peek(), Some('u') | Some('U')) {
            let width = if chars.next()? == 'u' { 4 } else { 8 };
            let hex: String = (0..width).map(|_| chars.next()).collect::<Option<_>>()?;
            out.push(char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?);
        } else {
            out.push(c);
        }
    }
    Some(out)
}

/// Decodes a quoted Python 2 string literal (protocol 0's `STRING`), with the common escapes.
fn python_string_literal(s: &str) -> Option<String> {
    let q = s.chars().next()?;
    if !(q == '\'' || q == '"') || !s.ends_with(q) || s.len() < 2 {
        return None;
    }
    let body = &s[1..s.len() - 1];
    let mut out = String::new();
    let mut chars = body.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next()? {
            'n' => out.push('\n'),
            't' => out.push('\t'),
            'r' => out.push('\r'),
            '\\' => out.push('\\'),
            '\'' => out.push('\''),
            '"' => out.push('"'),
            'x' => {
                let hex: String = (0..2).map(|_| chars.next()).collect::<Option<_>>()?;
                out.push(u8::from_str_radix(&hex, 16).ok()? as char);
            }
            _ => return None,
        }
    }
    Some(out)
}

/// The objects data pickles contain: numpy arrays and scalars, and protocol 2's encodings of
/// `bytes`, `bytearray` and `set`.
mod objects {
    use super::PickleValue;

    type R<T> = std::result::Result<T, String>;

    /// Rebuilds `module.name(*args)` with `state` applied, for the supported classes.
    pub(super) fn object(
        module: &str,
        name: &str,
        args: PickleValue,
        state: Option<PickleValue>,
    ) -> R<PickleValue> {
        let is_numpy_core = matches!(module, "numpy.core.multiarray" | "numpy._core.multiarray");
        let is_builtins = matches!(module, "builtins" | "__builtin__");
        match (module, name) {
            // Protocol 2 writes `b''` as `bytes()`, a bytearray as
            // `bytearray(text, 'latin-1')`, and sets as `set(list)`.
            (_, "bytes" | "bytearray") if is_builtins => {
                let a = args.as_list().unwrap_or(&[]);
                match a {
                    [] => Ok(PickleValue::Bytes(Vec::new())),
                    [PickleValue::Str(s), PickleValue::Str(enc)]
                        if enc == "latin-1" || enc == "latin1" =>
                    {
                        latin1(s)
                    }
                    [PickleValue::List(items)] => items
                        .iter()
                        .map(|v| v.as_i64().and_then(|b| u8::try_from(b).ok()))
                        .collect::<Option<Vec<u8>>>()
                        .map(PickleValue::Bytes)
                        .ok_or_else(|| "bytes() of a list that is not bytes".to_string()),
                    _ => Err(format!("unsupported arguments of {module}.{name}")),
                }
            }
            (_, "set" | "frozenset") if is_builtins => match args.as_list() {
                Some([]) => Ok(PickleValue::Set(Vec::new())),
                Some([PickleValue::List(items)]) => Ok(PickleValue::Set(items.clone())),
                _ => Err(format!("unsupported arguments of {module}.{name}")),
            },
            // Protocol 2 pickles Python 3 `bytes` as `_codecs.encode(text, 'latin1')`.
            ("_codecs", "encode") => {
                let a = args.as_list().unwrap_or(&[]);
                match (a.first(), a.get(1).and_then(|e| e.as_str())) {
                    (Some(PickleValue::Str(s)), Some("latin1" | "latin-1")) => latin1(s),
                    (Some(PickleValue::Str(s)), None) if a.len() == 1 => {
                        Ok(PickleValue::Bytes(s.as_bytes().to_vec()))
                    }
                    _ => Err("unsupported _codecs.encode arguments".into()),
                }
            }
            ("numpy", "dtype") => {
                let a = args.as_list().unwrap_or(&[]);
                let code = a
                    .first()
                    .and_then(|c| c.as_str())
                    .ok_or("numpy.dtype without a type code")?;
                // state = (version, byte order, …); the byte order is its second item.
                let order = state
                    .as_ref()
                    .and_then(|s| s.as_list())
                    .and_then(|s| s.get(1))
                    .and_then(|o| o.as_str())
                    .unwrap_or("|")
                    .to_string();
                Ok(PickleValue::Tuple(vec![
                    PickleValue::Str("__dtype__".into()),
                    PickleValue::Str(code.to_string()),
                    PickleValue::Str(order),
                ]))
            }
            (_, "_reconstruct") if is_numpy_core => {
                let state = state.ok_or("numpy array without state")?;
                let s = state.as_list().ok_or("numpy array state is not a tuple")?;
                // (version, shape, dtype, is_fortran, raw data)
                if s.len() != 5 {
                    return Err(format!(
                        "numpy array state has {} items, expected 5",
                        s.len()
                    ));
                }
                let shape: Vec<usize> = s[1]
                    .as_list()
                    .ok_or("numpy shape is not a tuple")?
                    .iter()
                    .map(|d| {
                        d.as_i64()
                            .map(|d| d as usize)
                            .ok_or_else(|| "bad numpy shape".to_string())
                    })
                    .collect::<R<_>>()?;
                let (code, order) = dtype_of(&s[2])?;
                let fortran = matches!(s[3], PickleValue::Bool(true));
                let values = match &s[4] {
                    PickleValue::Bytes(raw) => decode(raw, &code, &order)?,
                    PickleValue::List(items) => items.clone(), // object arrays
                    _ => return Err("numpy array data is neither bytes nor a list".into()),
                };
                let count: usize = shape.iter().product();
                if values.len() != count {
                    return Err(format!(
                        "numpy array of shape {shape:?} holds {} values",
                        values.len()
                    ));
                }
                Ok(nest(&shape, values, fortran))
            }
            (_, "scalar") if is_numpy_core => {
                let a = args.as_list().ok_or("numpy scalar without arguments")?;
                let (code, order) = dtype_of(a.first().ok_or("numpy scalar without dtype")?)?;
                let raw = match a.get(1) {
                    Some(PickleValue::Bytes(b)) => b,
                    _ => return Err("numpy scalar without raw bytes".into()),
                };
                let mut v = decode(raw, &code, &order)?;
                if v.len() != 1 {
                    return Err("numpy scalar with more than one value".into());
                }
                Ok(v.remove(0))
            }
            _ => Err(format!(
                "unsupported object {module}.{name} (only plain data, numpy arrays and numpy \
                 scalars are supported)"
            )),
        }
    }

    /// The bytes of latin-1 text (every character below 256).
    fn latin1(s: &str) -> R<PickleValue> {
        s.chars()
            .map(|c| u8::try_from(c as u32).ok())
            .collect::<Option<Vec<u8>>>()
            .map(PickleValue::Bytes)
            .ok_or_else(|| "latin-1 bytes with a character above 255".to_string())
    }

    fn dtype_of(v: &PickleValue) -> R<(String, String)> {
        match v.as_list() {
            Some([PickleValue::Str(tag), PickleValue::Str(code), PickleValue::Str(order)])
                if tag == "__dtype__" =>
            {
                Ok((code.clone(), order.clone()))
            }
            _ => Err("numpy array without a dtype".into()),
        }
    }

    /// Decodes raw array bytes of a boolean, integer or float dtype (`'i8'`, `'<f4'`, `'b1'`…).
    fn decode(raw: &[u8], code: &str, order: &str) -> R<Vec<PickleValue>> {
        let code = code.trim_start_matches(['<', '>', '|', '=']);
        let big = order == ">";
        let (kind, width) = code.split_at(1);
        let width: usize = width
            .parse()
            .map_err(|_| format!("unsupported dtype '{code}'"))?;
        if width == 0 || !raw.len().is_multiple_of(width) {
            return Err(format!("{} bytes do not hold {code} values", raw.len()));
        }
        raw.chunks_exact(width)
            .map(|c| {
                let mut b = [0u8; 8];
                if big {
                    b[..width].copy_from_slice(c);
                    b[..width].reverse();
                } else {
                    b[..width].copy_from_slice(c);
                }
                let u = u64::from_le_bytes(b);
                let sign_extend = |u: u64| -> i64 {
                    let shift = 64 - 8 * width as u32;
                    ((u << shift) as i64) >> shift
                };
                Ok(match (kind, width) {
                    ("b", 1) => PickleValue::Bool(u != 0),
                    ("i", 1 | 2 | 4 | 8) => PickleValue::Int(sign_extend(u)),
                    ("u", 1 | 2 | 4) => PickleValue::Int(u as i64),
                    ("u", 8) => PickleValue::Int(
                        i64::try_from(u).map_err(|_| "uint64 value above 2^63".to_string())?,
                    ),
                    ("f", 4) => PickleValue::Float(f32::from_bits(u as u32) as f64),
                    ("f", 8) => PickleValue::Float(f64::from_bits(u)),
                    _ => return Err(format!("unsupported dtype '{code}'")),
                })
            })
            .collect()
    }

    /// Nested lists of `shape` from values in C (or Fortran) order; 0-d gives the value itself.
    fn nest(shape: &[usize], values: Vec<PickleValue>, fortran: bool) -> PickleValue {
        if shape.is_empty() {
            return values.into_iter().next().unwrap_or(PickleValue::None);
        }
        let count: usize = shape.iter().product();
        // Strides of each axis in the flat buffer.
        let mut strides = vec![0usize; shape.len()];
        let mut acc = 1;
        if fortran {
            for (s, &d) in strides.iter_mut().zip(shape) {
                *s = acc;
                acc *= d;
            }
        } else {
            for (s, &d) in strides.iter_mut().zip(shape).rev() {
                *s = acc;
                acc *= d;
            }
        }
        fn build(
            shape: &[usize],
            strides: &[usize],
            offset: usize,
            values: &[PickleValue],
        ) -> PickleValue {
            if shape.is_empty() {
                return values[offset].clone();
            }
            PickleValue::List(
                (0..shape[0])
                    .map(|k| build(&shape[1..], &strides[1..], offset + k * strides[0], values))
                    .collect(),
            )
        }
        debug_assert_eq!(values.len(), count);
        build(shape, &strides, 0, &values)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_2_dict_of_lists() {
        // pickle.dumps({'a': [1, 300, -2], 'b': 1.5}, protocol=2)
        let b = b"\x80\x02}q\x00(X\x01\x00\x00\x00aq\x01]q\x02(K\x01M,\x01J\xfe\xff\xff\xffeX\x01\x00\x00\x00bq\x03G?\xf8\x00\x00\x00\x00\x00\x00u.";
        let v = parse_pickle(b).unwrap();
        let a = v.get("a").unwrap().as_list().unwrap();
        assert_eq!(
            a.iter().map(|x| x.as_i64().unwrap()).collect::<Vec<_>>(),
            vec![1, 300, -2]
        );
        assert_eq!(v.get("b").unwrap().as_f64(), Some(1.5));
    }

    #[test]
    fn memo_shares_mutated_objects() {
        // l = []; pickle.dumps([l, l], protocol=4) after l.append(7): the GET sees the append.
        let b = b"\x80\x04\x95\x0c\x00\x00\x00\x00\x00\x00\x00]\x94(]\x94K\x07ah\x01e.";
        let v = parse_pickle(b).unwrap();
        let outer = v.as_list().unwrap();
        assert_eq!(outer.len(), 2);
        assert_eq!(outer[0], outer[1]);
        assert_eq!(outer[0].as_list().unwrap()[0].as_i64(), Some(7));
    }

    #[test]
    fn long1_and_protocol_0_text() {
        assert_eq!(long_from_le(&[0xff, 0x00]), Some(255));
        assert_eq!(long_from_le(&[0x00, 0xff]), Some(-256));
        assert_eq!(long_from_le(&[0; 9]), Some(0));
        assert_eq!(long_from_le(&[0, 0, 0, 0, 0, 0, 0, 0, 1]), None);
        // pickle.dumps([1, 'é', 2.5], protocol=0)
        let b = b"(lp0\nI1\naV\xe9\np1\naF2.5\na.";
        let v = parse_pickle(b).unwrap();
        let l = v.as_list().unwrap();
        assert_eq!(l[0].as_i64(), Some(1));
        assert_eq!(l[1].as_str(), Some("é"));
        assert_eq!(l[2].as_f64(), Some(2.5));
    }

    #[test]
    fn refuses_arbitrary_objects_and_truncation() {
        let b = b"\x80\x02cposix\nsystem\nq\x00X\x02\x00\x00\x00lsq\x01\x85q\x02Rq\x03.";
        let err = parse_pickle(b).unwrap_err();
        assert!(err.contains("posix.system"), "{err}");
        assert!(parse_pickle(b"\x80\x02]q\x00(K\x01").is_err());
        assert!(parse_pickle(b"").is_err());
    }
}
