//! Bounds on a `torch.save` pickle, checked by walking its opcodes before
//! [`candle_core::pickle::Stack`] builds anything: candle's objects are
//! nested `Vec`s and `Box`es, so a pickle nested 200 000 deep overflows the
//! stack when they are built or dropped, and one whose memo references
//! double (`y = [x, x]`, forty times) materialises 2^40 objects, because
//! every memo get clones. The walk simulates the pickle machine's stack with
//! each value's nesting depth and object count (a memo get counts a full
//! copy, as candle makes one) and refuses past [`MAX_DEPTH`] and
//! [`MAX_OBJECTS`]. A `torch.save` dict of tensors is a few levels deep and
//! a few hundred objects. Opcodes are those of pickle protocols 0–4
//! (`Lib/pickletools.py` lists each with its argument); one it does not know
//! is left to candle, which refuses it.

use std::collections::HashMap;

/// Deepest nesting of containers a record may hold.
pub const MAX_DEPTH: u32 = 256;

/// Most objects a record may materialise (memo copies included).
pub const MAX_OBJECTS: u64 = 1_000_000;

/// One value on the simulated stack: its nesting depth and object count.
#[derive(Clone, Copy)]
struct Shape {
    depth: u32,
    objects: u64,
}

const LEAF: Shape = Shape {
    depth: 0,
    objects: 1,
};

/// An entry of the simulated stack: a value, or a MARK.
#[derive(Clone, Copy)]
enum Slot {
    Value(Shape),
    Mark,
}

/// The simulated machine.
struct Machine {
    stack: Vec<Slot>,
    memo: HashMap<u64, Shape>,
}

impl Machine {
    fn push(&mut self, s: Shape) -> Result<(), String> {
        if s.depth > MAX_DEPTH {
            return Err(format!(
                "the pickle nests containers more than {MAX_DEPTH} deep (a torch.save dict of tensors nests a few)"
            ));
        }
        if s.objects > MAX_OBJECTS {
            return Err(format!(
                "the pickle materialises more than {MAX_OBJECTS} objects (memo copies counted; a torch.save dict of tensors holds a few hundred)"
            ));
        }
        if self.stack.len() > MAX_OBJECTS as usize {
            return Err(format!("the pickle stacks more than {MAX_OBJECTS} values"));
        }
        self.stack.push(Slot::Value(s));
        Ok(())
    }

    fn pop(&mut self) -> Result<Shape, String> {
        match self.stack.pop() {
            Some(Slot::Value(s)) => Ok(s),
            _ => Err("the pickle pops a value it never pushed".into()),
        }
    }

    /// Pops down to the last MARK; the values' combined shape.
    fn pop_mark(&mut self) -> Result<Shape, String> {
        let mut acc = Shape {
            depth: 0,
            objects: 0,
        };
        loop {
            match self.stack.pop() {
                Some(Slot::Value(s)) => acc = combine(acc, s),
                Some(Slot::Mark) => return Ok(acc),
                None => return Err("the pickle pops to a MARK it never set".into()),
            }
        }
    }

    /// Pops `n` values; their combined shape.
    fn pop_n(&mut self, n: usize) -> Result<Shape, String> {
        let mut acc = Shape {
            depth: 0,
            objects: 0,
        };
        for _ in 0..n {
            acc = combine(acc, self.pop()?);
        }
        Ok(acc)
    }

    /// A container of `inner` pushed.
    fn contain(&mut self, inner: Shape) -> Result<(), String> {
        self.push(Shape {
            depth: inner.depth.saturating_add(1),
            objects: inner.objects.saturating_add(1),
        })
    }

    /// `inner` added into the container on top of the stack (APPEND, SETITEM, BUILD).
    fn add_into_top(&mut self, inner: Shape) -> Result<(), String> {
        let top = self.pop()?;
        self.push(Shape {
            depth: top.depth.max(inner.depth.saturating_add(1)),
            objects: top.objects.saturating_add(inner.objects),
        })
    }

    fn top(&self) -> Result<Shape, String> {
        match self.stack.last() {
            Some(Slot::Value(s)) => Ok(*s),
            _ => Err("the pickle memoises a value it never pushed".into()),
        }
    }
}

fn combine(a: Shape, b: Shape) -> Shape {
    Shape {
        depth: a.depth.max(b.depth),
        objects: a.objects.saturating_add(b.objects),
    }
}

/// Reads little-endian bytes `n` at `at`.
fn le(p: &[u8], at: usize, n: usize) -> Result<u64, String> {
    let b = p
        .get(at..at + n)
        .ok_or_else(|| "the pickle ends inside an opcode's argument".to_string())?;
    Ok(b.iter().rev().fold(0u64, |acc, &x| (acc << 8) | x as u64))
}

/// Checks `pickle` against [`MAX_DEPTH`] and [`MAX_OBJECTS`].
///
/// Errors: one phrase saying which bound was passed, or that the opcodes
/// are truncated.
pub fn check(pickle: &[u8]) -> Result<(), String> {
    let mut m = Machine {
        stack: Vec::new(),
        memo: HashMap::new(),
    };
    let mut at = 0usize;
    while at < pickle.len() {
        let op = pickle[at];
        at += 1;
        let arg = match leaf(op, pickle, at)? {
            Some(n) => {
                m.push(LEAF)?;
                n
            }
            None => match structure(&mut m, op, pickle, at)? {
                Some(n) => n,
                // STOP, or an opcode candle refuses with its own message.
                None => return Ok(()),
            },
        };
        at += arg;
    }
    Ok(())
}

/// The argument length of an opcode that pushes one leaf value (a number,
/// a string, None, a bool, an empty container, a GLOBAL); `None` for the
/// others.
fn leaf(op: u8, p: &[u8], at: usize) -> Result<Option<usize>, String> {
    let counted = |width: usize| -> Result<usize, String> {
        let n = le(p, at, width)? as usize;
        width
            .checked_add(n)
            .filter(|&e| at + e <= p.len())
            .ok_or_else(|| "the pickle ends inside a string or bytes argument".to_string())
    };
    let line = |from: usize| -> Result<usize, String> {
        p[from.min(p.len())..]
            .iter()
            .position(|&b| b == b'\n')
            .map(|n| n + 1)
            .ok_or_else(|| "the pickle ends inside a text argument".to_string())
    };
    Ok(Some(match op {
        b'}' | b']' | b')' | b'N' | 0x88 | 0x89 => 0,
        b'K' => 1,
        b'M' => 2,
        b'J' => 4,
        b'G' => 8,
        0x8a | b'U' | b'C' | 0x8c => counted(1)?,
        0x8b | b'X' | b'T' | b'B' => counted(4)?,
        0x8e => counted(8)?,
        b'I' | b'L' | b'F' | b'S' | b'V' => line(at)?,
        b'c' => {
            let first = line(at)?;
            first + line(at + first)?
        }
        _ => return Ok(None),
    }))
}

/// Applies an opcode that builds, memoises or drops values; its argument
/// length, or `None` at STOP or an opcode it does not know.
fn structure(m: &mut Machine, op: u8, p: &[u8], at: usize) -> Result<Option<usize>, String> {
    Ok(Some(match op {
        b'.' => return Ok(None),
        0x80 => 1, // PROTO
        0x95 => 8, // FRAME
        b'(' => {
            m.stack.push(Slot::Mark);
            0
        }
        b'q' | b'r' => {
            let width = if op == b'q' { 1 } else { 4 };
            let key = le(p, at, width)?;
            m.memo.insert(key, m.top()?);
            width
        }
        0x94 => {
            let key = m.memo.len() as u64;
            m.memo.insert(key, m.top()?);
            0
        }
        b'h' | b'j' => {
            let width = if op == b'h' { 1 } else { 4 };
            let key = le(p, at, width)?;
            let s = *m
                .memo
                .get(&key)
                .ok_or_else(|| format!("the pickle gets memo entry {key}, never put"))?;
            m.push(s)?;
            width
        }
        b't' | b'l' | b'd' => {
            let inner = m.pop_mark()?;
            m.contain(inner)?;
            0
        }
        0x85..=0x87 => {
            let inner = m.pop_n((op - 0x84) as usize)?;
            m.contain(inner)?;
            0
        }
        b'a' | b'b' => {
            let v = m.pop()?;
            m.add_into_top(v)?;
            0
        }
        b's' => {
            let v = m.pop_n(2)?;
            m.add_into_top(v)?;
            0
        }
        b'e' | b'u' => {
            let v = m.pop_mark()?;
            m.add_into_top(v)?;
            0
        }
        b'R' | 0x81 | 0x93 => {
            let v = m.pop_n(2)?;
            m.contain(v)?;
            0
        }
        b'Q' => {
            let v = m.pop()?;
            m.contain(v)?;
            0
        }
        b'0' => {
            m.pop()?;
            0
        }
        b'1' => {
            m.pop_mark()?;
            0
        }
        b'2' => {
            let top = m.top()?;
            m.push(top)?;
            0
        }
        _ => return Ok(None),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Protocol-2 pickle of `[[[…[]…]]]`, `n` deep, built top-down as Python
    /// writes it (EMPTY_LIST, BINPUT … APPEND).
    fn nested(n: usize) -> Vec<u8> {
        let mut p = vec![0x80, 2];
        for i in 0..n {
            p.push(b']');
            p.push(b'q');
            p.push((i % 256) as u8);
        }
        p.extend(std::iter::repeat_n(b'a', n - 1));
        p.push(b'.');
        p
    }

    /// `x0 = []; x_{k+1} = [x_k, x_k]`, `n` times (memo gets double).
    fn doubling(n: usize) -> Vec<u8> {
        let mut p = vec![0x80, 2, b']', b'q', 0];
        for k in 0..n {
            p.extend([
                b'(',
                b'h',
                k as u8,
                b'h',
                k as u8,
                b'l',
                b'q',
                (k + 1) as u8,
            ]);
        }
        p.push(b'.');
        p
    }

    #[test]
    fn shallow_and_small_pickles_pass_deep_or_doubling_ones_do_not() {
        assert!(check(&nested(10)).is_ok());
        let e = check(&nested(200_000)).unwrap_err();
        assert!(e.contains("more than 256 deep"), "{e}");
        assert!(check(&doubling(10)).is_ok());
        let e = check(&doubling(40)).unwrap_err();
        assert!(e.contains("objects"), "{e}");
        assert!(check(&[0x80, 2, b'X', 0xff, 0xff, 0xff, 0x7f]).is_err());
    }
}
