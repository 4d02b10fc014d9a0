//! `max_rate = "auto"` (`policies::capacity`) on simulated file systems: the
//! properties of the control loop over random capacities, targets, curves, noise and
//! steps, and the settings' checks.

use policies::capacity::model::{ClosedLoop, SimulatedFs};
use policies::capacity::{CapacityEstimator, Observation, Settings, SettingsError};
use proptest::prelude::*;
use proptest::test_runner::RngSeed;

/// Demand far above every capacity drawn here.
const SATURATING: f64 = 1e13;
/// Intervals given to settle before a step or a measurement.
const SETTLE: usize = 40;
/// ±10 %: "converged" and "oscillation".
const BAND: f64 = 0.10;

/// One simulated setup: a file system, its target, the loop's lag.
#[derive(Debug, Clone)]
struct Setup {
    capacity: f64,
    target_p50: f64,
    kappa: f64,
    noise: f64,
    seed: u64,
    lag: f64,
}

fn setup() -> impl Strategy<Value = Setup> {
    (
        2.0..6.0f64,   // log10 capacity: 100 … 1 M tokens/s
        -4.0..-1.0f64, // log10 target: 0.1 ms … 100 ms
        kappa(),
        prop_oneof![Just(0.0), 0.0..1.0f64], // noise, as a fraction of `max_noise`
        any::<u64>(),
        prop_oneof![Just(0.0), 0.0..0.3f64],
    )
        .prop_map(|(c, t, kappa, noise, seed, lag)| Setup {
            capacity: 10f64.powf(c),
            target_p50: 10f64.powf(t),
            kappa,
            noise: noise * max_noise(kappa),
            seed,
            lag,
        })
}

/// `κ` = target / no-load p50 − 1: a flat curve, the usual ones, and steep ones whose
/// saturation rate is within 25 % … 3 % of the rate at the target (`k` stops at 10).
fn kappa() -> impl Strategy<Value = f64> {
    prop_oneof![Just(0.25), 0.5..4.0f64, 4.0..30.0f64]
}

/// The largest noise drawn (standard deviation of the log of each measured quantile):
/// 2 % (a p50 over ~5 000 samples), and at most `κ/40`. The loop's `Max_R` jitters by
/// about `gain · noise / κ` per interval (a flat curve says little about the rate), so
/// a noisier, flatter curve cannot be held within ±10 % by any gain that still
/// converges in 10 intervals; see the module docs.
fn max_noise(kappa: f64) -> f64 {
    (kappa / 40.0).min(0.02)
}

/// A loop on `s` with floor and ceiling two decades around the capacity.
fn closed_loop(s: &Setup) -> ClosedLoop {
    let settings = Settings::new(
        Some(s.target_p50),
        None,
        s.capacity / 100.0,
        s.capacity * 100.0,
    );
    let estimator = CapacityEstimator::new(settings).unwrap();
    let fs = SimulatedFs::with_capacity(s.capacity, s.target_p50, s.kappa, s.noise, s.seed);
    let mut sim = ClosedLoop::new(fs, estimator);
    sim.lag = s.lag;
    sim
}

/// `Max_R` set after each of `n` intervals of saturating demand, divided by `capacity`.
fn saturated_rates(sim: &mut ClosedLoop, n: usize, capacity: f64) -> Vec<f64> {
    (0..n)
        .map(|_| sim.run(SATURATING).next_max_rate / capacity)
        .collect()
}

fn within_band(ratio: f64) -> bool {
    (ratio - 1.0).abs() <= BAND
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: 256,
        rng_seed: RngSeed::Fixed(20),
        ..ProptestConfig::default()
    })]

    /// After a step change of the capacity (×0.25 … ×4), `Max_R` is within ±10 % of
    /// the new rate-at-target after at most 10 intervals and stays there.
    #[test]
    fn converges_within_10_intervals_after_a_step(s in setup(), step in prop_oneof![0.25..0.9f64, 1.1..4.0f64]) {
        let mut sim = closed_loop(&s);
        saturated_rates(&mut sim, SETTLE, s.capacity);
        let capacity = s.capacity * step;
        sim.fs.set_capacity(capacity, s.target_p50);
        let rates = saturated_rates(&mut sim, 30, capacity);
        let settled = rates[9..].iter().all(|&r| within_band(r));
        prop_assert!(settled, "Max_R / capacity after the step: {:?}", rates);
    }

    /// At a constant capacity, once settled, `Max_R` stays within ±10 % of the
    /// rate-at-target for 100 intervals, whatever the noise.
    #[test]
    fn steady_state_oscillation_is_within_10_percent(s in setup()) {
        let mut sim = closed_loop(&s);
        saturated_rates(&mut sim, SETTLE, s.capacity);
        let rates = saturated_rates(&mut sim, 100, s.capacity);
        let lo = rates.iter().cloned().fold(f64::INFINITY, f64::min);
        let hi = rates.iter().cloned().fold(0.0, f64::max);
        prop_assert!(within_band(lo) && within_band(hi), "Max_R / capacity in {lo}…{hi}");
    }

    /// A capacity drop (×0.2 … ×0.8) is followed within 3 intervals: the first `Max_R`
    /// set after an interval under the lower capacity is already lower, and the third
    /// has closed at least half of the gap between the old rate and the new capacity.
    #[test]
    fn reacts_to_a_capacity_drop_within_3_intervals(s in setup(), drop in 0.2..0.8f64) {
        let mut sim = closed_loop(&s);
        saturated_rates(&mut sim, SETTLE, s.capacity);
        let before = sim.estimator.max_rate();
        let capacity = s.capacity * drop;
        sim.fs.set_capacity(capacity, s.target_p50);
        let rates: Vec<f64> = (0..3).map(|_| sim.run(SATURATING).next_max_rate).collect();
        prop_assert!(rates[0] < before, "Max_R {before} then {rates:?} for a new capacity {capacity}");
        prop_assert!(rates[2] <= capacity + 0.5 * (before - capacity),
            "Max_R {before} then {rates:?}: not half way to {capacity}");
    }

    /// Never below the floor nor above the ceiling, with floor and ceiling anywhere
    /// around the capacity, under any demand, capacity changes and lost intervals.
    #[test]
    fn stays_between_floor_and_ceiling(
        s in setup(),
        floor_ratio in 0.01..2.0f64,
        span in 1.0..50.0f64,
        demands in prop::collection::vec(prop_oneof![Just(0.0), 0.0..3.0f64, Just(1e9)], 1..60),
        capacities in prop::collection::vec(0.1..3.0f64, 1..60),
    ) {
        let floor = s.capacity * floor_ratio;
        let ceiling = floor * span;
        let settings = Settings::new(Some(s.target_p50), None, floor, ceiling);
        let estimator = CapacityEstimator::new(settings).unwrap();
        let fs = SimulatedFs::with_capacity(s.capacity, s.target_p50, s.kappa, s.noise, s.seed);
        let mut sim = ClosedLoop::new(fs, estimator);
        sim.lag = s.lag;
        for (k, demand) in demands.iter().enumerate() {
            sim.fs.set_capacity(s.capacity * capacities[k % capacities.len()], s.target_p50);
            let next = sim.run(demand * s.capacity).next_max_rate;
            prop_assert!((floor..=ceiling).contains(&next), "Max_R {next} outside [{floor}, {ceiling}]");
        }
    }

    /// Any observation at all (NaN, negative, infinite, no samples) gives a `Max_R`
    /// within `[floor, ceiling]`.
    #[test]
    fn any_observation_gives_a_rate_within_bounds(
        observations in prop::collection::vec(
            (any::<f64>(), prop::option::of(any::<f64>()), prop::option::of(any::<f64>()), any::<u64>(), any::<f64>()),
            1..30,
        ),
    ) {
        let settings = Settings::new(Some(0.002), Some(0.02), 10.0, 1e6);
        let mut estimator = CapacityEstimator::new(settings).unwrap();
        for (served, p50, p99, samples, max_rate) in observations {
            let next = estimator.update(&Observation { served, p50, p99, samples, max_rate });
            prop_assert!((10.0..=1e6).contains(&next), "Max_R {next}");
        }
    }

    /// A latency over the target never raises `Max_R`; one under it never lowers it
    /// below what was in force and used (`min(Max_R, served × (1 + headroom))`). The
    /// served rate may exceed the `Max_R` in force (a previous, higher one still applied
    /// for part of the interval).
    #[test]
    fn the_direction_follows_the_latency(
        observations in prop::collection::vec((1.0..1e5f64, 1e-4..1e-1f64, 0.5..1.5f64), 1..40),
    ) {
        let settings = Settings::new(Some(0.01), None, 1.0, 1e6);
        let headroom = settings.headroom;
        let mut estimator = CapacityEstimator::new(settings).unwrap();
        for (demand, p50, enforced) in observations {
            let max_rate = estimator.max_rate();
            let served = demand.min(max_rate * enforced);
            let next = estimator.update(&Observation { served, p50: Some(p50), p99: None, samples: 1000, max_rate });
            if p50 > 0.01 {
                prop_assert!(next <= max_rate, "p50 {p50} over target: {max_rate} → {next}");
            } else {
                let kept = max_rate.min(served * (1.0 + headroom)).max(1.0);
                prop_assert!(next >= kept * (1.0 - 1e-12), "p50 {p50} under target: {max_rate} → {next} (served {served})");
            }
        }
    }

    /// No wind-up: during 100 intervals of demand below capacity (even while the
    /// capacity grows), `Max_R` never exceeds `served × (1 + headroom)` after an
    /// interval with enough latency samples (one without holds `Max_R`);
    /// when the demand then jumps far above capacity, the p50 is more than 10 % over
    /// its target in at most 2 intervals, and `Max_R` converges within 10 (20 from a
    /// demand under 10 % of the capacity: `Max_R` grows from `served × (1 + headroom)`).
    #[test]
    fn no_wind_up_while_demand_is_below_capacity(
        s in setup(),
        low in 0.02..0.8f64,
        growth in prop_oneof![Just(1.0), 1.0..4.0f64],
    ) {
        let mut sim = closed_loop(&s);
        let headroom = sim.estimator.settings().headroom;
        let min_samples = sim.estimator.settings().min_samples;
        saturated_rates(&mut sim, SETTLE, s.capacity);
        let capacity = s.capacity * growth;
        sim.fs.set_capacity(capacity, s.target_p50);
        let demand = low * s.capacity;
        for k in 0..100 {
            let interval = sim.run(demand);
            // The first interval still runs under the saturated Max_R.
            if k > 0 && interval.served.samples >= min_samples {
                prop_assert!(interval.next_max_rate <= interval.served.rate * (1.0 + headroom) * (1.0 + 1e-9),
                    "interval {k}: Max_R {} for {} served", interval.next_max_rate, interval.served.rate);
            }
        }
        let mut over_target = 0;
        let mut rates = Vec::new();
        for _ in 0..30 {
            let interval = sim.run(SATURATING);
            // The noise alone may put a p50 a few % over: count clear overshoots.
            if interval.served.p50 > s.target_p50 * (1.0 + BAND + 4.0 * s.noise) {
                over_target += 1;
            }
            rates.push(interval.next_max_rate / capacity);
        }
        prop_assert!(over_target <= 2, "{over_target} intervals over the target; Max_R / capacity {rates:?}");
        // From a demand of ≥ 10 % of the capacity, Max_R has the 10 intervals of the
        // other properties; a lower one needs a few more doublings first.
        if demand >= 0.1 * capacity {
            prop_assert!(rates[9..].iter().all(|&r| within_band(r)), "Max_R / capacity {rates:?}");
        } else {
            prop_assert!(rates[19..].iter().all(|&r| within_band(r)), "Max_R / capacity {rates:?}");
        }
    }
}

/// From the first interval (`Max_R` = ceiling, 100 × the capacity), the loop reaches
/// the rate-at-target: the starting point is not a special case.
#[test]
fn converges_from_the_ceiling() {
    let s = Setup {
        capacity: 2_000.0,
        target_p50: 0.001,
        kappa: 1.0,
        noise: 0.01,
        seed: 3,
        lag: 0.0,
    };
    let mut sim = closed_loop(&s);
    let rates = saturated_rates(&mut sim, 30, s.capacity);
    assert!(
        rates[15..].iter().all(|&r| within_band(r)),
        "Max_R / capacity {rates:?}"
    );
}

/// With both targets, the stricter one decides.
#[test]
fn the_quantile_furthest_over_its_target_decides() {
    let fs = SimulatedFs::with_capacity(10_000.0, 0.002, 2.0, 0.0, 1);
    // A p99 target met at a lower rate than the p50 target.
    let p99 = 0.002 * 4.0;
    let capacity = fs.capacity(Some(0.002), Some(p99));
    assert!(
        capacity < 0.9 * 10_000.0,
        "the p99 target must bind, capacity {capacity}"
    );
    let settings = Settings::new(Some(0.002), Some(p99), 10.0, 1e6);
    let mut sim = ClosedLoop::new(fs, CapacityEstimator::new(settings).unwrap());
    let rates = saturated_rates(&mut sim, 40, capacity);
    assert!(
        rates[20..].iter().all(|&r| within_band(r)),
        "Max_R / capacity {rates:?}"
    );
}

/// A target far above the no-load latency (κ = 12 … 30: a steep curve, whose
/// saturation rate is within 9 % of the rate-at-target) settles within ±10 % and stays:
/// the intervals the file system limits teach the slope.
#[test]
fn a_target_far_above_the_no_load_latency_settles() {
    for kappa in [12.0, 15.0, 20.0, 30.0] {
        let s = Setup {
            capacity: 10_000.0,
            target_p50: 0.001,
            kappa,
            noise: 0.0,
            seed: 7,
            lag: 0.0,
        };
        let mut sim = closed_loop(&s);
        saturated_rates(&mut sim, SETTLE, s.capacity);
        let rates = saturated_rates(&mut sim, 40, s.capacity);
        assert!(
            rates.iter().all(|&r| within_band(r)),
            "κ {kappa}: Max_R / capacity {rates:?}"
        );
    }
}

/// A steep knee teaches `k` its upper bound; a later climb on the flat part of the
/// curve (latency half the target) brings it back: from the floor to the ceiling
/// takes at most half again as many intervals as with a fresh estimator.
#[test]
fn a_slope_learned_at_a_knee_does_not_slow_a_later_climb() {
    let settings = Settings::new(Some(0.001), None, 100.0, 10_000.0);
    let at = |served: f64, p50: f64, max_rate: f64| Observation {
        served,
        p50: Some(p50),
        p99: None,
        samples: 1000,
        max_rate,
    };
    let climb = |e: &mut CapacityEstimator| {
        let mut intervals = 0;
        while e.max_rate() < 10_000.0 && intervals < 1000 {
            let m = e.max_rate();
            e.update(&at(m, 0.0005, m));
            intervals += 1;
        }
        intervals
    };
    let mut fresh = CapacityEstimator::new(settings.clone()).unwrap();
    let mut knee = CapacityEstimator::new(settings).unwrap();
    // Intervals that Max_R bound on either side of a knee at 1 000/s: u from 1.6 to 0.4
    // for 12 % more rate.
    for (r, u) in [(1000.0, 1.6), (1120.0, 0.4)].repeat(3) {
        knee.update(&at(r, 0.001 / u, r));
    }
    // Both brought to the floor by a slow spell.
    for e in [&mut fresh, &mut knee] {
        for _ in 0..30 {
            let m = e.max_rate();
            e.update(&at(100.0, 0.01, m));
        }
        assert_eq!(e.max_rate(), 100.0);
    }
    let (fresh, knee) = (climb(&mut fresh), climb(&mut knee));
    assert!(
        2 * knee <= 3 * fresh,
        "floor to ceiling: {knee} intervals after the knee, {fresh} fresh"
    );
}

/// One interval of 10× the target latency (an outlier) costs at most `max_decrease`,
/// even on a flat curve (a small slope, where the Newton step alone would cut to
/// nothing), and normal intervals give it back: within 10 % after 3.
#[test]
fn one_slow_interval_does_not_halve_the_machine() {
    let s = Setup {
        capacity: 10_000.0,
        target_p50: 0.002,
        kappa: 0.25,
        noise: 0.0,
        seed: 1,
        lag: 0.0,
    };
    let mut sim = closed_loop(&s);
    let max_decrease = sim.estimator.settings().max_decrease;
    saturated_rates(&mut sim, SETTLE, s.capacity);
    let steady = sim.estimator.max_rate();
    let at = |p50: f64, rate: f64| Observation {
        served: rate,
        p50: Some(p50),
        p99: None,
        samples: 10_000,
        max_rate: rate,
    };
    let after_spike = sim.estimator.update(&at(10.0 * s.target_p50, steady));
    assert!(
        after_spike >= (1.0 - max_decrease) * steady * (1.0 - 1e-9),
        "{steady} → {after_spike}"
    );
    assert!(
        after_spike < steady,
        "a slow interval must lower Max_R: {steady} → {after_spike}"
    );
    let recovery = saturated_rates(&mut sim, 3, steady);
    assert!(
        within_band(recovery[2]),
        "{steady} → {after_spike} → {recovery:?} × {steady}"
    );
}

/// An interval with fewer samples than `min_samples` holds `Max_R` (until the pool
/// adds up), and so does one without latency.
#[test]
fn too_few_samples_hold_the_rate() {
    let settings = Settings::new(Some(0.002), None, 10.0, 1e6);
    let min_samples = settings.min_samples;
    let mut estimator = CapacityEstimator::new(settings).unwrap();
    let before = estimator.max_rate();
    let slow = |samples, p50| Observation {
        served: 500.0,
        p50,
        p99: None,
        samples,
        max_rate: before,
    };
    assert_eq!(estimator.update(&slow(min_samples - 1, Some(1.0))), before);
    assert_eq!(estimator.update(&slow(min_samples, None)), before);
    assert!(estimator.update(&slow(min_samples, Some(1.0))) < before);
}

/// A file system too slow to complete `min_samples` calls an interval (19, each
/// taking 8.6 s against a 2 ms target) is still throttled: its intervals are pooled
/// until their samples add up, and `Max_R` falls to the floor.
#[test]
fn intervals_short_of_min_samples_are_pooled() {
    let settings = Settings::new(Some(0.002), None, 100.0, 1e6);
    let min_samples = settings.min_samples;
    let mut estimator = CapacityEstimator::new(settings).unwrap();
    let slow = |max_rate| Observation {
        served: 19.0,
        p50: Some(8.6),
        p99: None,
        samples: min_samples - 1,
        max_rate,
    };
    assert_eq!(
        estimator.update(&slow(1e6)),
        1e6,
        "one interval says nothing"
    );
    let pooled = estimator.update(&slow(1e6));
    assert!(pooled < 1e6, "two intervals add up: Max_R {pooled}");
    for _ in 0..20 {
        estimator.update(&slow(estimator.max_rate()));
    }
    assert_eq!(estimator.max_rate(), 100.0);
}

/// A pool's quantiles are not known, only its parts': its `u` is the value closest to
/// 1 that they allow. Parts all over the target lower `Max_R` as the least slow of them
/// alone would; parts on both sides of it lower nothing; parts more than 10 intervals
/// apart are not pooled.
#[test]
fn a_pool_claims_no_more_than_its_parts_show() {
    let settings = Settings::new(Some(0.002), None, 10.0, 1e6);
    let half = settings.min_samples / 2;
    let estimator = || CapacityEstimator::new(settings.clone()).unwrap();
    let part = |p50: f64, samples: u64| Observation {
        served: 1000.0,
        p50: Some(p50),
        p99: None,
        samples,
        max_rate: 1000.0,
    };
    let alone = estimator().update(&part(0.004, 2 * half));
    let mut pool = estimator();
    pool.update(&part(0.008, half));
    assert_eq!(pool.update(&part(0.004, half)), alone);
    assert!(alone < 1000.0, "{alone}");

    let mut both_sides = estimator();
    both_sides.update(&part(0.008, half));
    assert_eq!(both_sides.update(&part(0.001, half)), 1000.0);

    let mut apart = estimator();
    apart.update(&part(0.008, half));
    for _ in 0..9 {
        apart.update(&part(0.008, 0));
    }
    assert_eq!(apart.update(&part(0.008, half)), 1e6, "11 intervals apart");
    assert!(apart.update(&part(0.008, half)) < 1000.0);
}

#[test]
fn settings_errors_name_the_bad_value() {
    let ok = Settings::new(Some(0.002), None, 100.0, 1000.0);
    assert_eq!(ok.validate(), Ok(()));
    let message = |s: Settings| s.validate().unwrap_err().to_string();
    assert_eq!(
        message(Settings {
            target_p50: Some(-0.001),
            ..ok.clone()
        }),
        "target_p50_ms must be a finite number > 0, got -1"
    );
    assert_eq!(
        message(Settings {
            target_p99: Some(f64::NAN),
            ..ok.clone()
        }),
        "target_p99_ms must be a finite number > 0, got NaN"
    );
    assert_eq!(
        Settings {
            target_p50: None,
            ..ok.clone()
        }
        .validate(),
        Err(SettingsError::NoTarget)
    );
    assert_eq!(
        message(Settings {
            floor: 2000.0,
            ..ok.clone()
        }),
        "floor must be ≤ ceiling, got floor 2000 > ceiling 1000"
    );
    assert_eq!(
        message(Settings {
            floor: 0.0,
            ..ok.clone()
        }),
        "floor must be a finite number > 0, got 0"
    );
    assert_eq!(
        message(Settings {
            ceiling: f64::INFINITY,
            ..ok.clone()
        }),
        "ceiling must be a finite number > 0, got inf"
    );
    assert_eq!(
        message(Settings {
            gain: 1.5,
            ..ok.clone()
        }),
        "gain must be a number in (0, 1], got 1.5"
    );
    assert_eq!(
        message(Settings {
            max_decrease: 1.0,
            ..ok.clone()
        }),
        "max_decrease must be a number in (0, 1), got 1"
    );
    assert_eq!(
        message(Settings {
            headroom: -1.0,
            ..ok.clone()
        }),
        "headroom must be a finite number > 0, got -1"
    );
    assert!(CapacityEstimator::new(Settings {
        initial_slope: 0.0,
        ..ok
    })
    .is_err());
}
