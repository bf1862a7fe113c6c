//! `hsparity::parity::align`: the `--align` analysis. A capture read with the
//! wrong layer-index convention (the vLLM file of `fixtures/engine-captures/
//! vllm-misindexed`, captured with the blanket +1 over its aux ids) is caught
//! against transformers' own states and the offset reported; a correctly read
//! one aligns at 0; synthetic cases pin the rule. Layer ids and N come from
//! the generator's manifest.

use crate::common;

use std::collections::BTreeMap;

use candle_core::{Device, Tensor};
use common::captures::{caps, manifest, n_tiny, usizes};
use common::repo_root;
use hsparity::dump::Dump;
use hsparity::error::Error;
use hsparity::import::{self, Format, ImportOptions};
use hsparity::parity::align::align;

/// The golden transformers states of prompt 0 of the tiny fixture, per index.
fn golden_p0() -> BTreeMap<usize, Vec<Tensor>> {
    let g = Dump::read(&repo_root().join("fixtures/tiny-qwen3_5/golden/causal-lm.safetensors"))
        .unwrap();
    g.prompts[0]
        .hidden_states
        .iter()
        .map(|(&i, t)| (i, vec![t.clone()]))
        .collect()
}

fn vllm(rel: &str, ids: Vec<usize>) -> BTreeMap<usize, Vec<Tensor>> {
    let o = ImportOptions {
        layer_ids: Some(ids),
        num_layers: Some(n_tiny(&manifest())),
        ..Default::default()
    };
    import::read(&caps(rel), Format::Vllm, &o)
        .unwrap()
        .rows_by_index()
}

#[test]
fn the_blanket_plus_one_vllm_capture_is_caught_with_offset_plus_one() {
    // configured (and declared) with some ids; the connector captured each one layer later
    let m = manifest();
    let declared = usizes(&m["vllm"]["misindexed_declared"]);
    let captured = usizes(&m["vllm"]["misindexed_captured"]);
    let shift = captured[0] as i64 - declared[0] as i64;
    assert_eq!(shift, 1, "the fixture holds the blanket +1");
    let compared = vllm("vllm-misindexed", declared.clone());
    assert_eq!(compared.keys().copied().collect::<Vec<_>>(), declared);
    let a = align(&golden_p0(), &compared).unwrap();
    assert_eq!(a.offset, Some(shift), "{}", a.diagnosis());
    for (r, &c) in a.rows.iter().zip(&captured) {
        assert_eq!(r.best, c);
        assert!(r.cos_mean > 0.9999, "{r:?}");
        // the label it was given matches clearly worse
        assert!(r.same_index_cos_mean.unwrap() < r.cos_mean - 1e-3, "{r:?}");
        assert_eq!(r.runner_up.map(|(i, _)| i == r.best), Some(false));
    }
    let d = a.diagnosis();
    assert!(
        d.contains(&format!("offset +1 on all {} indices", declared.len()))
            && d.contains("hidden_states[i+1]"),
        "{d}"
    );
}

#[test]
fn a_correctly_read_capture_aligns_at_zero() {
    let m = manifest();
    let ids = usizes(&m["vllm"]["eagle_aux_hidden_state_layer_ids"]);
    let n = n_tiny(&m);
    let compared = vllm("vllm/0.safetensors", ids.clone());
    // id N is the pre-norm last layer, not an index: only the others take part
    let indexed: Vec<usize> = ids.iter().copied().filter(|&k| k != n).collect();
    assert_eq!(compared.keys().copied().collect::<Vec<_>>(), indexed);
    let a = align(&golden_p0(), &compared).unwrap();
    assert_eq!(a.offset, Some(0), "{}", a.diagnosis());
    assert!(a
        .rows
        .iter()
        .all(|r| r.same_index_cos_mean == Some(r.cos_mean)));
    let d = a.diagnosis();
    assert!(
        d.starts_with(&format!("offset 0 on all {} indices", indexed.len())),
        "{d}"
    );
}

fn t(seed: u64) -> Tensor {
    // deterministic pseudo-random rows, unrelated across seeds
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let v: Vec<f32> = (0..5 * 8)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) as f32 / (1u64 << 31) as f32) - 0.5
        })
        .collect();
    Tensor::from_vec(v, (5, 8), &Device::Cpu).unwrap()
}

fn map(pairs: &[(usize, u64)]) -> BTreeMap<usize, Vec<Tensor>> {
    pairs
        .iter()
        .map(|&(i, s)| (i, vec![t(s), t(s + 100)]))
        .collect()
}

#[test]
fn offsets_in_both_directions_and_disagreement() {
    let reference = map(&[(0, 1), (1, 2), (2, 3), (3, 4)]);
    let early = align(&reference, &map(&[(0, 2), (1, 3), (2, 4)])).unwrap();
    assert_eq!(early.offset, Some(1));
    let late = align(&reference, &map(&[(1, 1), (2, 2), (3, 3)])).unwrap();
    assert_eq!(late.offset, Some(-1));
    assert!(late.diagnosis().contains("offset -1"));
    let mixed = align(&reference, &map(&[(0, 1), (1, 3)])).unwrap();
    assert_eq!(mixed.offset, None);
    assert_eq!(mixed.diagnosis(), "no common offset: 0->0 (+0), 1->2 (+1)");
    // a compared index the reference lacks still gets its best match
    let beyond = align(&reference, &map(&[(7, 4)])).unwrap();
    assert_eq!(
        (
            beyond.rows[0].best,
            beyond.rows[0].offset,
            beyond.rows[0].same_index_cos_mean
        ),
        (3, -4, None)
    );
}

#[test]
fn mismatched_inputs_are_refused() {
    let reference = map(&[(0, 1), (1, 2)]);
    let e = align(&reference, &BTreeMap::new()).unwrap_err();
    assert!(matches!(e, Error::Input(_)));
    let one_prompt: BTreeMap<usize, Vec<Tensor>> = [(0usize, vec![t(1)])].into_iter().collect();
    let e = align(&reference, &one_prompt).unwrap_err();
    assert!(
        e.to_string()
            .contains("compared index 0 has 1 prompts, reference index 0 has 2"),
        "{e}"
    );
    let short: BTreeMap<usize, Vec<Tensor>> =
        [(0usize, vec![t(1).narrow(0, 0, 3).unwrap(), t(101)])]
            .into_iter()
            .collect();
    let e = align(&reference, &short).unwrap_err();
    assert!(
        e.to_string().contains("prompt 0") && e.to_string().contains("same tokens"),
        "{e}"
    );
}

/// The align line names the `--tap-offset` that compares the two dumps
/// aligned, and that flag does: the README's vLLM example, end to end.
#[test]
fn the_tap_offset_the_align_line_names_aligns_the_dumps() {
    let bin = env!("CARGO_BIN_EXE_hsparity");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let tmp = tempfile::tempdir().unwrap();
    let (mis, reference) = (
        tmp.path().join("mis.safetensors"),
        tmp.path().join("ref.safetensors"),
    );
    let run = |args: &[&std::ffi::OsStr]| {
        std::process::Command::new(bin)
            .current_dir(root)
            .args(args)
            .output()
            .unwrap()
    };
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    let succeeds = |o: &std::process::Output| {
        assert_eq!(
            o.status.code(),
            Some(0),
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        )
    };
    let o = run(&[
        os("import"),
        os("fixtures/engine-captures/vllm-misindexed"),
        os("--layer-ids"),
        os("1,2,3,4"),
        os("--num-layers"),
        os("6"),
        os("--out"),
        mis.as_os_str(),
    ]);
    succeeds(&o);
    let o = run(&[
        os("dump"),
        os("fixtures/tiny-qwen3_5"),
        os("--path"),
        os("causal-lm"),
        os("--prompt"),
        os("The hidden state of the model."),
        os("--out"),
        reference.as_os_str(),
    ]);
    succeeds(&o);
    let o = run(&[
        os("diff"),
        reference.as_os_str(),
        mis.as_os_str(),
        os("--align"),
        os("--no-report"),
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(1), "{out}");
    let hint = out
        .split("`diff --tap-offset ")
        .nth(1)
        .and_then(|r| r.split('`').next())
        .unwrap_or_else(|| panic!("no --tap-offset hint in: {out}"))
        .to_string();
    assert_eq!(hint, "-1", "{out}");
    let o = run(&[
        os("diff"),
        reference.as_os_str(),
        mis.as_os_str(),
        os("--tap-offset"),
        std::ffi::OsStr::new(&hint),
        os("--no-report"),
    ]);
    succeeds(&o);
}

/// A dump whose writer numbered its states one layer late (hs[i] holds the
/// reference's hs[i+1], as a tap-L-is-layer-L's-input reading gives): the
/// `--align` note names both tap conventions and the `--tap-offset` that
/// aligns them, since the dump says nothing of where it came from.
#[test]
fn an_offset_dump_of_unknown_origin_names_the_two_conventions() {
    let src = repo_root().join("fixtures/tiny-qwen3_5/golden/causal-lm.safetensors");
    let mut d = Dump::read(&src).unwrap();
    for p in &mut d.prompts {
        let shifted: BTreeMap<usize, Tensor> = p
            .hidden_states
            .iter()
            .filter_map(|(&i, _)| Some((i, p.hidden_states.get(&(i + 1))?.clone())))
            .collect();
        p.hidden_states = shifted;
    }
    d.metadata.remove("source_format");
    let tmp = tempfile::tempdir().unwrap();
    let b = tmp.path().join("late.safetensors");
    d.write(&b, true).unwrap();
    let v = common::json_exit(
        common::hsparity()
            .arg("diff")
            .arg(&src)
            .arg(&b)
            .args(["--align", "--no-report", "--json"]),
        1,
    );
    let notes = v["notes"].to_string();
    for want in [
        "sit +1 from their indices",
        "DFlash/SpecForge tap L (target_layer_ids) = hidden_states[L+1]",
        "vLLM/SGLang aux id k = hidden_states[k]",
        "`diff --tap-offset -1` compares them aligned",
    ] {
        assert!(notes.contains(want), "{want:?} not in {notes}");
    }
}

/// The offset holds across the indices that have a counterpart (a shifted
/// reference lacks one at its edge), and states that match nothing (zeros)
/// have no offset at all — they used to "match at offset 0".
#[test]
fn the_offset_ignores_edges_without_a_counterpart_and_garbage_matches_nothing() {
    let g = golden_p0();
    // Reference: hs[i] holds the true hs[i+1] (one layer late), so it lacks the last index.
    let late: BTreeMap<usize, Vec<Tensor>> = g
        .keys()
        .filter_map(|&i| Some((i, g.get(&(i + 1))?.clone())))
        .collect();
    let a = align(&late, &g).unwrap();
    assert_eq!(a.offset, Some(-1), "{}", a.diagnosis());
    assert!(
        a.diagnosis()
            .contains("indices with a counterpart (1 without one)"),
        "{}",
        a.diagnosis()
    );
    let zeros: BTreeMap<usize, Vec<Tensor>> = g
        .iter()
        .map(|(&i, v)| (i, v.iter().map(|t| t.zeros_like().unwrap()).collect()))
        .collect();
    let z = align(&g, &zeros).unwrap();
    assert_eq!(z.offset, None);
    assert!(
        z.diagnosis().starts_with("no index matches"),
        "{}",
        z.diagnosis()
    );
}
