//! Unit tests of the noise floor: bands, merges, metadata, roles, routers.

use super::*;
use crate::capture::HiddenKind;
use crate::parity::metrics::Accumulator;
use crate::parity::routers::RouterFloor;
use crate::parity::{PairReport, Verdict};

/// Metrics of `b` against `a = [1, 0, …]` rows: `b` rotated by `angle`.
fn rotated(angle: f64) -> Metrics {
    let mut acc = Accumulator::default();
    let a = [1.0f32, 0.0];
    let b = [angle.cos() as f32, angle.sin() as f32];
    acc.add_rows(0, &a, &b, 2);
    acc.finish()
}

fn floor_at(index: usize, m: &Metrics) -> NoiseFloor {
    NoiseFloor::new(Precision::Bf16, vec![NoiseRow::of(index, m).unwrap()])
}

/// The band is the shadow's drift scaled: rel L2 by the scale, the
/// angle by the scale too (1 − cos by its square).
#[test]
fn band_scales_the_shadows_drift() {
    let shadow = rotated(1e-3);
    let band = floor_at(3, &shadow).band(3).unwrap();
    assert!((band.rel_l2 - SCALE * shadow.rel_l2).abs() < 1e-12);
    let angle = |c: f64| (1.0 - c).max(0.0).sqrt();
    let want = SCALE * angle(shadow.cos_min);
    assert!((angle(band.cos_min) - want).abs() < 1e-9 * want.max(1e-12) + 1e-12);
    assert!(floor_at(3, &shadow).band(4).is_none());
    // Twice the shadow's angle is on the edge; three times is outside.
    let cell = |a: f64| NoiseCell::of(band, &rotated(a));
    assert!(cell(1.5e-3).inside && cell(1.5e-3).ratio.unwrap() < 1.0);
    assert!(!cell(3e-3).inside && cell(3e-3).ratio.unwrap() > 1.4);
    // An empty band (the shadow bitwise there): any difference is outside,
    // with no finite ratio; a bitwise row is inside.
    let empty = Band {
        rel_l2: 0.0,
        cos_min: 1.0,
    };
    let c = NoiseCell::of(empty, &rotated(1e-6));
    assert!(!c.inside && c.ratio.is_none());
    assert!(NoiseCell::of(empty, &rotated(0.0)).inside);
}

#[test]
fn wider_takes_the_larger_drift_per_index() {
    let (a, b) = (floor_at(1, &rotated(1e-3)), floor_at(1, &rotated(4e-3)));
    let w = NoiseFloor::wider(Some(&a), Some(&b)).unwrap();
    assert_eq!(w.rows[0].rel_l2, b.rows[0].rel_l2);
    // Indices only one floor measured are kept.
    let c = floor_at(2, &rotated(1e-3));
    let w = NoiseFloor::wider(Some(&a), Some(&c)).unwrap();
    assert_eq!(w.rows.iter().map(|r| r.index).collect::<Vec<_>>(), [1, 2]);
    assert_eq!(NoiseFloor::wider(Some(&a), None), Some(a.clone()));
    assert_eq!(NoiseFloor::wider(None, None), None);
}

#[test]
fn metadata_round_trips_and_refuses_other_floors() {
    let f = floor_at(2, &rotated(1e-3));
    let read = |s: &str, dtype| NoiseFloor::from_metadata(s, "d.safetensors", dtype, Some(3));
    assert_eq!(read(&f.to_metadata(), Precision::Bf16).unwrap(), f);
    let m = f.to_metadata();
    let r = f.rows[0];
    let row = format!(
        "{{\"index\":2,\"rel_l2\":{},\"cos_min\":{}}}",
        r.rel_l2, r.cos_min
    );
    assert!(m.contains(&row), "{m}");
    let with_row = |new: &str| m.replace(&row, new);
    for (bad, dtype) in [
        ("not json".to_string(), Precision::Bf16),
        (
            "[\"midpoint-flips\",2.0,\"bf16\",[]]".to_string(),
            Precision::Bf16,
        ),
        (m.replace(METHOD, "split-k"), Precision::Bf16),
        (
            m.replace("\"scale\":2.0", "\"scale\":1e10"),
            Precision::Bf16,
        ),
        (m.clone(), Precision::F16),
        (m.replace("\"bf16\"", "\"f32\""), Precision::F32),
        (
            with_row("{\"index\":2,\"rel_l2\":0.5,\"cos_min\":-5.0}"),
            Precision::Bf16,
        ),
        (
            with_row("{\"index\":2,\"rel_l2\":-1.0,\"cos_min\":1.0}"),
            Precision::Bf16,
        ),
        (
            with_row("{\"index\":9,\"rel_l2\":0.1,\"cos_min\":0.9}"),
            Precision::Bf16,
        ),
        (with_row(&format!("{row},{row}")), Precision::Bf16),
        (with_row("[2,0.1,0.9]"), Precision::Bf16),
        (
            m.replace("\"rows\"", "\"extra\":1,\"rows\""),
            Precision::Bf16,
        ),
    ] {
        let e = read(&bad, dtype).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("d.safetensors: __metadata__ noise_floor"),
            "{bad}: {e}"
        );
    }
}

/// The shadow's router flips travel in the metadata, and a pair's router
/// is within the floor up to the scale × (the shadow's flips + 1).
#[test]
fn router_flips_are_read_against_the_shadows() {
    let mut f = floor_at(2, &rotated(1e-3));
    f.routers = vec![
        RouterNoise {
            layer: 0,
            slots: 40,
            slots_differing: 0,
        },
        RouterNoise {
            layer: 1,
            slots: 40,
            slots_differing: 3,
        },
    ];
    let m = f.to_metadata();
    let read = |s: &str| NoiseFloor::from_metadata(s, "d.safetensors", Precision::Bf16, Some(3));
    assert_eq!(read(&m).unwrap(), f);
    for bad in [
        m.replace("\"slots_differing\":3", "\"slots_differing\":41"),
        m.replace("\"layer\":1", "\"layer\":0"),
        m.replace("\"layer\":1", "\"layer\":3"),
        m.replace("\"slots\":40,\"slots_differing\":0", "\"slots\":40"),
        m.replace(
            "{\"layer\":0,\"slots\":40,\"slots_differing\":0}",
            "[0,40,0]",
        ),
    ] {
        assert_ne!(bad, m, "the case edits the metadata");
        let e = read(&bad).unwrap_err().to_string();
        assert!(
            e.starts_with("d.safetensors: __metadata__ noise_floor"),
            "{bad}: {e}"
        );
    }
    let mut p = PairReport::new("a", Precision::Bf16, "b", Precision::Bf16);
    p.set_noise_floor(Some(f.clone()), BandRole::Widens);
    for i in 1..=3 {
        p.push_row(i, HiddenKind::DecoderLayer, rotated(0.0), None);
    }
    let within = |p: &mut PairReport, layer, flips| {
        let a = RouterAgreement {
            slots: 40,
            slots_differing: flips,
            ..Default::default()
        };
        p.set_router(layer, a);
        p.hidden_states[layer].router.unwrap().within_noise_floor
    };
    assert_eq!(within(&mut p, 0, 2), Some(true), "2 × (0 + 1)");
    assert_eq!(within(&mut p, 1, 8), Some(true), "2 × (3 + 1)");
    assert_eq!(
        p.routers_against_floor(),
        Some(RouterFloor::Within {
            noise: 3,
            slots: 80
        })
    );
    assert_eq!(within(&mut p, 1, 9), Some(false));
    assert!(matches!(
        p.routers_against_floor(),
        Some(RouterFloor::Beyond { layer: 1, .. })
    ));
    assert_eq!(within(&mut p, 2, 9), None, "no shadow router at layer 2");
    let wider = NoiseFloor::wider(
        Some(&f),
        Some(&NoiseFloor {
            routers: vec![RouterNoise {
                layer: 1,
                slots: 40,
                slots_differing: 7,
            }],
            ..f.clone()
        }),
    )
    .unwrap();
    assert_eq!(wider.router(1).unwrap().slots_differing, 7);
    assert_eq!(wider.router(0).unwrap().slots_differing, 0);
}

/// Bounds (compare's paths): beyond the band is at least a warning even
/// where the dtype's tolerance passes. Widens (diff): the tolerance's pass
/// stands, and the row is listed as beyond the floor; a difference the
/// tolerance fails passes inside a wide band.
#[test]
fn roles_judge_as_documented() {
    let shadow = rotated(1e-4);
    let beyond = rotated(1e-3); // 5× the band, within bf16's tolerance
    let judge = |role: BandRole, floor: &NoiseFloor, m: &Metrics| {
        let mut p = PairReport::new("a", Precision::Bf16, "b", Precision::Bf16);
        p.set_noise_floor(Some(floor.clone()), role);
        p.push_row(1, HiddenKind::DecoderLayer, m.clone(), None);
        (p.hidden_states[0].verdict, p.beyond_floor(), p.agreement())
    };
    let floor = floor_at(1, &shadow);
    assert_eq!(by_tolerance(&beyond), Verdict::Pass);
    let (v, beyond_rows, _) = judge(BandRole::Bounds, &floor, &beyond);
    assert_eq!((v, beyond_rows.len()), (Verdict::Warn, 0));
    let (v, beyond_rows, agreement) = judge(BandRole::Widens, &floor, &beyond);
    assert_eq!((v, beyond_rows[0].0.as_str()), (Verdict::Pass, "hs 1"));
    assert_eq!(agreement, "within tolerance");
    let (v, _, agreement) = judge(BandRole::Widens, &floor, &rotated(1.5e-4));
    assert_eq!(
        (v, agreement),
        (Verdict::Pass, "within the measured noise floor")
    );
    // bf16's tolerance warns at cos 0.995 (which fails the run); a band
    // that wide passes it.
    let far = rotated(0.1);
    assert_eq!(by_tolerance(&far), Verdict::Warn);
    let wide = floor_at(1, &rotated(0.06));
    assert_eq!(judge(BandRole::Widens, &wide, &far).0, Verdict::Pass);
    assert_eq!(judge(BandRole::Bounds, &wide, &far).0, Verdict::Pass);
    // A band wider than the dtype's warn limits passes a row inside it
    // (routing flips of a deep MoE) and the pair says so.
    let too_wide = floor_at(1, &rotated(0.2));
    let flipped = rotated(0.15);
    assert_eq!(by_tolerance(&flipped), Verdict::Fail);
    let mut p = PairReport::new("a", Precision::Bf16, "b", Precision::Bf16);
    p.set_noise_floor(Some(too_wide), BandRole::Widens);
    p.push_row(1, HiddenKind::DecoderLayer, flipped, None);
    assert_eq!(p.hidden_states[0].verdict, Verdict::Pass);
    let note = p.wide_band_note().unwrap();
    assert!(
        note.starts_with("the measured noise floor at hs 1 is wider than bf16's warn limits"),
        "{note}"
    );
    // In f16 likewise: a routing flip at cos 0.997 inside a measured
    // band passes, though f16's warn cosine is 0.999.
    let flip = rotated(0.077);
    let f16 = crate::parity::Tolerance::for_precision(Precision::F16);
    assert_eq!(f16.judge(&flip), Verdict::Fail);
    let mut p = PairReport::new("a", Precision::F16, "b", Precision::F16);
    let mut band = floor_at(1, &rotated(0.06));
    band.dtype = Precision::F16;
    p.set_noise_floor(Some(band), BandRole::Widens);
    p.push_row(1, HiddenKind::DecoderLayer, flip, None);
    assert_eq!(p.hidden_states[0].verdict, Verdict::Pass);
    // Different dtypes: the band is shown, never judges.
    let mut p = PairReport::new("a", Precision::Bf16, "b", Precision::F16);
    p.set_noise_floor(Some(wide), BandRole::Widens);
    assert_eq!(p.noise_role, None);
}

fn by_tolerance(m: &Metrics) -> Verdict {
    crate::parity::Tolerance::for_precision(Precision::Bf16).judge(m)
}
