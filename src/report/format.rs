//! Number formatting shared by every renderer (terminal and Markdown), so a
//! value reads the same wherever it is shown.

use crate::parity::Metrics;

/// `1.234e-5` style, or `0` for exact zero.
pub fn sci(x: f64) -> String {
    if x == 0.0 {
        "0".into()
    } else {
        format!("{x:.3e}")
    }
}

/// Cosine with enough digits to see f32 round-off (`0.99999994`).
pub fn cos(x: f64) -> String {
    match x {
        // The metrics record a NaN cosine (a row holding NaN/Inf) as −∞.
        f64::NEG_INFINITY => "NaN".into(),
        x => format!("{x:.8}"),
    }
}

/// A cosine at six digits (triage's tap column, summaries).
pub fn cos6(x: f64) -> String {
    match x {
        f64::NEG_INFINITY => "NaN".into(),
        x => format!("{x:.6}"),
    }
}

/// An acceptance length τ (`7.890`).
pub fn tau(x: f64) -> String {
    format!("{x:.3}")
}

/// A signed τ difference (`-0.120`, `+0.214`).
pub fn delta(x: f64) -> String {
    format!("{x:+.3}")
}

/// Seconds at two decimals.
pub fn seconds(x: f64) -> String {
    format!("{x:.2}")
}

/// Bytes as GiB at two decimals (`1.63 GiB`).
pub fn gib(bytes: u64) -> String {
    format!("{:.2} GiB", bytes as f64 / (1u64 << 30) as f64)
}

/// `yes` / `no`.
pub fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// `max_abs @p0 t12 f3`: the largest difference and where it sits.
pub fn max_abs_at(m: &Metrics) -> String {
    match m.max_abs_at {
        Some(at) if m.max_abs > 0.0 => {
            format!(
                "{} @p{} t{} f{}",
                sci(m.max_abs),
                at.prompt,
                at.token,
                at.feature
            )
        }
        _ => sci(m.max_abs),
    }
}

/// `27781427952` → `27,781,427,952`.
pub fn group_digits(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A row's difference over its noise band (`× floor` columns): `0.47`
/// inside it, `14.1 ▲` outside, `∞ ▲` over an empty band (the noise shadow
/// bitwise there), `-` for a bitwise row or one without a band.
pub fn noise_ratio(cell: Option<&crate::parity::noise::NoiseCell>, bitwise: bool) -> String {
    match cell {
        None => "-".into(),
        Some(_) if bitwise => "-".into(),
        Some(c) => match (c.ratio, c.inside) {
            (Some(r), true) => format!("{r:.2}"),
            (Some(r), false) if r < 10.0 => format!("{r:.2} ▲"),
            (Some(r), false) if r < 100.0 => format!("{r:.1} ▲"),
            (Some(r), false) => format!("{r:.0} ▲"),
            (None, _) => "∞ ▲".into(),
        },
    }
}

/// The line under a table with a `× floor` column: how many differing
/// hidden states lie inside the band, what the band is, and whether it
/// judged the rows (`None`: no floor, or no differing row).
pub fn noise_floor_line(pair: &crate::parity::PairReport) -> Option<String> {
    use crate::parity::noise::BandRole;
    let floor = pair.noise_floor.as_ref()?;
    let (inside, n) = pair.floor_counts();
    if n == 0 {
        return None;
    }
    let role = match pair.noise_role {
        Some(BandRole::Bounds) => "a row inside it passes; one beyond it (▲) is the paths computing something else",
        Some(BandRole::Widens) => {
            "a row inside it passes; one beyond it (▲) is more than reordered products explain, and fails when \
             the dtype's tolerance fails it too"
        }
        None => "shown only: the sides compute in different dtypes, and the verdicts follow the dtype rule above",
    };
    Some(format!(
        "× floor: {inside} of {n} differing hidden states lie inside the noise band (≤ 1; ∞ where the shadow \
         is bitwise). The band is {scale}× the drift of the {dtype} run from its noise shadow, whose products \
         round the other way near rounding midpoints: how far two valid {dtype} implementations part on these \
         prompts (docs/noise-floor.md); {role}.",
        scale = floor.scale,
        dtype = floor.dtype,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digits() {
        assert_eq!(group_digits(27781427952), "27,781,427,952");
        assert_eq!(group_digits(0), "0");
        assert_eq!(group_digits(999), "999");
        assert_eq!(group_digits(1000), "1,000");
    }

    #[test]
    fn numbers() {
        assert_eq!(sci(0.0), "0");
        assert_eq!(sci(1.5e-5), "1.500e-5");
        assert_eq!(cos(0.5), "0.50000000");
        assert_eq!(delta(0.2), "+0.200");
        assert_eq!(gib(3 << 29), "1.50 GiB");
    }
}
