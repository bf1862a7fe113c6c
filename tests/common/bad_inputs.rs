//! Generator of the bad-input corpus: each case is built at test time into its
//! own directory (a mutated copy of `fixtures/tiny-qwen3_5`, a prompts file, a
//! fake Hugging Face cache, or just arguments), never stored as binaries.
//!
//! Used by `tests/bad_inputs.rs`, which runs every case through the binary.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use serde_json::{json, Map, Value};

/// The bundled fixture every checkpoint case starts from.
pub const TINY: &str = "fixtures/tiny-qwen3_5";
/// Shard files of the fixture.
pub const SHARD1: &str = "model-00001-of-00003.safetensors";
pub const SHARD2: &str = "model-00002-of-00003.safetensors";
pub const SHARD3: &str = "model-00003-of-00003.safetensors";
/// A commit hash for the fake hub cache.
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

/// How the binary should fail on a case.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Exit 2, one `error: ` line naming the problem, no report written.
    BadInput,
    /// Exit 1 (a finding, not bad input), e.g. NaN weights.
    Finding,
}

/// One generated bad input: the `compare` command line to run and what the
/// single error line must contain.
#[derive(Debug, Clone)]
pub struct Case {
    /// `<CHECKPOINT>` argument.
    pub checkpoint: OsString,
    /// Extra arguments after the checkpoint (prompt options, …).
    pub args: Vec<OsString>,
    /// Environment variables to set (e.g. `HF_HUB_CACHE`).
    pub env: Vec<(String, OsString)>,
    /// `--report-dir` to pass (the report goes to `<report_dir>/r`).
    pub report_dir: PathBuf,
    /// Substrings the error line must contain (file, field or flag, and problem).
    pub needles: Vec<String>,
    /// Exit 2 or exit 1.
    pub expect: Expect,
    /// Files that must be unchanged after the run, with their content before.
    pub unchanged: Vec<(PathBuf, Vec<u8>)>,
}

impl Case {
    fn new(checkpoint: impl Into<OsString>, root: &Path, needles: &[&str]) -> Self {
        Case {
            checkpoint: checkpoint.into(),
            args: Vec::new(),
            env: Vec::new(),
            report_dir: root.join("reports"),
            needles: needles.iter().map(|s| s.to_string()).collect(),
            expect: Expect::BadInput,
            unchanged: Vec::new(),
        }
    }

    fn arg(mut self, a: impl Into<OsString>) -> Self {
        self.args.push(a.into());
        self
    }

    fn env(mut self, k: &str, v: impl Into<OsString>) -> Self {
        self.env.push((k.to_string(), v.into()));
        self
    }

    /// A case on the (unmodified) bundled fixture, e.g. for prompt errors.
    fn on_fixture(root: &Path, needles: &[&str]) -> Self {
        Case::new(repo_root().join(TINY), root, needles)
    }
}

/// Repository root.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

// ---------------------------------------------------------------- mutators

/// Copies the fixture's files into `root/ckpt` and returns that directory.
pub fn tiny_copy(root: &Path) -> PathBuf {
    let src = repo_root().join(TINY);
    let dst = root.join("ckpt");
    std::fs::create_dir_all(&dst).unwrap();
    for e in std::fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), dst.join(e.file_name())).unwrap();
        }
    }
    dst
}

/// Rewrites the JSON file at `path` through `f`.
pub fn edit_json(path: &Path, f: impl FnOnce(&mut Value)) {
    let mut v: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_vec_pretty(&v).unwrap()).unwrap();
}

/// Rewrites `text_config` of the copy's `config.json` through `f`.
pub fn edit_text_config(dir: &Path, f: impl FnOnce(&mut Map<String, Value>)) {
    edit_json(&dir.join("config.json"), |v| {
        f(v["text_config"].as_object_mut().unwrap())
    });
}

/// A safetensors file split into its header (JSON object) and data bytes.
pub struct Shard {
    pub header: Map<String, Value>,
    pub data: Vec<u8>,
}

impl Shard {
    /// Reads `8-byte LE length + JSON + data`.
    pub fn read(path: &Path) -> Self {
        let bytes = std::fs::read(path).unwrap();
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
        Shard {
            header: header.as_object().unwrap().clone(),
            data: bytes[8 + n..].to_vec(),
        }
    }

    /// Writes it back (header padded with spaces to a multiple of 8).
    pub fn write(&self, path: &Path) {
        let mut h = serde_json::to_vec(&Value::Object(self.header.clone())).unwrap();
        while !h.len().is_multiple_of(8) {
            h.push(b' ');
        }
        write_raw(path, &h, &self.data);
    }

    /// Names of the tensors (not `__metadata__`).
    pub fn names(&self) -> Vec<String> {
        self.header
            .keys()
            .filter(|k| *k != "__metadata__")
            .cloned()
            .collect()
    }

    /// The entry of tensor `name`.
    pub fn entry(&mut self, name: &str) -> &mut Value {
        self.header
            .get_mut(name)
            .unwrap_or_else(|| panic!("test helper: no tensor {name}"))
    }

    /// `[begin, end)` of tensor `name`.
    pub fn offsets(&self, name: &str) -> (u64, u64) {
        let o = &self.header[name]["data_offsets"];
        (o[0].as_u64().unwrap(), o[1].as_u64().unwrap())
    }
}

/// Writes a safetensors file from raw header bytes and data.
pub fn write_raw(path: &Path, header: &[u8], data: &[u8]) {
    let mut f = File::create(path).unwrap();
    f.write_all(&(header.len() as u64).to_le_bytes()).unwrap();
    f.write_all(header).unwrap();
    f.write_all(data).unwrap();
}

/// Edits one shard of the copy through `f`.
pub fn edit_shard(dir: &Path, file: &str, f: impl FnOnce(&mut Shard)) {
    let p = dir.join(file);
    let mut s = Shard::read(&p);
    f(&mut s);
    s.write(&p);
}

/// The shard of the copy that holds `tensor` (from the index).
pub fn shard_of(dir: &Path, tensor: &str) -> String {
    let v: Value =
        serde_json::from_slice(&std::fs::read(dir.join("model.safetensors.index.json")).unwrap())
            .unwrap();
    v["weight_map"][tensor].as_str().unwrap().to_string()
}

/// Writes `vals` as f32 into tensor `name`'s data, from element 0.
pub fn poke_f32(dir: &Path, name: &str, vals: &[f32]) {
    let file = shard_of(dir, name);
    let s = Shard::read(&dir.join(&file));
    assert_eq!(s.header[name]["dtype"], "F32");
    let (b, _) = s.offsets(name);
    let n = u64::from_le_bytes(
        std::fs::read(dir.join(&file)).unwrap()[..8]
            .try_into()
            .unwrap(),
    );
    let mut f = OpenOptions::new()
        .write(true)
        .open(dir.join(&file))
        .unwrap();
    f.seek(SeekFrom::Start(8 + n + b)).unwrap();
    for v in vals {
        f.write_all(&v.to_le_bytes()).unwrap();
    }
}

/// Truncates (or extends) the file to `len` bytes.
pub fn set_len(path: &Path, len: u64) {
    OpenOptions::new()
        .write(true)
        .open(path)
        .unwrap()
        .set_len(len)
        .unwrap();
}

/// Writes a prompts file `root/prompts.jsonl` with `body`; returns its path.
pub fn prompts_file(root: &Path, body: &[u8]) -> PathBuf {
    let p = root.join("prompts.jsonl");
    std::fs::write(&p, body).unwrap();
    p
}

/// A fake hub cache under `root/hub` holding the tiny fixture as `repo_id`
/// (`refs/main` → [`COMMIT`], snapshot files copied). Returns (cache, repo dir).
pub fn fake_hub(root: &Path, repo_id: &str) -> (PathBuf, PathBuf) {
    let cache = root.join("hub");
    let repo = cache.join(format!("models--{}", repo_id.replace('/', "--")));
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), COMMIT).unwrap();
    let snap = repo.join("snapshots").join(COMMIT);
    std::fs::create_dir_all(&snap).unwrap();
    for e in std::fs::read_dir(repo_root().join(TINY)).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() {
            std::fs::copy(e.path(), snap.join(e.file_name())).unwrap();
        }
    }
    (cache, repo)
}

// ---------------------------------------------------------------- the cases

const UP0: &str = "model.language_model.layers.0.mlp.up_proj.weight";
const K2: &str = "model.language_model.layers.2.self_attn.k_proj.weight";

/// First 8 bytes cut: the header length itself is incomplete.
pub fn truncated_header(root: &Path) -> Case {
    let d = tiny_copy(root);
    set_len(&d.join(SHARD1), 5);
    Case::new(&d, root, &[SHARD1, "truncated safetensors header"])
}

/// Header length field larger than the file.
pub fn header_length_past_eof(root: &Path) -> Case {
    let d = tiny_copy(root);
    let mut f = OpenOptions::new().write(true).open(d.join(SHARD2)).unwrap();
    f.write_all(&(1u64 << 40).to_le_bytes()).unwrap();
    Case::new(
        &d,
        root,
        &[SHARD2, "header length 1099511627776 goes beyond"],
    )
}

/// Header bytes that are not JSON.
pub fn header_invalid_json(root: &Path) -> Case {
    let d = tiny_copy(root);
    let data = Shard::read(&d.join(SHARD1)).data;
    write_raw(&d.join(SHARD1), b"{\"a\": nope, ", &data);
    Case::new(&d, root, &[SHARD1, "not a JSON object"])
}

/// A tensor whose (self-consistent) range lies past the end of the data.
pub fn offsets_out_of_range(root: &Path) -> Case {
    let d = tiny_copy(root);
    let file = shard_of(&d, UP0);
    edit_shard(&d, &file, |s| {
        let (b, e) = s.offsets(UP0);
        let shift = s.data.len() as u64;
        s.entry(UP0)["data_offsets"] = json!([b + shift, e + shift]);
    });
    Case::new(&d, root, &[&file, UP0, "data ends at byte"])
}

/// Two tensors sharing the same bytes.
pub fn overlapping_offsets(root: &Path) -> Case {
    let d = tiny_copy(root);
    let a = "model.language_model.layers.0.input_layernorm.weight";
    let b = "model.language_model.layers.0.post_attention_layernorm.weight";
    let file = shard_of(&d, a);
    assert_eq!(file, shard_of(&d, b));
    edit_shard(&d, &file, |s| {
        let o = s.header[a]["data_offsets"].clone();
        s.entry(b)["data_offsets"] = o;
    });
    Case::new(&d, root, &[&file, "overlapping data_offsets"])
}

/// Offsets that cut into the next tensor by a few bytes (partial overlap).
pub fn partially_overlapping_offsets(root: &Path) -> Case {
    let d = tiny_copy(root);
    let file = shard_of(&d, UP0);
    edit_shard(&d, &file, |s| {
        let names = s.names();
        // The tensor right after UP0 on disk starts 4 bytes earlier.
        let (_, e) = s.offsets(UP0);
        let next = names
            .iter()
            .find(|n| s.offsets(n).0 == e)
            .expect("a tensor follows")
            .clone();
        let (nb, ne) = s.offsets(&next);
        s.entry(&next)["data_offsets"] = json!([nb - 4, ne - 4]);
    });
    Case::new(&d, root, &[&file, "overlapping data_offsets"])
}

/// A dtype safetensors does not know.
pub fn unknown_dtype(root: &Path) -> Case {
    let d = tiny_copy(root);
    let file = shard_of(&d, UP0);
    edit_shard(&d, &file, |s| s.entry(UP0)["dtype"] = json!("Q4_K"));
    Case::new(&d, root, &[&file, UP0, "unknown dtype \"Q4_K\""])
}

/// A shape whose element count overflows u64 (wrapping would fake a match).
pub fn element_count_overflow(root: &Path) -> Case {
    let d = tiny_copy(root);
    let file = SHARD3;
    edit_shard(&d, file, |s| {
        let name = s
            .names()
            .into_iter()
            .find(|n| n.starts_with("mtp."))
            .expect("an mtp tensor in the last shard");
        // 2^62 * 4 elements * 32 bits wraps to 0 in u64.
        s.entry(&name)["shape"] = json!([1u64 << 62, 4]);
    });
    Case::new(&d, root, &[file, "overflows"])
}

/// The index names a shard file that is not there.
pub fn index_names_missing_shard(root: &Path) -> Case {
    let d = tiny_copy(root);
    std::fs::remove_file(d.join(SHARD2)).unwrap();
    Case::new(&d, root, &[SHARD2, "missing"])
}

/// The index maps a shard outside the checkpoint directory.
pub fn index_shard_outside_dir(root: &Path) -> Case {
    let d = tiny_copy(root);
    edit_json(&d.join("model.safetensors.index.json"), |v| {
        v["weight_map"][UP0] = json!("/etc/passwd");
    });
    Case::new(
        &d,
        root,
        &[
            "model.safetensors.index.json",
            "\"/etc/passwd\" is not a file name",
        ],
    )
}

/// A tensor listed in the index but absent from its shard's header.
pub fn index_tensor_absent_from_shard(root: &Path) -> Case {
    let d = tiny_copy(root);
    let ghost = "model.language_model.ghost.weight";
    edit_json(&d.join("model.safetensors.index.json"), |v| {
        v["weight_map"][ghost] = json!(SHARD1);
    });
    Case::new(&d, root, &["model.safetensors.index.json", ghost, SHARD1])
}

/// No config.json.
pub fn config_missing(root: &Path) -> Case {
    let d = tiny_copy(root);
    std::fs::remove_file(d.join("config.json")).unwrap();
    Case::new(&d, root, &["config.json: not found"])
}

/// config.json that is not JSON.
pub fn config_invalid_json(root: &Path) -> Case {
    let d = tiny_copy(root);
    std::fs::write(d.join("config.json"), b"{\"model_type\": \"qwen3_5\",,}").unwrap();
    Case::new(&d, root, &["config.json", "not valid JSON"])
}

/// config.json that is a JSON array.
pub fn config_not_an_object(root: &Path) -> Case {
    let d = tiny_copy(root);
    std::fs::write(d.join("config.json"), b"[1, 2]").unwrap();
    Case::new(&d, root, &["config.json", "is not a JSON object"])
}

/// A model family hsparity does not emulate.
pub fn unknown_model_type(root: &Path) -> Case {
    let d = tiny_copy(root);
    edit_json(&d.join("config.json"), |v| v["model_type"] = json!("llama"));
    Case::new(&d, root, &["config.json", "unknown model_type \"llama\""])
}

/// `text_config` given as an array (must not be read by position).
pub fn text_config_is_array(root: &Path) -> Case {
    let d = tiny_copy(root);
    edit_json(&d.join("config.json"), |v| v["text_config"] = json!([1, 2]));
    Case::new(&d, root, &["config.json", "text_config must be an object"])
}

/// `layer_types` shorter than `num_hidden_layers`.
pub fn layer_types_length_mismatch(root: &Path) -> Case {
    let d = tiny_copy(root);
    edit_text_config(&d, |t| {
        t["layer_types"].as_array_mut().unwrap().pop();
    });
    Case::new(
        &d,
        root,
        &["config.json", "text_config.layer_types has 5 entries"],
    )
}

/// A model without layers.
pub fn num_hidden_layers_zero(root: &Path) -> Case {
    let d = tiny_copy(root);
    edit_text_config(&d, |t| {
        t.insert("num_hidden_layers".into(), json!(0));
        t.insert("layer_types".into(), json!([]));
    });
    Case::new(
        &d,
        root,
        &["config.json", "text_config.num_hidden_layers = 0"],
    )
}

/// `full_attention_interval: 0` with `layer_types` derived from it.
pub fn full_attention_interval_zero(root: &Path) -> Case {
    let d = tiny_copy(root);
    edit_text_config(&d, |t| {
        t.remove("layer_types");
        t.insert("full_attention_interval".into(), json!(0));
    });
    Case::new(
        &d,
        root,
        &["config.json", "text_config.full_attention_interval = 0"],
    )
}

/// A non-positive `rms_norm_eps`.
pub fn rms_norm_eps_zero(root: &Path) -> Case {
    let d = tiny_copy(root);
    edit_text_config(&d, |t| {
        t.insert("rms_norm_eps".into(), json!(0.0));
    });
    Case::new(&d, root, &["config.json", "text_config.rms_norm_eps = 0"])
}

/// A string where a number is expected: the message names the field path.
pub fn wrong_typed_field(root: &Path) -> Case {
    let d = tiny_copy(root);
    edit_text_config(&d, |t| {
        t.insert("hidden_size".into(), json!("x"));
    });
    Case::new(
        &d,
        root,
        &["config.json: text_config.hidden_size: invalid type: string \"x\""],
    )
}

/// A nested field of the wrong type (was silently replaced by the default).
pub fn rope_theta_wrong_type(root: &Path) -> Case {
    let d = tiny_copy(root);
    edit_text_config(&d, |t| t["rope_parameters"]["rope_theta"] = json!("abc"));
    Case::new(
        &d,
        root,
        &["config.json", "text_config.rope_parameters.rope_theta"],
    )
}

/// A rope scaling hsparity does not implement.
pub fn rope_type_unsupported(root: &Path) -> Case {
    let d = tiny_copy(root);
    edit_text_config(&d, |t| t["rope_parameters"]["rope_type"] = json!("yarn"));
    Case::new(
        &d,
        root,
        &[
            "config.json",
            "unsupported rope_type \"yarn\" (hsparity implements default rope)",
        ],
    )
}

/// An activation other than SiLU.
pub fn hidden_act_unsupported(root: &Path) -> Case {
    let d = tiny_copy(root);
    edit_text_config(&d, |t| {
        t.insert("hidden_act".into(), json!("gelu"));
    });
    Case::new(
        &d,
        root,
        &["config.json", "text_config.hidden_act = \"gelu\""],
    )
}

/// `tie_word_embeddings` that is not a bool.
pub fn tie_word_embeddings_not_bool(root: &Path) -> Case {
    let d = tiny_copy(root);
    edit_json(&d.join("config.json"), |v| {
        v["tie_word_embeddings"] = json!("yes")
    });
    Case::new(&d, root, &["config.json", "tie_word_embeddings"])
}

/// Config shapes that disagree with the weights.
pub fn shape_mismatch_vs_config(root: &Path) -> Case {
    let d = tiny_copy(root);
    edit_text_config(&d, |t| {
        t.insert("intermediate_size".into(), json!(96));
    });
    Case::new(
        &d,
        root,
        &[
            "model.language_model.layers.0.mlp.gate_proj.weight",
            "[96, 64]",
            "[128, 64]",
        ],
    )
}

/// An integer tensor where a float weight is expected (same byte size).
pub fn integer_dtype_for_float_weight(root: &Path) -> Case {
    let d = tiny_copy(root);
    let file = shard_of(&d, UP0);
    edit_shard(&d, &file, |s| s.entry(UP0)["dtype"] = json!("I32"));
    Case::new(&d, root, &[&file, UP0, "I32"])
}

/// `{"input_ids": []}` in a prompts file.
pub fn empty_prompt_in_file(root: &Path) -> Case {
    let f = prompts_file(root, b"{\"input_ids\": [1, 2]}\n{\"input_ids\": []}\n");
    Case::on_fixture(root, &["prompt 1", "prompts.jsonl:2", "no tokens"])
        .arg("--prompts")
        .arg(f)
}

/// `--prompt-ids ""`.
pub fn empty_prompt_ids_flag(root: &Path) -> Case {
    Case::on_fixture(root, &["prompt 1", "--prompt-ids #2", "no tokens"])
        .arg("--prompt-ids")
        .arg("1,2")
        .arg("--prompt-ids")
        .arg("")
}

/// A prompt longer than `max_position_embeddings` (512).
pub fn prompt_too_long(root: &Path) -> Case {
    let ids: Vec<String> = (0..513).map(|i| (i % 300).to_string()).collect();
    Case::on_fixture(
        root,
        &[
            "--prompt-ids #1",
            "513 tokens",
            "max_position_embeddings = 512",
        ],
    )
    .arg("--prompt-ids")
    .arg(ids.join(","))
}

/// A token id ≥ vocab_size (384), from a prompts file.
pub fn token_id_out_of_range(root: &Path) -> Case {
    let f = prompts_file(root, b"\n{\"input_ids\": [1, 2, 384]}\n");
    Case::on_fixture(
        root,
        &[
            "prompts.jsonl:2",
            "token id 384",
            "out of range (vocab_size = 384)",
        ],
    )
    .arg("--prompts")
    .arg(f)
}

/// A prompts file that is not UTF-8.
pub fn prompts_not_utf8(root: &Path) -> Case {
    let f = prompts_file(root, b"{\"text\": \"caf\xe9\"}\n");
    Case::on_fixture(root, &["prompts.jsonl", "not UTF-8"])
        .arg("--prompts")
        .arg(f)
}

/// A JSONL line that is valid JSON but not an object.
pub fn prompts_line_not_object(root: &Path) -> Case {
    let f = prompts_file(root, b"{\"input_ids\": [1]}\n[1, 2]\n");
    Case::on_fixture(
        root,
        &["prompts.jsonl:2", "line 2: expected an object {\"text\""],
    )
    .arg("--prompts")
    .arg(f)
}

/// A JSONL line that is not JSON at all.
pub fn prompts_line_not_json(root: &Path) -> Case {
    let f = prompts_file(root, b"{\"input_ids\": [1]}\n{input_ids: 1\n");
    Case::on_fixture(root, &["prompts.jsonl:2", "not valid JSON"])
        .arg("--prompts")
        .arg(f)
}

/// `--report-dir` that is a regular file.
pub fn report_dir_is_a_file(root: &Path) -> Case {
    let f = root.join("not-a-dir");
    std::fs::write(&f, b"x").unwrap();
    let mut c = Case::on_fixture(root, &["not-a-dir"])
        .arg("--prompt-ids")
        .arg("1,2,3");
    c.report_dir = f.clone();
    c.unchanged.push((f, b"x".to_vec()));
    c
}

/// A report already there and no `--force`.
pub fn existing_report_without_force(root: &Path) -> Case {
    let c = Case::on_fixture(root, &["report.md", "--force"])
        .arg("--prompt-ids")
        .arg("1,2,3");
    let md = c.report_dir.join("r").join("report.md");
    std::fs::create_dir_all(md.parent().unwrap()).unwrap();
    std::fs::write(&md, b"old report").unwrap();
    let mut c = c;
    c.unchanged.push((md, b"old report".to_vec()));
    c
}

/// A Hub id that is not in the (empty) cache.
pub fn hub_id_not_cached(root: &Path) -> Case {
    let cache = root.join("empty-hub");
    std::fs::create_dir_all(&cache).unwrap();
    Case::new(
        "some-org/not-there",
        root,
        &["some-org/not-there", "huggingface-cli download"],
    )
    .env("HF_HUB_CACHE", cache)
}

/// `refs/main` holding a path instead of a commit hash.
pub fn hub_ref_not_a_commit(root: &Path) -> Case {
    let (cache, repo) = fake_hub(root, "org/tiny");
    std::fs::write(repo.join("refs/main"), "/etc\n").unwrap();
    Case::new(
        "org/tiny",
        root,
        &["refs/main", "expected a 40-hex commit hash"],
    )
    .env("HF_HUB_CACHE", cache)
}

/// A revision that climbs out of `refs/`.
pub fn hub_revision_escapes(root: &Path) -> Case {
    let (cache, _) = fake_hub(root, "org/tiny");
    Case::new(
        "org/tiny@../../../../etc",
        root,
        &["org/tiny@../../../../etc", "not a valid revision"],
    )
    .env("HF_HUB_CACHE", cache)
}

/// NaN/Inf in a weight: a finding (exit 1) naming the tensor, not bad input.
pub fn nan_weights(root: &Path) -> Case {
    let d = tiny_copy(root);
    poke_f32(&d, K2, &[f32::NAN, f32::INFINITY]);
    let mut c = Case::new(&d, root, &[K2, "NaN"])
        .arg("--prompt-ids")
        .arg("1,2,3,4");
    c.expect = Expect::Finding;
    c
}
