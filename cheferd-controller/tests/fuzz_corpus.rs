//! The fuzz targets (`fuzz/targets.rs`) without nightly or cargo-fuzz: every
//! committed corpus file, then a short bounded pass of seeded mutations of them (the
//! same mutations every run), through the same functions `cargo fuzz run` drives.
//! `scripts/fuzz.sh` runs the real fuzzer.

#[path = "../../fuzz/targets.rs"]
mod targets;

use std::path::PathBuf;
use std::time::Duration;

/// Mutated inputs per target in the bounded pass.
const MUTATIONS: usize = 2_000;

fn corpus(target: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = crate::util::repository().join("fuzz/corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect()
}

/// xorshift64*: deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

/// Bytes that matter to the decoders: JSON, TOML and rate punctuation, digits, the
/// protobuf varint continuation bit, a multi-byte UTF-8 start.
const INTERESTING: &[u8] = b"{}[]\":,=/.-0179eEkKMGBi \n\x00\x80\xff\xc3";

/// One libFuzzer-style mutation (or a few) of `input`, spliced with `other`.
fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
    let mut out = input.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(7) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = INTERESTING[rng.below(INTERESTING.len())];
            }
            2 => out.insert(at, INTERESTING[rng.below(INTERESTING.len())]),
            3 if at < out.len() => {
                let end = (at + 1 + rng.below(16)).min(out.len());
                out.drain(at..end);
            }
            4 if at < out.len() => {
                // Repeat a slice (what makes parsers allocate).
                let end = (at + 1 + rng.below(32)).min(out.len());
                let piece = out[at..end].to_vec();
                for _ in 0..rng.below(8) {
                    out.splice(at..at, piece.iter().copied());
                }
            }
            5 if !other.is_empty() => {
                let from = rng.below(other.len());
                let end = (from + 1 + rng.below(64)).min(other.len());
                out.splice(at..at, other[from..end].iter().copied());
            }
            _ => out.truncate(at),
        }
    }
    out
}

fn run(name: &str, body: fn(&[u8]), input: &[u8], what: &dyn Fn() -> String) {
    let result = std::panic::catch_unwind(|| body(input));
    if result.is_err() {
        panic!(
            "fuzz target {name} panicked on {} ({:?})",
            what(),
            String::from_utf8_lossy(input)
        );
    }
}

#[test]
fn every_target_has_a_corpus_and_a_fuzz_target() {
    let _turn = crate::util::together();
    let root = crate::util::repository().join("fuzz");
    for (name, _) in targets::TARGETS {
        assert!(corpus(name).len() >= 3, "corpus/{name} needs a few seeds");
        let target = root.join("fuzz_targets").join(format!("{name}.rs"));
        assert!(target.exists(), "{} is missing", target.display());
    }
}

#[test]
fn committed_corpora_pass_every_target() {
    let _turn = crate::util::together();
    for (name, body) in targets::TARGETS {
        for (path, bytes) in corpus(name) {
            run(name, *body, &bytes, &|| path.display().to_string());
        }
    }
}

#[test]
fn bounded_pseudo_random_pass() {
    let _turn = crate::util::together();
    let started = crate::util::clocks::now(libc::CLOCK_THREAD_CPUTIME_ID);
    for (t, (name, body)) in targets::TARGETS.iter().enumerate() {
        let seeds: Vec<Vec<u8>> = corpus(name).into_iter().map(|(_, b)| b).collect();
        let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ (t as u64 + 1));
        let mut input = seeds[0].clone();
        for i in 0..MUTATIONS {
            // Mostly mutate the last input further; restart from a seed now and then.
            if i % 8 == 0 {
                input = seeds[rng.below(seeds.len())].clone();
            }
            let other = &seeds[rng.below(seeds.len())];
            input = mutate(&mut rng, &input, other);
            input.truncate(64 * 1024);
            run(name, *body, &input, &|| format!("mutation {i}"));
        }
    }
    // The pass is a smoke test, not a fuzzing campaign: keep it short (debug build). Its
    // own CPU time, which other tests and processes sharing the machine do not inflate.
    let spent = crate::util::clocks::now(libc::CLOCK_THREAD_CPUTIME_ID) - started;
    assert!(
        spent < Duration::from_secs(60),
        "the bounded pass took {spent:?} of CPU"
    );
}
