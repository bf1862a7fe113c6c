//! `hsparity::import`: every engine file of `fixtures/engine-captures/`
//! (written by `tools/make_engine_captures.py` as each engine's writer writes
//! it) imports with its engine's layer-index convention mapped to
//! transformers' `hidden_states`, and the mapped states equal transformers'
//! own (the goldens of `fixtures/tiny-qwen3_5`).
//!
//! Every count (prompt lengths, padding, rows, layer ids, N, H) is read from
//! the generator's `manifest.json`. Tolerance (`common::captures`): bitwise
//! the golden rounded to bf16 where the engine ran the unpadded sequence
//! ([`UNPADDED`]), within one bf16 ulp of the row's scale where it ran a
//! right-padded batch ([`PADDED`]: SpecForge's short sample of a batch).

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;

use candle_core::Tensor;
use common::captures::{
    assert_bf16_of, caps, file, files, h_tiny, i64s, manifest, n_tiny, num, stored_indices,
    tiny_prompts, tolerance_of, usizes, Bf16Match, PADDED, UNPADDED,
};
use common::repo_root;
use hsparity::dump::Dump;
use hsparity::error::Error;
use hsparity::import::{self, Format, ImportOptions, Imported, StateIndex};
use serde_json::Value;

fn golden() -> Dump {
    Dump::read(&repo_root().join("fixtures/tiny-qwen3_5/golden/causal-lm.safetensors")).unwrap()
}

/// Golden `hidden_states[i]` of prompt k.
fn gold(g: &Dump, k: usize, i: usize) -> &Tensor {
    &g.prompts[k].hidden_states[&i]
}

/// Golden `last_layer_output` of prompt k.
fn gold_last(g: &Dump, k: usize) -> &Tensor {
    g.prompts[k].last_layer_output.as_ref().unwrap()
}

/// Golden `input_ids` of prompt k.
fn gold_ids(g: &Dump, k: usize) -> Vec<i64> {
    g.prompts[k]
        .input_ids
        .clone()
        .expect("the golden holds its ids")
}

fn opts(m: &Value) -> ImportOptions {
    ImportOptions {
        num_layers: Some(n_tiny(m)),
        ..Default::default()
    }
}

fn dflash_taps(m: &Value) -> Vec<usize> {
    usizes(&m["specforge"]["target_layer_ids"])
}

fn dflash_opts(m: &Value) -> ImportOptions {
    ImportOptions {
        target_layer_ids: Some(dflash_taps(m)),
        ..opts(m)
    }
}

fn vllm_ids(m: &Value) -> Vec<usize> {
    usizes(&m["vllm"]["eagle_aux_hidden_state_layer_ids"])
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

/// `imp`'s state `i` of prompt k against the golden's (`hidden_states[j]` or `last_layer_output`).
fn check_state(imp: &Imported, k: usize, i: StateIndex, g: &Dump, tol: &Bf16Match) {
    let want = match i {
        StateIndex::Hidden(j) => gold(g, k, j),
        StateIndex::LastLayerOutput => gold_last(g, k),
    };
    assert_bf16_of(state(imp, k, i), want, tol, &format!("p{k} {i}"));
}

// ---------------------------------------------------------------------------------------------
// SpecForge
// ---------------------------------------------------------------------------------------------

#[test]
fn specforge_dflash_records_map_tap_l_to_hidden_states_l_plus_1_and_trim_the_padding() {
    let (m, g) = (manifest(), golden());
    let taps = dflash_taps(&m);
    let imp = import::read(
        &caps("specforge-dflash"),
        Format::Specforge,
        &dflash_opts(&m),
    )
    .unwrap();
    assert_eq!(imp.format, Format::Specforge);
    assert_eq!(imp.stored_dtype, "bf16");
    assert_eq!(imp.hidden_size, h_tiny(&m));
    let want: BTreeSet<StateIndex> = taps.iter().map(|t| StateIndex::Hidden(t + 1)).collect();
    assert_eq!(hidden(&imp), want);
    assert_eq!(imp.mapping.layers[0].engine_id, Some(taps[0]));
    let h = h_tiny(&m);
    assert_eq!(
        imp.mapping.layers[1].stored_as,
        format!("hidden_states[..., {h}:{}]", 2 * h)
    );
    let entries = files(&m, "specforge-dflash/");
    common::same_len("prompts", &imp.prompts, &entries);
    // the short prompts were right-padded to the batch maximum and trimmed back
    let padded: Vec<&&Value> = entries
        .iter()
        .filter(|f| num(&f["trailing_padding"]) > 0)
        .collect();
    assert!(!padded.is_empty(), "the fixture batch pads a prompt");
    common::same_len("trims", &imp.trimmed, &padded);
    for (t, f) in imp.trimmed.iter().zip(&padded) {
        assert_eq!(
            (t.prompt, t.rows_in_file, t.rows_kept),
            (num(&f["prompt"]), num(&f["padded_to"]), num(&f["tokens"]))
        );
        let line = format!(
            "trimmed p{}: {} -> {} rows",
            t.prompt, t.rows_in_file, t.rows_kept
        );
        assert!(imp.summary().iter().any(|l| l.contains(&line)), "{line}");
    }
    for (k, (p, f)) in imp.prompts.iter().zip(&entries).enumerate() {
        assert_eq!(p.input_ids, gold_ids(&g, k), "p{k} ids");
        assert_eq!(p.input_ids.len(), num(&f["tokens"]));
        assert_eq!(p.loss_mask.as_ref().unwrap().len(), p.input_ids.len());
        for i in stored_indices(f) {
            check_state(&imp, k, i, &g, &tolerance_of(f));
        }
    }
    // the padded record is not bitwise (and the manifest says so), the unpadded one is
    assert_eq!(tolerance_of(padded[0]).name, PADDED.name);
}

#[test]
fn specforge_keep_padding_keeps_the_rows_the_capture_ran() {
    let m = manifest();
    let f = file(&m, "specforge-dflash/rows_0-2000/data_0.ckpt");
    let o = ImportOptions {
        keep_padding: true,
        ..dflash_opts(&m)
    };
    let imp = import::read(
        &caps("specforge-dflash/rows_0-2000/data_0.ckpt"),
        Format::Specforge,
        &o,
    )
    .unwrap();
    assert!(imp.trimmed.is_empty());
    let (tokens, padded_to) = (num(&f["tokens"]), num(&f["padded_to"]));
    assert!(padded_to > tokens);
    assert_eq!(imp.prompts[0].input_ids.len(), padded_to);
    assert!(imp.prompts[0].input_ids[tokens..].iter().all(|&i| i == 0));
}

#[test]
fn specforge_gzipped_records_read_like_the_plain_ones() {
    let m = manifest();
    let o = dflash_opts(&m);
    let a = import::read(&caps("specforge-dflash"), Format::Specforge, &o).unwrap();
    let b = import::read_auto(&caps("specforge-dflash-compressed"), &o).unwrap();
    assert_eq!(b.format, Format::Specforge);
    common::same_len("prompts", &a.prompts, &b.prompts);
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
    let (m, g) = (manifest(), golden());
    let f = file(&m, "specforge-eagle3/rows_0-2000/data_0.ckpt");
    let aux = usizes(&m["specforge"]["eagle3_aux_hidden_states_layers"]);
    let n = n_tiny(&m);
    let o = ImportOptions {
        target_layer_ids: Some(aux.clone()),
        ..opts(&m)
    };
    let imp = import::read_auto(&caps("specforge-eagle3/rows_0-2000/data_0.ckpt"), &o).unwrap();
    let mut want: BTreeSet<StateIndex> = aux.iter().map(|l| StateIndex::Hidden(l + 1)).collect();
    want.insert(StateIndex::Hidden(n));
    assert_eq!(hidden(&imp), want);
    assert_eq!(stored_indices(f), want, "the generator found the same");
    for i in want {
        check_state(&imp, 0, i, &g, &tolerance_of(f));
    }
    // without N the final-normed state cannot be placed: it is skipped, and said so
    let o = ImportOptions {
        target_layer_ids: Some(aux.clone()),
        ..Default::default()
    };
    let imp = import::read(
        &caps("specforge-eagle3/rows_0-2000/data_0.ckpt"),
        Format::Specforge,
        &o,
    )
    .unwrap();
    assert_eq!(
        imp.hidden_indices(),
        aux.iter().map(|l| l + 1).collect::<Vec<_>>()
    );
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
    // The rule itself: with N = (last tap + 1), the last tap is last_layer_output, not hidden_states[N].
    let m = manifest();
    let taps = dflash_taps(&m);
    let last = *taps.last().unwrap();
    let o = ImportOptions {
        target_layer_ids: Some(taps.clone()),
        num_layers: Some(last + 1),
        ..Default::default()
    };
    let imp = import::read(
        &caps("specforge-dflash/rows_0-2000/data_1.ckpt"),
        Format::Specforge,
        &o,
    )
    .unwrap();
    let mut want: BTreeSet<StateIndex> = taps[..taps.len() - 1]
        .iter()
        .map(|t| StateIndex::Hidden(t + 1))
        .collect();
    want.insert(StateIndex::LastLayerOutput);
    assert_eq!(hidden(&imp), want);
}

#[test]
fn toy_pair_training_record_holds_prompt_plus_response_with_the_drafter_taps() {
    let cfg: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("fixtures/toy-pair/drafter/config.json"))
            .unwrap(),
    )
    .unwrap();
    let taps = usizes(&cfg["dflash_config"]["target_layer_ids"]);
    let m = manifest();
    let toy = files(&m, "toy-pair-specforge");
    let o = ImportOptions {
        target_layer_ids: Some(taps.clone()),
        num_layers: Some(num(&toy[0]["num_layers"])),
        hidden_size: Some(num(&toy[0]["hidden_size"])),
        ..Default::default()
    };
    let imp = import::read_auto(&caps("toy-pair-specforge"), &o).unwrap();
    assert_eq!(
        imp.hidden_indices(),
        taps.iter().map(|t| t + 1).collect::<Vec<_>>()
    );
    common::same_len("records", &imp.prompts, &toy);
    assert!(imp.trimmed.is_empty());
    for (p, f) in imp.prompts.iter().zip(&toy) {
        assert!(p.source.ends_with(
            f["path"]
                .as_str()
                .unwrap()
                .trim_start_matches("fixtures/engine-captures/")
        ));
        let (pt, rt) = (num(&f["prompt_tokens"]), num(&f["response_tokens"]));
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
    let (m, g) = (manifest(), golden());
    let (ids, n) = (vllm_ids(&m), n_tiny(&m));
    assert!(ids.contains(&n), "the fixture asks for id N");
    let o = ImportOptions {
        layer_ids: Some(ids.clone()),
        ..opts(&m)
    };
    let imp = import::read_auto(&caps("vllm"), &o).unwrap();
    assert_eq!(imp.format, Format::Vllm);
    let want: BTreeSet<StateIndex> = ids
        .iter()
        .map(|&k| {
            if k == n {
                StateIndex::LastLayerOutput
            } else {
                StateIndex::Hidden(k)
            }
        })
        .collect();
    assert_eq!(hidden(&imp), want);
    assert!(
        imp.prompts
            .iter()
            .all(|p| !p.hidden_states.contains_key(&n)),
        "id N must never land at index N"
    );
    let entries = files(&m, "vllm/");
    common::same_len("requests", &imp.prompts, &entries);
    for (k, (p, f)) in imp.prompts.iter().zip(&entries).enumerate() {
        assert_eq!(p.input_ids, gold_ids(&g, k));
        assert_eq!(p.input_ids.len(), num(&f["tokens"]));
        assert_eq!(stored_indices(f), want);
        for &i in &want {
            check_state(&imp, k, i, &g, &tolerance_of(f));
        }
    }
}

/// vLLM 0.32 names its capture files `{request index}-{random suffix}`:
/// requests 2 and 10 come in that order (as text "10-…" sorts first).
#[test]
fn vllm_request_files_sort_by_their_request_number() {
    let (m, g) = (manifest(), golden());
    let d = tempfile::tempdir().unwrap();
    for (src, name) in [("0", "2-0f3c1b2d"), ("1", "10-aaba4a94")] {
        let to = d.path().join(format!("{name}.safetensors"));
        std::fs::copy(caps(&format!("vllm/{src}.safetensors")), to).unwrap();
    }
    let o = ImportOptions {
        layer_ids: Some(vllm_ids(&m)),
        ..opts(&m)
    };
    let imp = import::read(d.path(), Format::Vllm, &o).unwrap();
    let ids: Vec<Vec<i64>> = imp.prompts.iter().map(|p| p.input_ids.clone()).collect();
    assert_eq!(ids, vec![gold_ids(&g, 0), gold_ids(&g, 1)]);
    assert!(imp.prompts[0].source.ends_with("2-0f3c1b2d.safetensors"));
}

/// A folder whose files are not one `LLM` run's numbered requests is
/// refused rather than imported in an order that is not the prompts'.
#[test]
fn vllm_folders_of_mixed_or_repeated_request_numbers_are_refused() {
    let m = manifest();
    let o = ImportOptions {
        layer_ids: Some(vllm_ids(&m)),
        ..opts(&m)
    };
    for (names, want) in [
        (&["2-x", "10-y", "cmpl-abc"][..], "numbered by vLLM's LLM (e.g. 2-x.safetensors) beside others (e.g. cmpl-abc.safetensors)"),
        (&["1-a", "1-b"][..], "two files of request 1 (1-a.safetensors and 1-b.safetensors)"),
    ] {
        let d = tempfile::tempdir().unwrap();
        for n in names {
            std::fs::copy(caps("vllm/0.safetensors"), d.path().join(format!("{n}.safetensors"))).unwrap();
        }
        let e = one_line(&import::read(d.path(), Format::Vllm, &o).unwrap_err());
        assert!(e.contains(want), "{e}");
    }
}

#[test]
fn vllm_older_l_t_h_layout_reads_the_same_states() {
    let m = manifest();
    let o = ImportOptions {
        layer_ids: Some(vllm_ids(&m)),
        ..opts(&m)
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
    let m = manifest();
    let o = ImportOptions {
        layer_ids: Some(vllm_ids(&m)),
        ..Default::default()
    };
    let e = import::read(&caps("vllm"), Format::Vllm, &o).unwrap_err();
    assert!(matches!(e, Error::Input(_)));
    let s = one_line(&e);
    assert!(
        s.contains("before the final norm") && s.contains("vllm"),
        "{s}"
    );
    let e = import::read(&caps("vllm"), Format::Vllm, &opts(&m)).unwrap_err();
    assert!(one_line(&e).contains("--layer-ids"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// SGLang
// ---------------------------------------------------------------------------------------------

#[test]
fn sglang_dump_files_stitch_prefill_and_decode_and_map_the_dumper_names() {
    let (m, g) = (manifest(), golden());
    let fed = i64s(&m["sglang_dump"]["fed_ids"]);
    let prompt = i64s(&m["sglang_dump"]["prompt_ids"]);
    let t0 = prompt.len();
    assert_eq!(t0, tiny_prompts(&m)[0]);
    let imp = import::read_auto(&caps("sglang-dump"), &opts(&m)).unwrap();
    assert_eq!(imp.format, Format::SglangDump);
    let want: BTreeSet<StateIndex> = files(&m, "sglang-dump/")
        .iter()
        .filter(|f| f.get("stored_layers").is_some())
        .flat_map(|f| stored_indices(f))
        .collect();
    assert_eq!(hidden(&imp), want);
    assert_eq!(
        imp.prompts.len(),
        1,
        "prefill (step 0) and decode (step 1) are one sequence"
    );
    let p = &imp.prompts[0];
    assert_eq!(p.input_ids, fed);
    assert_eq!(p.input_ids[..t0], gold_ids(&g, 0)[..]);
    // The dumper's positions, and the prompt: the rows before the first
    // single-row (decode) step.
    assert_eq!(
        p.position_ids.as_deref(),
        Some(&(0..fed.len() as i64).collect::<Vec<_>>()[..])
    );
    assert_eq!(p.prompt_length, Some(t0));
    assert!(
        imp.notes
            .iter()
            .any(|n| n.contains(&format!("(prefill {t0} + 1 decode step)"))),
        "{:?}",
        imp.notes
    );
    // the prefill rows are the prompt's forward (the golden); the decode rows have no golden
    for &i in &want {
        let t = state(&imp, 0, i);
        assert_eq!(t.dims2().unwrap().0, fed.len());
        let want = match i {
            StateIndex::Hidden(j) => gold(&g, 0, j),
            StateIndex::LastLayerOutput => gold_last(&g, 0),
        };
        assert_bf16_of(
            &t.narrow(0, 0, t0).unwrap(),
            want,
            &UNPADDED,
            &format!("{i}"),
        );
    }
    let layer2 = imp
        .mapping
        .layers
        .iter()
        .find(|l| l.stored_as.contains(".input_layernorm.output.1"))
        .unwrap();
    assert_eq!(layer2.index, StateIndex::Hidden(layer2.engine_id.unwrap()));
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
            ..opts(&m)
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
    let s0 = import::read_auto(&one, &opts(&m)).unwrap();
    assert_eq!(s0.prompts[0].input_ids, gold_ids(&g, 0));
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
    let (m, g) = (manifest(), golden());
    let n = n_tiny(&m);
    let req: Value =
        serde_json::from_str(&std::fs::read_to_string(caps("sglang-json/request.json")).unwrap())
            .unwrap();
    let resp: Value =
        serde_json::from_str(&std::fs::read_to_string(caps("sglang-json/response.json")).unwrap())
            .unwrap();
    let ids = i64s(&req["input_ids"]);
    let f = file(&m, "sglang-json/response.json");
    assert_eq!(ids.len(), num(&f["prompt_tokens"]));
    let o = ImportOptions {
        prompt_ids: Some(vec![ids.clone()]),
        ..opts(&m)
    };
    let imp = import::read_auto(&caps("sglang-json/response.json"), &o).unwrap();
    assert_eq!(imp.format, Format::SglangJson);
    assert_eq!(imp.stored_dtype, "bf16", "tolist() of a bf16 tensor");
    assert_eq!(imp.hidden_indices(), vec![n]);
    let p = &imp.prompts[0];
    let out = i64s(&resp["output_ids"]);
    assert_eq!(p.input_ids, i64s(&f["input_ids"]));
    assert_eq!(p.input_ids.len(), num(&f["rows"]));
    assert_eq!(p.input_ids[..ids.len()], ids[..]);
    assert_eq!(
        p.input_ids[ids.len()..],
        out[..out.len() - 1],
        "the last sampled token is never fed"
    );
    assert_bf16_of(
        &state(&imp, 0, StateIndex::Hidden(n))
            .narrow(0, 0, ids.len())
            .unwrap(),
        gold(&g, 0, n),
        &UNPADDED,
        "hs[N]",
    );
    // the response has no prompt ids: refused without them, and with the wrong ones
    let e = import::read(
        &caps("sglang-json/response.json"),
        Format::SglangJson,
        &opts(&m),
    )
    .unwrap_err();
    assert!(one_line(&e).contains("prompt ids"), "{e}");
    let o = ImportOptions {
        prompt_ids: Some(vec![ids[..ids.len() / 2].to_vec()]),
        ..opts(&m)
    };
    let e = import::read(&caps("sglang-json/response.json"), Format::SglangJson, &o).unwrap_err();
    assert!(one_line(&e).contains("prefill rows"), "{e}");
}

// ---------------------------------------------------------------------------------------------
// The manifest's indices (found by the generator by comparison) equal the importer's
// ---------------------------------------------------------------------------------------------

#[test]
fn every_manifest_file_imports_with_the_indices_the_generator_found() {
    let m = manifest();
    let mut checked = 0;
    for f in m["files"].as_array().unwrap() {
        if f.get("stored_layers").is_none() {
            continue;
        }
        let path = repo_root().join(f["path"].as_str().unwrap());
        let fmt = Format::parse(f["format"].as_str().unwrap()).unwrap();
        let expect = stored_indices(f);
        let mut o = opts(&m);
        match fmt {
            Format::Specforge => {
                let taps = f
                    .get("target_layer_ids")
                    .or_else(|| f.get("aux_hidden_states_layers"))
                    .map(usizes)
                    .expect("the taps of the record");
                o.target_layer_ids = Some(taps);
                if let Some(n) = f.get("num_layers") {
                    o.num_layers = Some(num(n));
                }
            }
            Format::Vllm => o.layer_ids = Some(usizes(&f["eagle_aux_hidden_state_layer_ids"])),
            Format::SglangDump => {}
            Format::SglangJson => {
                o.prompt_ids = Some(vec![
                    i64s(&f["input_ids"])[..num(&f["prompt_tokens"])].to_vec()
                ]);
            }
        }
        assert_eq!(import::detect(&path).unwrap(), fmt, "{}", path.display());
        let imp = import::read(&path, fmt, &o).unwrap();
        let got: BTreeSet<StateIndex> = imp.indices().into_iter().collect();
        if f.get("deliberate_bug").is_some() {
            // read with the declared (wrong) ids, every label is off by the bug: the generator found it
            let shift = usizes(&f["captured_layer_ids"])[0]
                - usizes(&f["eagle_aux_hidden_state_layer_ids"])[0];
            let shifted: BTreeSet<StateIndex> = got
                .iter()
                .map(|i| match i {
                    StateIndex::Hidden(i) => StateIndex::Hidden(i + shift),
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
    let with_layers = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f.get("stored_layers").is_some())
        .count();
    assert_eq!(checked, with_layers);
    // the identification evidence: bitwise where unpadded, within the bound where padded
    for f in m["files"].as_array().unwrap() {
        for (name, e) in f
            .get("identification")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            let tol = tolerance_of(f);
            assert!(
                e["max_row_scale_bf16_ulps"].as_f64().unwrap() <= tol.row_scale_ulps,
                "{} {name}: {e}",
                f["path"]
            );
            assert_eq!(
                e["bitwise"].as_bool().unwrap(),
                e["elements_not_bitwise"].as_u64() == Some(0)
            );
            if tol.row_scale_ulps == 0.0 {
                assert_eq!(e["bitwise"], true, "{} {name}", f["path"]);
            }
        }
    }
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
    let e = import::detect(&repo_root().join("fixtures/tiny-qwen3_5/golden/causal-lm.safetensors"))
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

#[test]
fn malformed_specforge_records_name_the_file_and_the_key() {
    let m = manifest();
    let k = dflash_taps(&m).len();
    let width = (k * h_tiny(&m) + 1).to_string();
    let divide = format!("does not divide by the {k} target layer ids");
    let bad = file(&m, "bad/specforge-rows-mismatch.ckpt");
    let rows = format!(
        "{} rows, input_ids {}",
        usizes(&bad["keys"]["hidden_states"]["shape"])[1],
        usizes(&bad["keys"]["input_ids"]["shape"])[0]
    );
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
            &["key `hidden_states`", width.as_str(), divide.as_str()][..],
        ),
        (
            "specforge-rows-mismatch.ckpt",
            &["key `hidden_states`", rows.as_str()][..],
        ),
    ] {
        let e = import::read(
            &caps(&format!("bad/{file}")),
            Format::Specforge,
            &dflash_opts(&m),
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
        hidden_size: Some(h_tiny(&m) / 2),
        ..dflash_opts(&m)
    };
    let e = import::read(
        &caps("specforge-dflash/rows_0-2000/data_1.ckpt"),
        Format::Specforge,
        &o,
    )
    .unwrap_err();
    let given = format!("hidden size given is {}", h_tiny(&m) / 2);
    assert!(one_line(&e).contains(&given), "{e}");
    // the taps are not in the file
    let e = import::read(&caps("specforge-dflash"), Format::Specforge, &opts(&m)).unwrap_err();
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
    while !h.len().is_multiple_of(8) {
        h.push(b' ');
    }
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend(h);
    out.extend(data);
    std::fs::write(path, out).unwrap();
}

fn le_bytes(v: &[i64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

#[test]
fn malformed_vllm_files_name_the_file_and_the_key() {
    // synthetic files: 3 tokens, 2 layer ids, H = 4 (the shapes are the test's own)
    let m = manifest();
    let d = tempfile::tempdir().unwrap();
    let o = ImportOptions {
        layer_ids: Some(vec![0, 2]),
        ..opts(&m)
    };
    let ids = le_bytes(&[5, 6, 7]);
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
    let n = n_tiny(&m);
    let o = ImportOptions {
        layer_ids: Some(vec![0, n + 1]),
        ..opts(&m)
    };
    let e = import::read(&caps("vllm"), Format::Vllm, &o).unwrap_err();
    let want = format!("layer id {} does not exist in a {n}-layer target", n + 1);
    assert!(one_line(&e).contains(&want), "{e}");
}

#[test]
fn unknown_formats_and_non_regular_files_are_refused() {
    let m = manifest();
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
    let e = import::read_auto(d.path(), &opts(&m)).unwrap_err();
    assert!(one_line(&e).contains("no engine capture files"), "{e}");
    let e = import::read(Path::new("/dev/null"), Format::Specforge, &dflash_opts(&m)).unwrap_err();
    assert!(matches!(e, Error::Input(_)));
    assert!(
        one_line(&e).contains("/dev/null: is a character device, not a regular file or directory"),
        "{e}"
    );
    let e = import::detect(Path::new("/dev/null")).unwrap_err();
    assert!(one_line(&e).contains("not a regular file"), "{e}");
    let e = import::read(
        &d.path().join("missing.ckpt"),
        Format::Specforge,
        &dflash_opts(&m),
    )
    .unwrap_err();
    assert!(one_line(&e).contains("missing.ckpt"), "{e}");
    // a text file given as a SpecForge record
    let e = import::read(&txt, Format::Specforge, &dflash_opts(&m)).unwrap_err();
    assert!(one_line(&e).contains("not a torch zip pickle"), "{e}");
    // a truncated gzip
    let gz = std::fs::read(caps(
        "specforge-dflash-compressed/rows_0-2000/data_0.ckpt.gz",
    ))
    .unwrap();
    let cut = d.path().join("data_9.ckpt.gz");
    std::fs::write(&cut, &gz[..gz.len() / 2]).unwrap();
    let e = import::read(&cut, Format::Specforge, &dflash_opts(&m)).unwrap_err();
    assert!(one_line(&e).contains("data_9.ckpt.gz"), "{e}");
}

#[test]
fn sglang_json_without_hidden_states_names_the_key() {
    let m = manifest();
    let d = tempfile::tempdir().unwrap();
    let p = d.path().join("response.json");
    std::fs::write(
        &p,
        r#"{"text": "x", "output_ids": [1], "meta_info": {"prompt_tokens": 2}}"#,
    )
    .unwrap();
    let o = ImportOptions {
        prompt_ids: Some(vec![vec![3, 4]]),
        ..opts(&m)
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
