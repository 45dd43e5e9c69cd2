//! The whole dataplane in the simulator, seed after seed: two real
//! dataplanes (1 or 2 workers each) over a lossy, reordering, duplicating,
//! corrupting, rate-limited link, moving a random mix of WRITE, READ and
//! SEND of 0 B to 4 MiB with random TCP and MPA options; every region
//! byte and every completion checked, nothing left pinned.
//!
//! `DATAPLANE_SIM_SEEDS=N` runs N seeds (default 200);
//! `DATAPLANE_SIM_SEED=S` runs seed S alone, as a failure says to.

use dataplane_sim::Scenario;

fn env_u64(name: &str) -> Option<u64> {
    let v = std::env::var(name).ok()?;
    match v.parse() {
        Ok(n) => Some(n),
        Err(_) => panic!("{name}={v:?} is not a number"),
    }
}

#[test]
fn seeds() {
    let seeds: Vec<u64> = match env_u64("DATAPLANE_SIM_SEED") {
        Some(s) => vec![s],
        None => (1..=env_u64("DATAPLANE_SIM_SEEDS").unwrap_or(200)).collect(),
    };
    let (mut bytes, mut moved, mut completions, mut frames, mut dropped, mut rtx) =
        (0u64, 0u64, 0u64, 0u64, 0u64, 0u64);
    let mut failures = Vec::new();
    for &seed in &seeds {
        let s = Scenario::from_seed(seed);
        match s.run() {
            Ok(o) => {
                bytes += o.bytes_verified;
                moved += o.bytes_moved;
                completions += o.completions;
                frames += o.frames;
                dropped += o.dropped;
                rtx += o.retransmits;
            }
            Err(e) => {
                println!("seed {seed} failed: {e}\n  scenario: {s:?}");
                failures.push(seed);
            }
        }
    }
    println!(
        "{} seeds: {bytes} region bytes verified, {moved} bytes moved, {completions} completions, \
         {frames} frames, {dropped} dropped by the links, {rtx} retransmissions",
        seeds.len()
    );
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed: {failures:?} (DATAPLANE_SIM_SEED=S reruns one)",
        failures.len(),
        seeds.len()
    );
}

#[test]
fn a_seed_replays_exactly() {
    for seed in [7, 11] {
        let s = Scenario::from_seed(seed);
        let first = s.run().expect("first run");
        let second = s.run().expect("second run");
        assert_eq!(first, second, "seed {seed} ran differently the second time");
        assert!(first.frames > 0 && first.bytes_verified > 0);
    }
}
