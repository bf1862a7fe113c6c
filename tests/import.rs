//! `hsparity::import`: every engine file of `fixtures/engine-captures/`
//! (written by `tools/make_engine_captures.py` as each engine's writer writes
//! it) imports with its engine's layer-index convention mapped to
//! transformers' `hidden_states`, and the mapped states equal transformers'
//! own (the goldens of `fixtures/tiny-qwen3_5`) within one bf16 rounding.
//!
//! Tolerance: the engines store bf16; the fixture files hold the float32
//! transformers states rounded to bf16 once. So each imported value must be
//! *bitwise* the golden rounded to bf16 (round-to-nearest-even, as torch and
//! candle both do), which bounds it by |x − g| ≤ 2⁻⁸·|g| (half a bf16 ulp:
//! 8 significant bits, so half an ulp is 2⁻⁸ of the binade's lower end);
//! both are asserted. Nothing looser is needed because
//! the fixture's transformers run is asserted bitwise equal to the goldens by
//! the generator.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use candle_core::{DType, Tensor};
use hsparity::dump::Dump;
use hsparity::error::Error;
use hsparity::import::{self, Format, ImportOptions, Imported, StateIndex};
use serde_json::Value;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn caps(rel: &str) -> PathBuf {
    root().join("fixtures/engine-captures").join(rel)
}

fn golden() -> Dump {
    Dump::read(&root().join("fixtures/tiny-qwen3_5/golden/causal-lm.safetensors")).unwrap()
}

fn manifest() -> Value {
    serde_json::from_str(&std::fs::read_to_string(caps("manifest.json")).unwrap()).unwrap()
}

const N: usize = 6;

fn opts() -> ImportOptions {
    ImportOptions {
        num_layers: Some(N),
        ..Default::default()
    }
}

/// `imported` ([T, H]) equals the first T rows of `golden` rounded to bf16, bitwise and within 2^-8 relative.
fn assert_bf16_of(imported: &Tensor, golden: &Tensor, what: &str) {
    let (t, h) = imported.dims2().unwrap();
    let g = golden.narrow(0, 0, t).unwrap();
    assert_eq!(g.dims2().unwrap(), (t, h), "{what}: shape");
    let rounded = g
        .to_dtype(DType::BF16)
        .unwrap()
        .to_dtype(DType::F32)
        .unwrap();
    let a = imported.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let r = rounded.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    let gv = g.flatten_all().unwrap().to_vec1::<f32>().unwrap();
    for (i, ((&x, &y), &z)) in a.iter().zip(&r).zip(&gv).enumerate() {
        assert_eq!(
            x.to_bits(),
            y.to_bits(),
            "{what}: element {i}: {x} is not bf16({z}) = {y}"
        );
        assert!(
            ((x - z).abs() as f64) <= 2f64.powi(-8) * (z.abs() as f64),
            "{what}: element {i}: |{x} - {z}| beyond half a bf16 ulp"
        );
    }
}

fn hidden(imp: &Imported) -> BTreeSet<StateIndex> {
    imp.indices().into_iter().collect()
}

fn state(imp: &Imported, k: usize, i: StateIndex) -> &Tensor {
    imp.prompts[k]
        .state(i)
        .unwrap_or_else(|| panic!("p{k} has no {i}"))
}

fn one_line(e: &Error) -> String {
    let s = e.to_string();
    assert!(!s.contains('\n'), "error is not one line: {s}");
    s
}

// ---------------------------------------------------------------------------------------------
// SpecForge
// ---------------------------------------------------------------------------------------------

#[test]
fn specforge_dflash_records_map_tap_l_to_hidden_states_l_plus_1_and_trim_the_padding() {
    let g = golden();
    let o = ImportOptions {
        target_layer_ids: Some(vec![1, 3]),
        ..opts()
    };
    let imp = import::read(&caps("specforge-dflash"), Format::Specforge, &o).unwrap();
    assert_eq!(imp.format, Format::Specforge);
    assert_eq!(imp.stored_dtype, "bf16");
    assert_eq!(imp.hidden_size, 64);
    assert_eq!(
        hidden(&imp),
        [StateIndex::Hidden(2), StateIndex::Hidden(4)]
            .into_iter()
            .collect()
    );
    assert_eq!(imp.mapping.layers[0].engine_id, Some(1));
    assert_eq!(
        imp.mapping.layers[1].stored_as,
        "hidden_states[..., 64:128]"
    );
    assert_eq!(imp.prompts.len(), 2);
    // p0 (12 tokens) was right-padded to the batch maximum (103) and trimmed back
    assert_eq!(imp.trimmed.len(), 1);
    assert_eq!(
        (
            imp.trimmed[0].prompt,
            imp.trimmed[0].rows_in_file,
            imp.trimmed[0].rows_kept
        ),
        (0, 103, 12)
    );
    for (k, p) in imp.prompts.iter().enumerate() {
        assert_eq!(p.input_ids, g.prompts[k].input_ids, "p{k} ids");
        assert_eq!(p.loss_mask.as_ref().unwrap().len(), p.input_ids.len());
        for i in [2, 4] {
            assert_bf16_of(
                state(&imp, k, StateIndex::Hidden(i)),
                &g.prompts[k].hidden_states[i],
                &format!("p{k} hs[{i}]"),
            );
        }
    }
    assert!(
        imp.summary()
            .iter()
            .any(|l| l.contains("trimmed p0: 103 -> 12 rows")),
        "{:?}",
        imp.summary()
    );
}

#[test]
fn specforge_keep_padding_keeps_the_rows_the_capture_ran() {
    let o = ImportOptions {
        target_layer_ids: Some(vec![1, 3]),
        keep_padding: true,
        ..opts()
    };
    let imp = import::read(
        &caps("specforge-dflash/rows_0-2000/data_0.ckpt"),
        Format::Specforge,
        &o,
    )
    .unwrap();
    assert!(imp.trimmed.is_empty());
    assert_eq!(imp.prompts[0].input_ids.len(), 103);
    assert!(imp.prompts[0].input_ids[12..].iter().all(|&i| i == 0));
}

#[test]
fn specforge_gzipped_records_read_like_the_plain_ones() {
    let o = ImportOptions {
        target_layer_ids: Some(vec![1, 3]),
        ..opts()
    };
    let a = import::read(&caps("specforge-dflash"), Format::Specforge, &o).unwrap();
    let b = import::read_auto(&caps("specforge-dflash-compressed"), &o).unwrap();
    assert_eq!(b.format, Format::Specforge);
    assert_eq!(a.prompts.len(), b.prompts.len());
    assert_eq!(a.mapping.layers, b.mapping.layers);
    for (p, q) in a.prompts.iter().zip(&b.prompts) {
        assert_eq!(p.input_ids, q.input_ids);
        assert_eq!(p.loss_mask, q.loss_mask);
        for (i, t) in &p.hidden_states {
            let d = (t - &q.hidden_states[i])
                .unwrap()
                .abs()
                .unwrap()
                .max_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert_eq!(d, 0.0);
        }
    }
}

#[test]
fn specforge_eagle3_record_aux_layers_plus_one_and_final_normed_hidden_state_at_n() {
    let g = golden();
    let o = ImportOptions {
        target_layer_ids: Some(vec![0, 2, 4]),
        ..opts()
    };
    let imp = import::read_auto(&caps("specforge-eagle3/rows_0-2000/data_0.ckpt"), &o).unwrap();
    assert_eq!(
        hidden(&imp),
        [1, 3, 5, 6].map(StateIndex::Hidden).into_iter().collect()
    );
    for i in [1, 3, 5, 6] {
        assert_bf16_of(
            state(&imp, 0, StateIndex::Hidden(i)),
            &g.prompts[0].hidden_states[i],
            &format!("hs[{i}]"),
        );
    }
    // without N the final-normed state cannot be placed: it is skipped, and said so
    let o = ImportOptions {
        target_layer_ids: Some(vec![0, 2, 4]),
        ..Default::default()
    };
    let imp = import::read(
        &caps("specforge-eagle3/rows_0-2000/data_0.ckpt"),
        Format::Specforge,
        &o,
    )
    .unwrap();
    assert_eq!(imp.hidden_indices(), vec![1, 3, 5]);
    assert!(
        imp.notes
            .iter()
            .any(|n| n.contains("hidden_state") && n.contains("skipped")),
        "{:?}",
        imp.notes
    );
}

#[test]
fn specforge_tap_on_the_last_layer_is_the_pre_norm_output_never_index_n() {
    // The rule itself: with N = 4, tap 3 (the last layer) is last_layer_output, not hidden_states[4].
    let o = ImportOptions {
        target_layer_ids: Some(vec![1, 3]),
        num_layers: Some(4),
        ..Default::default()
    };
    let imp = import::read(
        &caps("specforge-dflash/rows_0-2000/data_1.ckpt"),
        Format::Specforge,
        &o,
    )
    .unwrap();
    assert_eq!(
        hidden(&imp),
        [StateIndex::Hidden(2), StateIndex::LastLayerOutput]
            .into_iter()
            .collect()
    );
}

#[test]
fn toy_pair_training_record_holds_prompt_plus_response_with_the_drafter_taps() {
    let cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("fixtures/toy-pair/drafter/config.json")).unwrap(),
    )
    .unwrap();
    let taps: Vec<usize> = cfg["dflash_config"]["target_layer_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let o = ImportOptions {
        target_layer_ids: Some(taps.clone()),
        num_layers: Some(4),
        hidden_size: Some(64),
        ..Default::default()
    };
    let imp = import::read_auto(&caps("toy-pair-specforge"), &o).unwrap();
    assert_eq!(
        imp.hidden_indices(),
        taps.iter().map(|t| t + 1).collect::<Vec<_>>()
    );
    let m = manifest();
    let toy: Vec<&Value> = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["path"].as_str().unwrap().contains("toy-pair-specforge"))
        .collect();
    assert_eq!(imp.prompts.len(), toy.len());
    assert!(imp.trimmed.is_empty());
    for (p, f) in imp.prompts.iter().zip(&toy) {
        assert!(p.source.ends_with(
            f["path"]
                .as_str()
                .unwrap()
                .trim_start_matches("fixtures/engine-captures/")
        ));
        let (pt, rt) = (
            f["prompt_tokens"].as_u64().unwrap() as usize,
            f["response_tokens"].as_u64().unwrap() as usize,
        );
        assert_eq!(p.input_ids.len(), pt + rt);
        let mask = p.loss_mask.as_ref().unwrap();
        assert!(mask[..pt].iter().all(|&m| m == 0) && mask[pt..].iter().all(|&m| m == 1));
    }
}

// ---------------------------------------------------------------------------------------------
// vLLM
// ---------------------------------------------------------------------------------------------

#[test]
fn vllm_aux_id_k_is_hidden_states_k_and_id_n_is_the_pre_norm_last_layer() {
    let g = golden();
    let o = ImportOptions {
        layer_ids: Some(vec![0, 2, 4, 6]),
        ..opts()
    };
    let imp = import::read_auto(&caps("vllm"), &o).unwrap();
    assert_eq!(imp.format, Format::Vllm);
    assert_eq!(
        hidden(&imp),
        [
            StateIndex::Hidden(0),
            StateIndex::Hidden(2),
            StateIndex::Hidden(4),
            StateIndex::LastLayerOutput
        ]
        .into_iter()
        .collect()
    );
    assert!(
        imp.prompts
            .iter()
            .all(|p| !p.hidden_states.contains_key(&N)),
        "id N must never land at index N"
    );
    assert_eq!(imp.prompts.len(), 2);
    for (k, p) in imp.prompts.iter().enumerate() {
        assert_eq!(p.input_ids, g.prompts[k].input_ids);
        for i in [0, 2, 4] {
            assert_bf16_of(
                state(&imp, k, StateIndex::Hidden(i)),
                &g.prompts[k].hidden_states[i],
                &format!("p{k} hs[{i}]"),
            );
        }
        assert_bf16_of(
            state(&imp, k, StateIndex::LastLayerOutput),
            g.prompts[k].last_layer_output.as_ref().unwrap(),
            &format!("p{k} last_layer_output"),
        );
    }
}

#[test]
fn vllm_older_l_t_h_layout_reads_the_same_states() {
    let o = ImportOptions {
        layer_ids: Some(vec![0, 2, 4, 6]),
        ..opts()
    };
    let new = import::read(&caps("vllm/0.safetensors"), Format::Vllm, &o).unwrap();
    let old = import::read(&caps("vllm-legacy-layout"), Format::Vllm, &o).unwrap();
    assert!(
        old.notes.iter().any(|n| n.contains("[L, T, H]")),
        "{:?}",
        old.notes
    );
    assert_eq!(old.mapping.layers[1].stored_as, "hidden_states[1]");
    for i in new.indices() {
        let d = (state(&new, 0, i) - state(&old, 0, i))
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap();
        assert_eq!(d.to_scalar::<f32>().unwrap(), 0.0, "{i}");
    }
}

#[test]
fn vllm_without_the_number_of_layers_is_refused_rather_than_misplacing_id_n() {
    let o = ImportOptions {
        layer_ids: Some(vec![0, 2, 4, 6]),
        ..Default::default()
    };
    let e = import::read(&caps("vllm"), Format::Vllm, &o).unwrap_err();
    assert!(matches!(e, Error::Input(_)));
    let s = one_line(&e);
    assert!(
        s.contains("before the final norm") && s.contains("vllm"),
        "{s}"
    );
    let e = import::read(&caps("vllm"), Format::Vllm, &opts()).unwrap_err();
    assert!(one_line(&e).contains("--layer-ids"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// SGLang
// ---------------------------------------------------------------------------------------------

#[test]
fn sglang_dump_files_stitch_prefill_and_decode_and_map_the_dumper_names() {
    let g = golden();
    let m = manifest();
    let fed: Vec<i64> = m["sglang_dump"]["fed_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let imp = import::read_auto(&caps("sglang-dump"), &opts()).unwrap();
    assert_eq!(imp.format, Format::SglangDump);
    assert_eq!(
        hidden(&imp),
        [
            StateIndex::Hidden(0),
            StateIndex::Hidden(2),
            StateIndex::Hidden(6),
            StateIndex::LastLayerOutput
        ]
        .into_iter()
        .collect()
    );
    assert_eq!(
        imp.prompts.len(),
        1,
        "prefill (step 0) and decode (step 1) are one sequence"
    );
    let p = &imp.prompts[0];
    assert_eq!(p.input_ids, fed);
    assert_eq!(p.input_ids[..12], g.prompts[0].input_ids[..]);
    for i in [0, 2, 6] {
        let t = state(&imp, 0, StateIndex::Hidden(i));
        assert_eq!(t.dims2().unwrap().0, fed.len());
        assert_bf16_of(
            &t.narrow(0, 0, 12).unwrap(),
            &g.prompts[0].hidden_states[i],
            &format!("hs[{i}]"),
        );
    }
    assert_bf16_of(
        &state(&imp, 0, StateIndex::LastLayerOutput)
            .narrow(0, 0, 12)
            .unwrap(),
        g.prompts[0].last_layer_output.as_ref().unwrap(),
        "last_layer_output",
    );
    let layer2 = imp
        .mapping
        .layers
        .iter()
        .find(|l| l.index == StateIndex::Hidden(2))
        .unwrap();
    assert_eq!(layer2.engine_id, Some(2));
    assert!(
        imp.notes
            .iter()
            .any(|n| n.contains("rank 1: bitwise equal to rank 0")),
        "{:?}",
        imp.notes
    );
    // rank 1 reads the same
    let r1 = import::read(
        &caps("sglang-dump"),
        Format::SglangDump,
        &ImportOptions {
            rank: Some(1),
            ..opts()
        },
    )
    .unwrap();
    assert_eq!(r1.prompts[0].input_ids, fed);
    // one file brings the files of its step only
    let one = std::fs::read_dir(caps("sglang-dump/hsparity_fixture"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| {
            p.to_str().unwrap().contains("step=0___rank=0___")
                && p.to_str().unwrap().contains("norm.output.0")
        })
        .unwrap();
    let s0 = import::read_auto(&one, &opts()).unwrap();
    assert_eq!(s0.prompts[0].input_ids, g.prompts[0].input_ids);
    // the final-normed name needs N
    let e = import::read(
        &caps("sglang-dump"),
        Format::SglangDump,
        &ImportOptions::default(),
    )
    .unwrap_err();
    assert!(one_line(&e).contains("norm.output.0"), "{e}");
}

#[test]
fn sglang_generate_response_rows_are_the_final_normed_state_of_prompt_plus_fed_tokens() {
    let g = golden();
    let req: Value =
        serde_json::from_str(&std::fs::read_to_string(caps("sglang-json/request.json")).unwrap())
            .unwrap();
    let resp: Value =
        serde_json::from_str(&std::fs::read_to_string(caps("sglang-json/response.json")).unwrap())
            .unwrap();
    let ids: Vec<i64> = req["input_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    let o = ImportOptions {
        prompt_ids: Some(vec![ids.clone()]),
        ..opts()
    };
    let imp = import::read_auto(&caps("sglang-json/response.json"), &o).unwrap();
    assert_eq!(imp.format, Format::SglangJson);
    assert_eq!(imp.hidden_indices(), vec![N]);
    let p = &imp.prompts[0];
    let out: Vec<i64> = resp["output_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_i64().unwrap())
        .collect();
    assert_eq!(p.input_ids[..ids.len()], ids[..]);
    assert_eq!(
        p.input_ids[ids.len()..],
        out[..out.len() - 1],
        "the last sampled token is never fed"
    );
    assert_bf16_of(
        &state(&imp, 0, StateIndex::Hidden(N))
            .narrow(0, 0, ids.len())
            .unwrap(),
        &g.prompts[0].hidden_states[N],
        "hs[N]",
    );
    // the response has no prompt ids: refused without them, and with the wrong ones
    let e = import::read(
        &caps("sglang-json/response.json"),
        Format::SglangJson,
        &opts(),
    )
    .unwrap_err();
    assert!(one_line(&e).contains("prompt ids"), "{e}");
    let o = ImportOptions {
        prompt_ids: Some(vec![ids[..5].to_vec()]),
        ..opts()
    };
    let e = import::read(&caps("sglang-json/response.json"), Format::SglangJson, &o).unwrap_err();
    assert!(one_line(&e).contains("prefill rows"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// The manifest's indices (found by the generator by comparison) equal the importer's
// ---------------------------------------------------------------------------------------------

fn manifest_index(v: &Value) -> StateIndex {
    match v {
        Value::Number(n) => StateIndex::Hidden(n.as_u64().unwrap() as usize),
        Value::String(s) if s == "last_layer_output" => StateIndex::LastLayerOutput,
        other => panic!("manifest index {other}"),
    }
}

#[test]
fn every_manifest_file_imports_with_the_indices_the_generator_found() {
    let m = manifest();
    let toy_taps = vec![1, 2];
    let mut checked = 0;
    for f in m["files"].as_array().unwrap() {
        let Some(stored) = f.get("stored_layers").and_then(Value::as_object) else {
            continue;
        };
        let path = root().join(f["path"].as_str().unwrap());
        let fmt = Format::parse(f["format"].as_str().unwrap()).unwrap();
        let expect: BTreeSet<StateIndex> = stored.values().map(manifest_index).collect();
        let mut o = opts();
        match fmt {
            Format::Specforge => {
                let taps = f
                    .get("target_layer_ids")
                    .or_else(|| f.get("aux_hidden_states_layers"))
                    .map(|v| {
                        v.as_array()
                            .unwrap()
                            .iter()
                            .map(|x| x.as_u64().unwrap() as usize)
                            .collect()
                    })
                    .unwrap_or_else(|| toy_taps.clone());
                o.target_layer_ids = Some(taps);
                if let Some(n) = f.get("num_layers") {
                    o.num_layers = Some(n.as_u64().unwrap() as usize);
                }
            }
            Format::Vllm => {
                o.layer_ids = Some(
                    f["eagle_aux_hidden_state_layer_ids"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_u64().unwrap() as usize)
                        .collect(),
                );
            }
            Format::SglangDump => {}
            Format::SglangJson => {
                o.prompt_ids = Some(vec![f["input_ids"].as_array().unwrap()
                    [..f["prompt_tokens"].as_u64().unwrap() as usize]
                    .iter()
                    .map(|x| x.as_i64().unwrap())
                    .collect()]);
            }
        }
        assert_eq!(import::detect(&path).unwrap(), fmt, "{}", path.display());
        let imp = import::read(&path, fmt, &o).unwrap();
        let got: BTreeSet<StateIndex> = imp.indices().into_iter().collect();
        if f.get("deliberate_bug").is_some() {
            // read with the declared (wrong) ids, every label is one too early: the generator found +1
            let shifted: BTreeSet<StateIndex> = got
                .iter()
                .map(|i| match i {
                    StateIndex::Hidden(i) => StateIndex::Hidden(i + 1),
                    other => *other,
                })
                .collect();
            assert_eq!(shifted, expect, "{}", path.display());
        } else if fmt == Format::SglangDump {
            assert!(
                got.is_superset(&expect),
                "{}: {got:?} vs {expect:?}",
                path.display()
            );
        } else {
            assert_eq!(got, expect, "{}", path.display());
        }
        checked += 1;
    }
    assert!(checked >= 30, "only {checked} manifest files checked");
}

// ---------------------------------------------------------------------------------------------
// Format detection
// ---------------------------------------------------------------------------------------------

#[test]
fn formats_are_detected_where_the_file_is_unambiguous() {
    for (p, f) in [
        ("specforge-dflash", Format::Specforge),
        (
            "specforge-dflash-compressed/rows_0-2000/data_1.ckpt.gz",
            Format::Specforge,
        ),
        ("vllm", Format::Vllm),
        ("vllm/1.safetensors", Format::Vllm),
        ("sglang-dump", Format::SglangDump),
        ("sglang-json/response.json", Format::SglangJson),
    ] {
        assert_eq!(import::detect(&caps(p)).unwrap(), f, "{p}");
    }
    // a SpecForge record and an SGLang dumper file renamed to plain .pt are told apart by their keys
    let d = tempfile::tempdir().unwrap();
    std::fs::copy(
        caps("specforge-eagle3/rows_0-2000/data_0.ckpt"),
        d.path().join("sample.pt"),
    )
    .unwrap();
    assert_eq!(
        import::detect(&d.path().join("sample.pt")).unwrap(),
        Format::Specforge
    );
    let dumped = std::fs::read_dir(caps("sglang-dump/hsparity_fixture"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
    std::fs::copy(&dumped, d.path().join("tensor.pt")).unwrap();
    assert_eq!(
        import::detect(&d.path().join("tensor.pt")).unwrap(),
        Format::SglangDump
    );
}

#[test]
fn an_ambiguous_folder_is_refused_with_the_choices() {
    let d = tempfile::tempdir().unwrap();
    std::fs::copy(
        caps("specforge-dflash/rows_0-2000/data_0.ckpt"),
        d.path().join("data_0.ckpt"),
    )
    .unwrap();
    std::fs::copy(caps("vllm/0.safetensors"), d.path().join("0.safetensors")).unwrap();
    let e = import::detect(d.path()).unwrap_err();
    assert!(matches!(e, Error::Input(_)));
    let s = one_line(&e);
    assert!(
        s.contains("several formats (specforge, vllm)") && s.contains("sglang-dump, sglang-json"),
        "{s}"
    );
    // an hsparity dump is no engine file
    let e = import::detect(&root().join("fixtures/tiny-qwen3_5/golden/causal-lm.safetensors"))
        .unwrap_err();
    let s = one_line(&e);
    assert!(
        s.contains("causal-lm.safetensors")
            && s.contains("specforge, vllm, sglang-dump, sglang-json"),
        "{s}"
    );
}

// ---------------------------------------------------------------------------------------------
// Bad input: one line naming the file and the key
// ---------------------------------------------------------------------------------------------

fn dflash_opts() -> ImportOptions {
    ImportOptions {
        target_layer_ids: Some(vec![1, 3]),
        ..opts()
    }
}

#[test]
fn malformed_specforge_records_name_the_file_and_the_key() {
    for (file, needles) in [
        (
            "specforge-missing-hidden-states.ckpt",
            &["no `hidden_states` key", "input_ids"][..],
        ),
        (
            "specforge-bool-hidden-states.ckpt",
            &["key `hidden_states`", "torch.bool", "floating point"][..],
        ),
        (
            "specforge-int32-hidden-states.ckpt",
            &["key `hidden_states`", "torch.int32"][..],
        ),
        (
            "specforge-indivisible.ckpt",
            &[
                "key `hidden_states`",
                "129",
                "does not divide by the 2 target layer ids",
            ][..],
        ),
        (
            "specforge-rows-mismatch.ckpt",
            &["key `hidden_states`", "3 rows, input_ids 4"][..],
        ),
    ] {
        let e = import::read(
            &caps(&format!("bad/{file}")),
            Format::Specforge,
            &dflash_opts(),
        )
        .unwrap_err();
        assert!(matches!(e, Error::Format(_)), "{file}: {e:?}");
        let s = one_line(&e);
        assert!(s.contains(file), "{s}");
        for n in needles {
            assert!(s.contains(n), "{file}: {s} lacks {n:?}");
        }
    }
    // a given hidden size that the record contradicts
    let o = ImportOptions {
        hidden_size: Some(32),
        ..dflash_opts()
    };
    let e = import::read(
        &caps("specforge-dflash/rows_0-2000/data_1.ckpt"),
        Format::Specforge,
        &o,
    )
    .unwrap_err();
    assert!(one_line(&e).contains("hidden size given is 32"), "{e}");
    // the taps are not in the file
    let e = import::read(&caps("specforge-dflash"), Format::Specforge, &opts()).unwrap_err();
    assert!(matches!(e, Error::Input(_)));
    assert!(one_line(&e).contains("--target-layer-ids"), "{e}");
}

/// One safetensors entry: name, dtype, shape, bytes.
type Entry<'a> = (&'a str, &'a str, Vec<usize>, Vec<u8>);

/// A safetensors file from its entries.
fn safetensors(path: &Path, entries: &[Entry]) {
    let mut header = serde_json::Map::new();
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in entries {
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [data.len(), data.len() + bytes.len()]}),
        );
        data.extend_from_slice(bytes);
    }
    let mut h = serde_json::to_vec(&Value::Object(header)).unwrap();
    while h.len() % 8 != 0 {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    std::fs::write(path, out).unwrap();
}

fn i64s(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn malformed_vllm_files_name_the_file_and_the_key() {
    let d = tempfile::tempdir().unwrap();
    let o = ImportOptions {
        layer_ids: Some(vec![0, 2]),
        ..opts()
    };
    let ids = i64s(&[5, 6, 7]);
    let f32s = vec![0u8; 3 * 2 * 4 * 4];
    let cases: Vec<(&str, Vec<Entry>, &[&str])> = vec![
        (
            "no-token-ids.safetensors",
            vec![("hidden_states", "F32", vec![3, 2, 4], f32s.clone())],
            &["no `token_ids` key", "hidden_states"],
        ),
        (
            "no-hidden.safetensors",
            vec![("token_ids", "I64", vec![3], ids.clone())],
            &["no `hidden_states` key"],
        ),
        (
            "int32-hidden.safetensors",
            vec![
                (
                    "hidden_states",
                    "I32",
                    vec![3, 2, 4],
                    vec![0u8; 3 * 2 * 4 * 4],
                ),
                ("token_ids", "I64", vec![3], ids.clone()),
            ],
            &["key `hidden_states`", "I32", "floating point"],
        ),
        (
            "bool-hidden.safetensors",
            vec![
                ("hidden_states", "BOOL", vec![3, 2, 4], vec![0u8; 3 * 2 * 4]),
                ("token_ids", "I64", vec![3], ids.clone()),
            ],
            &["key `hidden_states`", "BOOL"],
        ),
        (
            "float-ids.safetensors",
            vec![
                ("hidden_states", "F32", vec![3, 2, 4], f32s.clone()),
                ("token_ids", "F32", vec![3], vec![0u8; 12]),
            ],
            &["key `token_ids`", "integers"],
        ),
        (
            "three-layers.safetensors",
            vec![
                (
                    "hidden_states",
                    "F32",
                    vec![3, 3, 4],
                    vec![0u8; 3 * 3 * 4 * 4],
                ),
                ("token_ids", "I64", vec![3], ids.clone()),
            ],
            &["key `hidden_states`", "[3, 3, 4]", "does not match"],
        ),
    ];
    for (name, entries, needles) in cases {
        let p = d.path().join(name);
        safetensors(&p, &entries);
        let e = import::read(&p, Format::Vllm, &o).unwrap_err();
        assert!(matches!(e, Error::Format(_)), "{name}: {e:?}");
        let s = one_line(&e);
        assert!(s.contains(name), "{s}");
        for n in needles {
            assert!(s.contains(n), "{name}: {s} lacks {n:?}");
        }
    }
    // an id past N
    let o = ImportOptions {
        layer_ids: Some(vec![0, 7]),
        ..opts()
    };
    let e = import::read(&caps("vllm"), Format::Vllm, &o).unwrap_err();
    assert!(
        one_line(&e).contains("layer id 7 does not exist in a 6-layer target"),
        "{e}"
    );
}

#[test]
fn unknown_formats_and_non_regular_files_are_refused() {
    let d = tempfile::tempdir().unwrap();
    let txt = d.path().join("notes.txt");
    std::fs::write(&txt, "not a capture\n").unwrap();
    let e = import::detect(&txt).unwrap_err();
    let s = one_line(&e);
    assert!(
        s.contains("notes.txt") && s.contains("specforge, vllm, sglang-dump, sglang-json"),
        "{s}"
    );
    let e = Format::parse("gguf").unwrap_err();
    assert!(one_line(&e).contains("\"gguf\"") && e.to_string().contains("sglang-json"));
    let e = import::read_auto(d.path(), &opts()).unwrap_err();
    assert!(one_line(&e).contains("no engine capture files"), "{e}");
    let e = import::read(Path::new("/dev/null"), Format::Specforge, &dflash_opts()).unwrap_err();
    assert!(matches!(e, Error::Input(_)));
    assert!(
        one_line(&e).contains("/dev/null: not a regular file or directory"),
        "{e}"
    );
    let e = import::detect(Path::new("/dev/null")).unwrap_err();
    assert!(one_line(&e).contains("not a regular file"), "{e}");
    let e = import::read(
        &d.path().join("missing.ckpt"),
        Format::Specforge,
        &dflash_opts(),
    )
    .unwrap_err();
    assert!(one_line(&e).contains("missing.ckpt"), "{e}");
    // a text file given as a SpecForge record
    let e = import::read(&txt, Format::Specforge, &dflash_opts()).unwrap_err();
    assert!(one_line(&e).contains("not a torch zip pickle"), "{e}");
    // a truncated gzip
    let gz = std::fs::read(caps(
        "specforge-dflash-compressed/rows_0-2000/data_0.ckpt.gz",
    ))
    .unwrap();
    let cut = d.path().join("data_9.ckpt.gz");
    std::fs::write(&cut, &gz[..gz.len() / 2]).unwrap();
    let e = import::read(&cut, Format::Specforge, &dflash_opts()).unwrap_err();
    assert!(one_line(&e).contains("data_9.ckpt.gz"), "{e}");
}

#[test]
fn sglang_json_without_hidden_states_names_the_key() {
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("response.json");
    std::fs::write(
        &p,
        r#"{"text": "x", "output_ids": [1], "meta_info": {"prompt_tokens": 2}}"#,
    )
    .unwrap();
    let o = ImportOptions {
        prompt_ids: Some(vec![vec![3, 4]]),
        ..opts()
    };
    let e = import::read(&p, Format::SglangJson, &o).unwrap_err();
    let s = one_line(&e);
    assert!(
        s.contains("response.json")
            && s.contains("meta_info.hidden_states")
            && s.contains("--enable-return-hidden-states"),
        "{s}"
    );
}
