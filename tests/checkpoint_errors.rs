//! Bad checkpoints give the right `Error` variant with a message naming the
//! file or tensor (exit code 2 in the CLI). Built from copies of the tiny
//! fixture (real f32 shards written by transformers).

use crate::common;

use std::io::{Seek, SeekFrom, Write};

use hsparity::checkpoint::Checkpoint;
use hsparity::error::Error;
use hsparity::loading::{self, LoadingPath};
use serde_json::Value;

const SHARD1: &str = "model-00001-of-00003.safetensors";
const SHARD2: &str = "model-00002-of-00003.safetensors";

fn tiny_copy() -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("tiny");
    common::copy_tiny(&dir);
    (tmp, dir)
}

fn open_err(dir: &std::path::Path) -> Error {
    Checkpoint::open(dir.to_str().unwrap()).expect_err("must fail")
}

fn edit_json(path: &std::path::Path, f: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_vec(&v).unwrap()).unwrap();
}

#[test]
fn missing_shard_is_named() {
    let (_t, dir) = tiny_copy();
    std::fs::remove_file(dir.join(SHARD2)).unwrap();
    let e = open_err(&dir);
    assert!(matches!(e, Error::Checkpoint(_)), "{e:?}");
    assert!(e.to_string().contains(SHARD2), "{e}");
}

#[test]
fn truncated_header_is_named() {
    let (_t, dir) = tiny_copy();
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(SHARD1))
        .unwrap();
    f.set_len(5).unwrap();
    let e = open_err(&dir);
    assert!(matches!(e, Error::Checkpoint(_)), "{e:?}");
    let m = e.to_string();
    assert!(m.contains(SHARD1) && m.contains("truncated"), "{m}");
}

#[test]
fn header_not_json_is_named() {
    let (_t, dir) = tiny_copy();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(SHARD1))
        .unwrap();
    f.seek(SeekFrom::Start(8)).unwrap();
    f.write_all(b"not json at all").unwrap();
    let e = open_err(&dir);
    assert!(matches!(e, Error::Checkpoint(_)), "{e:?}");
    let m = e.to_string();
    assert!(m.contains(SHARD1) && m.contains("JSON"), "{m}");
}

#[test]
fn header_length_beyond_file_size() {
    let (_t, dir) = tiny_copy();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .open(dir.join(SHARD1))
        .unwrap();
    f.write_all(&(1u64 << 40).to_le_bytes()).unwrap();
    let e = open_err(&dir);
    assert!(matches!(e, Error::Checkpoint(_)), "{e:?}");
    let m = e.to_string();
    assert!(m.contains(SHARD1) && m.contains("header length"), "{m}");
}

#[test]
fn data_past_end_of_file() {
    let (_t, dir) = tiny_copy();
    let p = dir.join(SHARD2);
    let len = std::fs::metadata(&p).unwrap().len();
    let f = std::fs::OpenOptions::new().write(true).open(&p).unwrap();
    f.set_len(len - 100).unwrap();
    let e = open_err(&dir);
    assert!(matches!(e, Error::Checkpoint(_)), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains(SHARD2) && m.contains("truncated download"),
        "{m}"
    );
}

#[test]
fn data_offsets_inconsistent_with_shape() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    std::fs::copy(
        common::repo_root().join("fixtures/tiny-qwen3_5/config.json"),
        dir.join("config.json"),
    )
    .unwrap();
    // Header claims [4, 4] F32 (64 bytes) but offsets span 32.
    let h = br#"{"x.weight":{"dtype":"F32","shape":[4,4],"data_offsets":[0,32]}}"#;
    let mut f = std::fs::File::create(dir.join("model.safetensors")).unwrap();
    f.write_all(&(h.len() as u64).to_le_bytes()).unwrap();
    f.write_all(h).unwrap();
    f.write_all(&[0u8; 32]).unwrap();
    drop(f);
    let e = open_err(dir);
    assert!(matches!(e, Error::Checkpoint(_)), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains("model.safetensors") && m.contains("x.weight"),
        "{m}"
    );
}

#[test]
fn tensor_in_index_absent_from_shard() {
    let (_t, dir) = tiny_copy();
    edit_json(&dir.join("model.safetensors.index.json"), |v| {
        v["weight_map"]["model.language_model.ghost.weight"] = Value::String(SHARD1.into());
    });
    let e = open_err(&dir);
    assert!(matches!(e, Error::Checkpoint(_)), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains("model.language_model.ghost.weight") && m.contains(SHARD1),
        "{m}"
    );
}

#[test]
fn unknown_model_type() {
    let (_t, dir) = tiny_copy();
    edit_json(&dir.join("config.json"), |v| {
        v["model_type"] = "llama".into()
    });
    let e = open_err(&dir);
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    assert!(e.to_string().contains("llama"), "{e}");
}

#[test]
fn missing_config_json() {
    let (_t, dir) = tiny_copy();
    std::fs::remove_file(dir.join("config.json")).unwrap();
    let e = open_err(&dir);
    assert!(matches!(e, Error::Config(_)), "{e:?}");
    assert!(e.to_string().contains("config.json"), "{e}");
}

#[test]
fn shape_mismatch_names_tensor_expected_found() {
    let (_t, dir) = tiny_copy();
    edit_json(&dir.join("config.json"), |v| {
        v["text_config"]["intermediate_size"] = 96.into()
    });
    let ckpt = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let e = loading::resolve(&ckpt, LoadingPath::CausalLm).expect_err("must fail");
    assert!(matches!(e, Error::Checkpoint(_)), "{e:?}");
    let m = e.to_string();
    assert!(
        m.contains("model.language_model.layers.0.mlp.gate_proj.weight")
            && m.contains("[96, 64]")
            && m.contains("[128, 64]"),
        "{m}"
    );
}

#[test]
fn image_text_to_text_on_text_only_config() {
    let (_t, dir) = tiny_copy();
    edit_json(&dir.join("config.json"), |v| {
        let mut tc = v["text_config"].clone();
        tc["model_type"] = "qwen3_5_text".into();
        *v = tc;
    });
    let ckpt = Checkpoint::open(dir.to_str().unwrap()).unwrap();
    let e = loading::resolve(&ckpt, LoadingPath::ImageTextToText).expect_err("must fail");
    assert!(matches!(e, Error::Input(_)), "{e:?}");
    assert!(e.to_string().contains("qwen3_5_text"), "{e}");
}

#[test]
fn not_a_checkpoint_argument() {
    let e = Checkpoint::open("definitely/not/a/path").expect_err("must fail");
    assert!(matches!(e, Error::Input(_)), "{e:?}");
    let e = Checkpoint::open("./nope-does-not-exist").expect_err("must fail");
    assert!(matches!(e, Error::Input(_)), "{e:?}");
}
