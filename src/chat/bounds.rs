//! The bounds on every chat-template render: templates come from the
//! checkpoint, i.e. from the Hub, and a hostile or buggy one must end with
//! exit 2 and a message, not hang or abort. minijinja's fuel bounds the work
//! and the data a render creates, its recursion limit the macro nesting;
//! what fuel does not charge (printing a deeply nested value recurses; list
//! concatenation) is bounded here by a nesting check and a wall-clock limit.

use minijinja::value::ValueKind;
use minijinja::{Environment, ErrorKind, Value};

/// The work one template render may do ([`minijinja::Environment::set_fuel`]): about
/// one unit per instruction and per 64 bytes of data the template creates,
/// so 4 million bounds a render to about a second and 256 MB. A real chat
/// template renders a long conversation in well under a million.
pub const RENDER_FUEL: u64 = 4_000_000;

/// Nesting of macro calls and includes one render may reach.
pub const RENDER_RECURSION: usize = 64;

/// Deepest nesting of lists and dicts a template may print or serialise
/// (printing recurses; a value nested 100 000 deep would overflow the stack).
pub const MAX_VALUE_DEPTH: usize = 256;

/// Refuses a value nested deeper than [`MAX_VALUE_DEPTH`], walked without
/// recursion.
pub(super) fn check_nesting(value: &Value) -> std::result::Result<(), minijinja::Error> {
    let mut todo = vec![(value.clone(), 0usize)];
    while let Some((v, depth)) = todo.pop() {
        if !matches!(v.kind(), ValueKind::Seq | ValueKind::Map) {
            continue;
        }
        if depth >= MAX_VALUE_DEPTH {
            return Err(minijinja::Error::new(
                ErrorKind::InvalidOperation,
                format!("a value nested more than {MAX_VALUE_DEPTH} deep is not printed"),
            ));
        }
        let Ok(items) = v.try_iter() else { continue };
        for item in items {
            if v.kind() == ValueKind::Map {
                if let Ok(x) = v.get_item(&item) {
                    todo.push((x, depth + 1));
                }
            } else {
                todo.push((item, depth + 1));
            }
        }
    }
    Ok(())
}

/// The largest chat template read.
pub const MAX_TEMPLATE_BYTES: usize = 1 << 20;

/// How long one render may take before it is abandoned (a real template
/// renders in milliseconds; the fuel bounds most runaways long before).
pub const RENDER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Renders template `key` of `env` with `ctx` on a thread of its own; a
/// render that outlives [`RENDER_TIMEOUT`] is abandoned (the process exits
/// with it still running).
///
/// Errors: the render's own error (`Ok(Err)`), or, as a phrase, that it did
/// not finish in time or could not start.
pub(super) fn render(
    env: Environment<'static>,
    key: String,
    ctx: Value,
) -> std::result::Result<std::result::Result<String, minijinja::Error>, String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("chat-template".into())
        .stack_size(64 << 20)
        .spawn(move || {
            let r = env.get_template(&key).and_then(|t| t.render(ctx));
            let _ = tx.send(r);
        })
        .map_err(|e| format!("cannot start the render: {e}"))?;
    rx.recv_timeout(RENDER_TIMEOUT).map_err(|_| {
        format!(
            "the chat template did not finish rendering in {} s: it loops or grows without end",
            RENDER_TIMEOUT.as_secs()
        )
    })
}
