//! Bounded, deterministic property tests of the safetensors header parser and
//! the shard-index reader: random bytes, mutations of valid headers, random
//! JSON for `dtype` / `shape` / `data_offsets`, random `weight_map`s. The
//! parser must return `Ok` or `Err` — never panic — and an `Ok` header never
//! describes a tensor whose bytes lie outside the file, disagree with
//! dtype × shape, or overlap another tensor.
//!
//! 256 cases per property with a fixed seed (independent of
//! `PROPTEST_RNG_SEED`/`PROPTEST_CASES`), no failure files written.

use std::path::Path;

use hsparity::checkpoint::headers::{
    checked_numel, dtype_bits, parse_header, read_header_file, HeaderIndex, ParsedHeader,
    INDEX_FILE,
};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, RngSeed};
use serde_json::{json, Map, Value};

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 256,
        rng_algorithm: RngAlgorithm::ChaCha,
        rng_seed: RngSeed::Fixed(0x6873_7061_7269_7479),
        failure_persistence: None,
        max_shrink_iters: 256,
        ..ProptestConfig::default()
    }
}

/// The guarantees of an accepted header.
fn check_accepted(p: &ParsedHeader, file_len: u64) {
    assert!(p.data_start >= 8 && p.data_start <= file_len);
    let mut spans = Vec::new();
    for t in &p.tensors {
        let (b, e) = t.data_offsets;
        assert!(b <= e, "{}: reversed range", t.name);
        let end = p.data_start.checked_add(e).expect("end overflows");
        assert!(
            end <= file_len,
            "{}: ends at {end} > file {file_len}",
            t.name
        );
        let bits = dtype_bits(&t.dtype).expect("known dtype");
        let numel = checked_numel(&t.shape).expect("numel fits");
        assert_eq!(
            u128::from(e - b) * 8,
            u128::from(numel) * u128::from(bits),
            "{}",
            t.name
        );
        assert_eq!(t.numel(), numel);
        if b < e {
            spans.push((b, e));
        }
    }
    spans.sort();
    for w in spans.windows(2) {
        assert!(w[1].0 >= w[0].1, "overlap {:?}", w);
    }
}

/// Parses `bytes` as a whole file, checks the guarantees when accepted.
fn parse_all(bytes: &[u8]) -> bool {
    let len = bytes.len() as u64;
    match parse_header(Path::new("fuzz.safetensors"), bytes, len) {
        Ok(p) => {
            check_accepted(&p, len);
            true
        }
        Err(e) => {
            let m = e.to_string();
            assert!(m.contains("fuzz.safetensors"), "error names the file: {m}");
            assert!(!m.contains('\n'), "one line: {m}");
            false
        }
    }
}

fn file_bytes(header: &[u8], data_len: usize) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header);
    v.resize(v.len() + data_len, 0);
    v
}

const DTYPES: &[&str] = &[
    "F32", "BF16", "F16", "F64", "U8", "I8", "I32", "I64", "BOOL", "F4", "F6_E2M3", "F8_E4M3",
    "C64", "Q4_K", "", "f32",
];

fn json_number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u64..200).prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        Just(Value::from(u64::MAX)),
        Just(Value::from(1u64 << 62)),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f)
            .map(Value::Number)
            .unwrap_or(Value::Null)),
    ]
}

fn json_any() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        json_number(),
        "[a-zA-Z0-9_]{0,6}".prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            vec(inner.clone(), 0..4).prop_map(Value::Array),
            vec(("[a-z_]{1,12}", inner), 0..4)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn dtype_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => proptest::sample::select(DTYPES).prop_map(Value::from),
        1 => json_any(),
    ]
}

fn shape_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => vec(0u64..6, 0..4).prop_map(|v| json!(v)),
        2 => vec(json_number(), 0..4).prop_map(Value::Array),
        1 => json_any(),
    ]
}

fn offsets_value() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => (0u64..160, 0u64..160).prop_map(|(a, b)| json!([a, b])),
        2 => vec(json_number(), 0..4).prop_map(Value::Array),
        1 => json_any(),
    ]
}

/// A valid layout: tensors with small shapes, contiguous offsets.
fn valid_header() -> impl Strategy<Value = (Map<String, Value>, usize)> {
    vec(
        (
            proptest::sample::select(&["F32", "BF16", "F16", "U8", "I64", "F64"][..]),
            vec(0usize..5, 0..3),
        ),
        0..6,
    )
    .prop_map(|ts| {
        let mut m = Map::new();
        let mut off = 0u64;
        for (i, (dtype, shape)) in ts.into_iter().enumerate() {
            let n = checked_numel(&shape).unwrap() * dtype_bits(dtype).unwrap() / 8;
            m.insert(
                format!("t{i}"),
                json!({"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}),
            );
            off += n;
        }
        m.insert("__metadata__".into(), json!({"format": "pt"}));
        (m, off as usize)
    })
}

/// One mutation of a valid file's bytes or header.
#[derive(Debug, Clone)]
enum Mutation {
    FlipByte(usize, u8),
    Truncate(usize),
    SetLength(u64),
    AddData(usize),
    SetField(usize, &'static str, Value),
    CopyOffsets(usize, usize),
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        (any::<usize>(), 1u8..=255).prop_map(|(i, x)| Mutation::FlipByte(i, x)),
        any::<usize>().prop_map(Mutation::Truncate),
        prop_oneof![any::<u64>(), 0u64..400, Just(u64::MAX)].prop_map(Mutation::SetLength),
        (0usize..64).prop_map(Mutation::AddData),
        (any::<usize>(), dtype_value()).prop_map(|(i, v)| Mutation::SetField(i, "dtype", v)),
        (any::<usize>(), shape_value()).prop_map(|(i, v)| Mutation::SetField(i, "shape", v)),
        (any::<usize>(), offsets_value()).prop_map(|(i, v)| Mutation::SetField(
            i,
            "data_offsets",
            v
        )),
        (any::<usize>(), json_any()).prop_map(|(i, v)| Mutation::SetField(i, "", v)),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Mutation::CopyOffsets(a, b)),
    ]
}

fn apply(mut header: Map<String, Value>, mut data_len: usize, muts: &[Mutation]) -> Vec<u8> {
    let names: Vec<String> = header
        .keys()
        .filter(|k| *k != "__metadata__")
        .cloned()
        .collect();
    let mut byte_muts = Vec::new();
    for m in muts {
        match m {
            Mutation::SetField(i, field, v) if !names.is_empty() => {
                let e = &mut header[&names[i % names.len()]];
                if field.is_empty() {
                    *e = v.clone();
                } else if let Some(o) = e.as_object_mut() {
                    o.insert(field.to_string(), v.clone());
                }
            }
            Mutation::CopyOffsets(a, b) if !names.is_empty() => {
                let src = header[&names[a % names.len()]].get("data_offsets").cloned();
                if let (Some(src), Some(o)) = (src, header[&names[b % names.len()]].as_object_mut())
                {
                    o.insert("data_offsets".into(), src);
                }
            }
            Mutation::AddData(n) => data_len += n,
            other => byte_muts.push(other.clone()),
        }
    }
    let mut bytes = file_bytes(
        &serde_json::to_vec(&Value::Object(header)).unwrap(),
        data_len,
    );
    for m in byte_muts {
        match m {
            Mutation::FlipByte(i, x) => {
                let n = bytes.len();
                bytes[i % n] ^= x;
            }
            Mutation::Truncate(i) => bytes.truncate(i % (bytes.len() + 1)),
            Mutation::SetLength(n) if bytes.len() >= 8 => {
                bytes[..8].copy_from_slice(&n.to_le_bytes())
            }
            _ => {}
        }
    }
    bytes
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_bytes_never_panic(bytes in vec(any::<u8>(), 0..256)) {
        parse_all(&bytes);
    }

    #[test]
    fn random_length_and_json_ish_body(n in prop_oneof![0u64..300, any::<u64>()],
                                       body in "[{}\\[\\]\":,a-zA-Z0-9_ .-]{0,200}") {
        let mut bytes = n.to_le_bytes().to_vec();
        bytes.extend_from_slice(body.as_bytes());
        parse_all(&bytes);
    }

    #[test]
    fn valid_headers_are_accepted((header, data_len) in valid_header()) {
        let bytes = apply(header, data_len, &[]);
        prop_assert!(parse_all(&bytes));
    }

    #[test]
    fn mutated_headers_never_panic_or_escape_the_file(
        (header, data_len) in valid_header(),
        muts in vec(mutation(), 1..4),
    ) {
        let bytes = apply(header, data_len, &muts);
        let in_memory = parse_all(&bytes);
        // The file-reading path agrees with the in-memory parser.
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("fuzz.safetensors");
        std::fs::write(&p, &bytes).unwrap();
        match read_header_file(&p) {
            Ok((len, parsed)) => {
                prop_assert!(in_memory);
                prop_assert_eq!(len, bytes.len() as u64);
                check_accepted(&parsed, len);
            }
            Err(_) => prop_assert!(!in_memory),
        }
    }

    #[test]
    fn random_header_entries(entries in vec((dtype_value(), shape_value(), offsets_value()), 0..5),
                             data_len in 0usize..200) {
        let mut m = Map::new();
        for (i, (d, s, o)) in entries.into_iter().enumerate() {
            m.insert(format!("t{i}"), json!({"dtype": d, "shape": s, "data_offsets": o}));
        }
        parse_all(&file_bytes(&serde_json::to_vec(&Value::Object(m)).unwrap(), data_len));
    }

    #[test]
    fn random_index_weight_maps(
        map in vec((proptest::sample::select(&["t0", "t1", "t2", "ghost", ""][..]),
                    prop_oneof![
                        4 => proptest::sample::select(&[
                            "a.safetensors", "b.safetensors", "missing.safetensors",
                            "../a.safetensors", "/etc/passwd", "", ".", "sub/a.safetensors",
                        ][..]).prop_map(Value::from),
                        1 => json_any(),
                    ]), 0..6),
        metadata in json_any(),
        raw_index in prop_oneof![Just(None), "[ -~]{0,40}".prop_map(Some)],
    ) {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        // a: t0 (F32 [2]), t1 (U8 [3]); b: t2 (BF16 [1]).
        let a = json!({"t0": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                       "t1": {"dtype": "U8", "shape": [3], "data_offsets": [8, 11]}});
        let b = json!({"t2": {"dtype": "BF16", "shape": [1], "data_offsets": [0, 2]}});
        std::fs::write(d.join("a.safetensors"), file_bytes(&serde_json::to_vec(&a).unwrap(), 11)).unwrap();
        std::fs::write(d.join("b.safetensors"), file_bytes(&serde_json::to_vec(&b).unwrap(), 2)).unwrap();
        let body = match &raw_index {
            Some(s) => s.clone().into_bytes(),
            None => {
                let wm: Map<String, Value> = map.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
                serde_json::to_vec(&json!({"metadata": metadata, "weight_map": wm})).unwrap()
            }
        };
        std::fs::write(d.join(INDEX_FILE), body).unwrap();
        match HeaderIndex::read_dir(d) {
            Ok(idx) => {
                for t in &idx.tensors {
                    let s = idx.shard_of(t);
                    prop_assert!(s.path.starts_with(d));
                    prop_assert!(s.data_start + t.data_offsets.1 <= s.file_len);
                    prop_assert!(idx.get(&t.name).is_some());
                }
                // Every name the index maps is present in the shard it names.
                let wm: Map<String, Value> = map.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
                for (k, v) in &wm {
                    let t = idx.get(k).expect("mapped tensor present");
                    prop_assert_eq!(Some(idx.shard_of(t).file_name.as_str()), v.as_str());
                }
            }
            Err(e) => {
                let m = e.to_string();
                prop_assert!(!m.contains('\n'), "one line: {}", m);
            }
        }
    }
}
