//! Unit tests of safetensors header parsing.

use super::*;

fn file(header: &str, data_len: usize) -> Vec<u8> {
    let mut v = (header.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(header.as_bytes());
    v.resize(v.len() + data_len, 0);
    v
}

fn parse(header: &str, data_len: usize) -> Result<ParsedHeader> {
    let f = file(header, data_len);
    parse_header(Path::new("x.safetensors"), &f, f.len() as u64)
}

#[test]
fn valid_header_with_empty_tensors() {
    let h = r#"{"__metadata__":{"format":"pt"},
        "a":{"dtype":"F32","shape":[25],"data_offsets":[0,100]},
        "e":{"dtype":"F32","shape":[0,3],"data_offsets":[100,100]},
        "f":{"dtype":"F32","shape":[0],"data_offsets":[100,100]},
        "b":{"dtype":"BF16","shape":[2,5],"data_offsets":[100,120]}}"#;
    let p = parse(h, 120).unwrap();
    let names: Vec<&str> = p.tensors.iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["a", "e", "f", "b"]);
    assert_eq!(p.metadata["format"], "pt");
}

#[test]
fn overlap_hidden_behind_an_empty_tensor_is_found() {
    // Sorted: a [0,100), e [10,10), c [50,60): only a non-adjacent pair overlaps.
    let h = r#"{"a":{"dtype":"U8","shape":[100],"data_offsets":[0,100]},
        "e":{"dtype":"U8","shape":[0],"data_offsets":[10,10]},
        "c":{"dtype":"U8","shape":[10],"data_offsets":[50,60]}}"#;
    let m = parse(h, 100).unwrap_err().to_string();
    assert!(
        m.contains("tensors a and c have overlapping data_offsets"),
        "{m}"
    );
    assert!(m.contains("x.safetensors"), "{m}");
}

#[test]
fn overflowing_and_inconsistent_entries() {
    let over = r#"{"m":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}"#;
    let m = parse(over, 0).unwrap_err().to_string();
    assert!(m.contains("tensor m") && m.contains("overflows"), "{m}");
    let rev = r#"{"m":{"dtype":"U8","shape":[1],"data_offsets":[5,4]}}"#;
    assert!(parse(rev, 8)
        .unwrap_err()
        .to_string()
        .contains("end before they begin"));
    let far = r#"{"m":{"dtype":"U8","shape":[1],"data_offsets":[18446744073709551614,18446744073709551615]}}"#;
    assert!(parse(far, 8)
        .unwrap_err()
        .to_string()
        .contains("data ends at byte"));
    let neg = r#"{"m":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}"#;
    assert!(parse(neg, 8)
        .unwrap_err()
        .to_string()
        .contains("invalid header entry"));
    let arr = r#"[1,2]"#;
    assert!(parse(arr, 0)
        .unwrap_err()
        .to_string()
        .contains("not a JSON object"));
    let f = file("{}", 0);
    let short = parse_header(Path::new("x"), &f[..4], 4)
        .unwrap_err()
        .to_string();
    assert!(short.contains("truncated"), "{short}");
    // bytes shorter than the header length the file claims.
    let cut = parse_header(Path::new("x"), &f[..9], f.len() as u64).unwrap_err();
    assert!(cut.to_string().contains("truncated"), "{cut}");
}

#[test]
fn index_with_bad_shard_names_or_empty_map() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // A shard beside the index, not model.safetensors (which, as in
    // transformers, would be read instead of the index).
    std::fs::write(d.join("shard.safetensors"), file("{}", 0)).unwrap();
    for (wm, want) in [
        (r#"{}"#, "weight_map is empty"),
        (
            r#"{"a": "../model.safetensors"}"#,
            "\"../model.safetensors\" is not a file name",
        ),
        (
            r#"{"a": "/etc/passwd"}"#,
            "\"/etc/passwd\" is not a file name",
        ),
        (r#"{"a": ""}"#, "\"\" is not a file name"),
        (r#"{"a": 5}"#, "not a valid shard index"),
    ] {
        std::fs::write(d.join(INDEX_FILE), format!(r#"{{"weight_map": {wm}}}"#)).unwrap();
        let m = HeaderIndex::read_dir(d).unwrap_err().to_string();
        assert!(m.contains(want) && m.contains(INDEX_FILE), "{wm}: {m}");
    }
}

#[test]
fn numel_never_wraps() {
    let t = TensorHeader {
        name: "x".into(),
        dtype: "F32".into(),
        shape: vec![1 << 62, 4],
        data_offsets: (0, 0),
        shard: 0,
    };
    assert_eq!(t.numel(), u64::MAX);
    assert_eq!(checked_numel(&[1 << 62, 4]), None);
    assert_eq!(checked_numel(&[]), Some(1));
    assert_eq!(checked_numel(&[1 << 62, 0]), Some(0));
}
