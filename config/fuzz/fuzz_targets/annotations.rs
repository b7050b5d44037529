//! Fuzzes the pod annotation parser: any set of annotations (known keys with arbitrary
//! values, and arbitrary keys) must parse into values or into an error that names a key of
//! the input, never panic.

#![no_main]

use std::collections::HashMap;

use libfuzzer_sys::fuzz_target;
use vmlet_config::{PodAnnotations, ANNOTATION_KEYS};

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut annotations = HashMap::new();
    // Lines "N=value" use known key N (mod the table's size); "key\tvalue" any key; a
    // literal "\n" in a value is a newline (multi-line YAML for VirtletLibvirtCPUSetting).
    for line in text.lines() {
        if let Some((key, value)) = line.split_once('\t') {
            annotations.insert(key.to_owned(), value.replace("\\n", "\n"));
        } else if let Some((index, value)) = line.split_once('=') {
            let index = index
                .bytes()
                .fold(0usize, |a, b| a.wrapping_add(b as usize));
            let key = ANNOTATION_KEYS[index % ANNOTATION_KEYS.len()].0;
            annotations.insert(key.to_owned(), value.replace("\\n", "\n"));
        }
    }
    let allowed: Vec<String> = ANNOTATION_KEYS
        .iter()
        .take(data.first().map_or(ANNOTATION_KEYS.len(), |b| {
            *b as usize % (ANNOTATION_KEYS.len() + 1)
        }))
        .map(|(k, _)| k.to_string())
        .collect();
    if let Err(e) = PodAnnotations::from_map(&annotations, &allowed) {
        let message = e.to_string();
        assert!(
            annotations.keys().any(|k| message.contains(k.as_str())),
            "error names no key of the input: {message}"
        );
    }
});
