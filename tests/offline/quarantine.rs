//! `kipam offline` over random sequences of creates, deletes, re-creates, moves, pool edits
//! and clock steps, each step a fresh run reading the state file the last one wrote: no
//! address is held twice in one address space of a datacenter (across pools), nothing
//! released goes to another cluster before its pool datacenter's `reuseAfter` has passed, and
//! a cluster re-created within it gets its old addresses back.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use kipam::offline::OfflineOptions;
use proptest::prelude::*;

use super::{Workdir, run_in_process};

const CLUSTERS: usize = 6;

/// What the pools of a step look like, beyond [`pools`]'s three.
#[derive(Clone, Copy, Debug, Default)]
struct Extras {
    /// `lb` excludes 10.5.0.0-10.5.0.1 in dc-1 (refused while someone holds them).
    exclude: bool,
    /// Pool `gw` (default space, no quarantine) over 10.5.0.0/28 with its gateway 10.5.0.1.
    gateway: bool,
    /// Pool `keep` (`reclaimPolicy: Retain`, its own space `vrf-c`) over 10.5.0.0/28.
    retain: bool,
}

/// [`pools`] with [`Extras`].
fn pools_with(big: bool, x: Extras) -> String {
    let mut out = pools(big);
    if x.exclude {
        out = out.replacen(
            "poolCidr: 10.5.0.0/27, allocationRange: 3,",
            "poolCidr: 10.5.0.0/27, excludeRanges: [10.5.0.0-10.5.0.1], allocationRange: 3,",
            1,
        );
        out = out.replacen(
            "poolCidr: 10.5.0.0/27, allocationRange: 5,",
            "poolCidr: 10.5.0.0/27, excludeRanges: [10.5.0.0-10.5.0.1], allocationRange: 5,",
            1,
        );
    }
    if x.gateway {
        out.push_str("---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: gw}\nspec:\n  datacenters:\n    dc-1: {type: range, poolCidr: 10.5.0.0/28, allocationRange: 2, excludeRanges: [10.5.0.1], network: {gateway: 10.5.0.1}}\n");
    }
    if x.retain {
        out.push_str("---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: keep}\nspec:\n  addressSpace: vrf-c\n  reclaimPolicy: Retain\n  datacenters:\n    dc-1: {type: range, poolCidr: 10.5.0.0/28, allocationRange: 2}\n");
    }
    out
}

/// `lb` and `vip` share the default space of dc-1 (and quarantine an hour); `vrf` reuses the
/// network in its own space. `big` makes `lb` ask for more.
fn pools(big: bool) -> String {
    let lb = if big { 5 } else { 3 };
    format!(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {{name: lb}}\nspec:\n  datacenters:\n    dc-1: {{type: range, poolCidr: 10.5.0.0/27, allocationRange: {lb}, reuseAfter: 1h}}\n    dc-2: {{type: range, poolCidr: 10.6.0.0/28, allocationRange: 2, reuseAfter: 1h}}\n---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {{name: vip}}\nspec:\n  datacenters:\n    dc-1: {{type: prefix, poolCidr: 10.5.0.0/28, allocationPrefix: 30, reuseAfter: 1h}}\n---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {{name: vrf}}\nspec:\n  addressSpace: vrf-b\n  datacenters:\n    dc-1: {{type: range, poolCidr: 10.5.0.0/28, allocationRange: 2, reuseAfter: 30m}}\n"
    )
}

fn space(pool: &str) -> &'static str {
    match pool {
        "vrf" => "vrf-b",
        "keep" => "vrf-c",
        _ => "",
    }
}

fn reuse_after(pool: &str) -> i64 {
    match pool {
        "vrf" => 1800,
        "lb" | "vip" => 3600,
        _ => 0,
    }
}

#[derive(Clone, Debug)]
enum Event {
    Add {
        c: usize,
        dc: usize,
    },
    Remove {
        c: usize,
    },
    Move {
        c: usize,
        dc: usize,
    },
    Resize {
        big: bool,
    },
    Tick {
        minutes: i64,
    },
    /// The edits of [`Extras`]; only [`edits`] draws them.
    Exclude {
        on: bool,
    },
    Gateway {
        on: bool,
    },
    Retain {
        on: bool,
    },
}

/// [`event`] and the edits that once ended a quarantine early: an exclusion over quarantined
/// addresses, a gateway pool coming and going, a `Retain` pool of another space deleted.
fn edit() -> impl Strategy<Value = Event> {
    prop_oneof![
        8 => event(),
        1 => any::<bool>().prop_map(|on| Event::Exclude { on }),
        1 => any::<bool>().prop_map(|on| Event::Gateway { on }),
        1 => any::<bool>().prop_map(|on| Event::Retain { on }),
    ]
}

fn event() -> impl Strategy<Value = Event> {
    prop_oneof![
        4 => (0..CLUSTERS, 0..2usize).prop_map(|(c, dc)| Event::Add { c, dc }),
        2 => (0..CLUSTERS).prop_map(|c| Event::Remove { c }),
        1 => (0..CLUSTERS, 0..2usize).prop_map(|(c, dc)| Event::Move { c, dc }),
        1 => any::<bool>().prop_map(|big| Event::Resize { big }),
        3 => (1..45i64).prop_map(|minutes| Event::Tick { minutes }),
    ]
}

fn time(seconds: i64) -> String {
    kipam::offline::quarantine::time_text(seconds)
}

/// The network of a pool datacenter of [`pools`] as (first address, size).
fn network(pool: &str, dc: &str) -> Option<(u128, u128)> {
    let at = |a: [u8; 4]| u128::from(u32::from(std::net::Ipv4Addr::from(a)));
    match (pool, dc) {
        ("lb", "dc-1") => Some((at([10, 5, 0, 0]), 32)),
        ("lb", "dc-2") => Some((at([10, 6, 0, 0]), 16)),
        ("vip" | "vrf", "dc-1") => Some((at([10, 5, 0, 0]), 16)),
        _ => None,
    }
}

/// The addresses of `pool` in `dc` that `cluster` could still be given after `plan` (whose
/// allocations are `next`): held by nobody else of the address space (nor by `cluster`
/// through another pool), quarantined for nobody but `cluster` in this very pool.
fn room_for(
    plan: &kipam::planner::Plan,
    next: &Holdings,
    pool: &str,
    dc: &str,
    cluster: &str,
) -> BTreeSet<u128> {
    let Some((first, size)) = network(pool, dc) else {
        return BTreeSet::new();
    };
    let mut room: BTreeSet<u128> = (first..first + size).collect();
    for ((sp, d, a), (c, p)) in next {
        if sp == space(pool) && d == dc && !(c == cluster && p == pool) {
            room.remove(a);
        }
    }
    for q in &plan.quarantined {
        if space(&q.pool) != space(pool)
            || q.datacenter != dc
            || (q.holder == cluster && q.pool == pool)
        {
            continue;
        }
        for r in &q.addresses {
            for a in r.first()..=r.last() {
                room.remove(&a);
            }
        }
    }
    room
}

/// Whether `room` holds what a cluster asks of `pool` in `dc`: `lb`'s and `vrf`'s addresses,
/// `vip`'s aligned /30.
fn fits(pool: &str, dc: &str, big: bool, room: &BTreeSet<u128>) -> bool {
    match (pool, dc) {
        ("lb", "dc-1") => room.len() >= if big { 5 } else { 3 },
        ("vip", _) => network(pool, dc).is_some_and(|(first, size)| {
            (first..first + size)
                .step_by(4)
                .any(|s| (s..s + 4).all(|a| room.contains(&a)))
        }),
        _ => room.len() >= 2,
    }
}

/// IPv4 addresses as runs, for messages: `10.9.0.0-10.9.0.3, 10.9.0.8`.
fn shown(addresses: &BTreeSet<u128>) -> String {
    let ip = |a: u128| std::net::Ipv4Addr::from(a as u32).to_string();
    let mut runs: Vec<(u128, u128)> = Vec::new();
    for &a in addresses {
        match runs.last_mut() {
            Some((_, last)) if *last + 1 == a => *last = a,
            _ => runs.push((a, a)),
        }
    }
    let runs: Vec<String> = runs
        .into_iter()
        .map(|(f, l)| {
            if f == l {
                ip(f)
            } else {
                format!("{}-{}", ip(f), ip(l))
            }
        })
        .collect();
    format!("[{}]", runs.join(", "))
}

/// A removed cluster: its datacenter, when, and pool -> the addresses it held.
type Gone = (String, i64, BTreeMap<String, BTreeSet<u128>>);

/// (space, dc, address) -> (cluster, pool) of what the state holds.
type Holdings = BTreeMap<(String, String, u128), (String, String)>;

/// Runs `events`; returns how many times a re-created cluster was refused in a pool it held
/// (each checked to be a full pool).
fn run_events(events: &[Event], w: &Workdir) -> Result<usize, TestCaseError> {
    let mut refusals = 0;
    let mut clusters: BTreeMap<String, &str> = BTreeMap::new();
    let mut big = false;
    let mut extras = Extras::default();
    // Once the extras came into play, a re-created cluster may rightly miss some of its old
    // addresses (excluded now, a gateway, held in another space by an allocation a deleted
    // `Retain` pool keeps): check 3 is left out, checks 1 and 2 (the promise) stay.
    let mut touched = false;
    let mut now = 1_800_000_000i64;
    let mut held: Holdings = BTreeMap::new();
    // (space, dc, address) -> (former holder, released at, reuseAfter)
    let mut released: BTreeMap<(String, String, u128), (String, i64, i64)> = BTreeMap::new();
    // cluster -> (dc, removed at, pool -> addresses)
    let mut gone: BTreeMap<String, Gone> = BTreeMap::new();
    let state = w.path("state.yaml");
    for (step, e) in events.iter().enumerate() {
        let name = |c: &usize| format!("c{c}");
        match e {
            Event::Add { c, dc } => {
                clusters.entry(name(c)).or_insert(["dc-1", "dc-2"][*dc]);
            }
            Event::Remove { c } => {
                if let Some(dc) = clusters.remove(&name(c)) {
                    let mut mine: BTreeMap<String, BTreeSet<u128>> = BTreeMap::new();
                    for ((_, d, a), (holder, pool)) in &held {
                        if *holder == name(c) && d == dc {
                            mine.entry(pool.clone()).or_default().insert(*a);
                        }
                    }
                    gone.insert(name(c), (dc.to_string(), now, mine));
                }
            }
            Event::Move { c, dc } => {
                if let Some(x) = clusters.get_mut(&name(c)) {
                    *x = ["dc-1", "dc-2"][*dc];
                }
            }
            Event::Resize { big: b } => big = *b,
            Event::Tick { minutes } => now += minutes * 60,
            Event::Exclude { on } => extras.exclude = *on,
            Event::Gateway { on } => extras.gateway = *on,
            Event::Retain { on } => extras.retain = *on,
        }
        touched |= extras.exclude || extras.gateway || extras.retain;
        let mut manifests = pools_with(big, extras);
        for (c, dc) in &clusters {
            manifests.push_str(&format!(
                "---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: Cluster\nmetadata: {{name: {c}}}\nspec: {{datacenter: {dc}}}\n"
            ));
        }
        let file = w.write("in.yaml", &manifests);
        let options = OfflineOptions {
            files: vec![file],
            state: state.clone(),
            now: time(now),
            allow_release: true,
            allow_empty_state: false,
        };
        let report = 'run: {
            match run_in_process(&options) {
                // An exclusion over held addresses, or a gateway someone holds, is refused,
                // and nothing is written: the edit is taken back, as its author would.
                Err(kipam::offline::OfflineError::Invalid(why))
                    if matches!(e, Event::Exclude { on: true }) =>
                {
                    prop_assert!(
                        why.iter().all(|f| f.field.contains("excludeRanges")),
                        "step {step}: {why:?}"
                    );
                    break 'run Err(None);
                }
                Err(kipam::offline::OfflineError::Clash { messages, .. })
                    if matches!(e, Event::Gateway { on: true }) =>
                {
                    prop_assert!(
                        messages
                            .iter()
                            .all(|m| m.contains("the gateway of pool gw")),
                        "step {step}: {messages:?}"
                    );
                    break 'run Err(None);
                }
                other => other.map_err(Some),
            }
        };
        let report = match report {
            Ok(r) => r,
            Err(None) => {
                match e {
                    Event::Gateway { .. } => extras.gateway = false,
                    _ => extras.exclude = false,
                }
                continue;
            }
            Err(Some(e)) => return Err(TestCaseError::fail(format!("step {step}: {e}"))),
        };

        // 1. One holder per address in each space of a datacenter.
        let mut next: Holdings = BTreeMap::new();
        for obj in &report.allocations {
            let s = kipam::validation::stored_allocation(obj).expect("state reads");
            let Some(h) = s.held else { continue };
            for r in h.ranges() {
                for a in r.first()..=r.last() {
                    let key = (space(&s.pool).to_string(), s.datacenter.clone(), a);
                    if let Some(other) =
                        next.insert(key.clone(), (s.cluster.clone(), s.pool.clone()))
                    {
                        prop_assert!(
                            false,
                            "step {} ({:?}): {:?} held by {:?} and {}/{}",
                            step,
                            e,
                            key,
                            other,
                            s.cluster,
                            s.pool
                        );
                    }
                }
            }
        }
        // 2. Nothing released goes to another holder before its quarantine ends.
        for (key, (c, p)) in &next {
            if let Some((former, at, period)) = released.get(key)
                && former != c
                && now < at + period
            {
                prop_assert!(
                    false,
                    "step {} ({:?}): {:?} released by {} at {} handed to {}/{} at {}",
                    step,
                    e,
                    key,
                    former,
                    at,
                    c,
                    p,
                    now
                );
            }
        }
        for (key, (c, p)) in &held {
            if next.get(key).is_none_or(|(h, _)| h != c) {
                released.insert(key.clone(), (c.clone(), now, reuse_after(p)));
            }
        }
        for (key, (c, _)) in &next {
            if released.get(key).is_some_and(|(f, _, _)| f == c) {
                released.remove(key);
            }
        }
        // 3. A cluster re-created within the period gets its addresses back.
        if let Event::Add { c, .. } = e
            && !touched
            && let Some((dc, at, mine)) = gone.remove(&name(c))
            && clusters.get(&name(c)) == Some(&dc.as_str())
        {
            for (p, old) in &mine {
                if now >= at + reuse_after(p) {
                    continue;
                }
                let now_held: BTreeSet<u128> = next
                    .iter()
                    .filter(|((_, d, _), (h, pp))| *d == dc && *h == name(c) && pp == p)
                    .map(|((_, _, a), _)| *a)
                    .collect();
                if now_held.is_empty() {
                    // Refused: only when even its own quarantined addresses and all that is
                    // free in the space leave no room for what it asks.
                    refusals += 1;
                    let room = room_for(&report.plan, &next, p, &dc, &name(c));
                    prop_assert!(
                        !fits(p, &dc, big, &room),
                        "step {} ({:?}): {} re-created in {} was refused in {} though {} were free for it (it held {})",
                        step,
                        e,
                        name(c),
                        dc,
                        p,
                        shown(&room),
                        shown(old)
                    );
                    continue;
                }
                prop_assert!(
                    now_held.is_subset(old) || old.is_subset(&now_held),
                    "step {} ({:?}): {} got {:?} in {} instead of its old {:?}",
                    step,
                    e,
                    name(c),
                    now_held,
                    p,
                    old
                );
            }
        }
        held = next;
    }
    Ok(refusals)
}

/// The work directory `name` of one case: in memory (`/dev/shm`) where the machine has it, as
/// each step syncs the state file to its disk, which costs far more than the run itself.
fn workdir(name: &str) -> Workdir {
    let shm = Path::new("/dev/shm");
    if !shm.is_dir() {
        return Workdir::new(name);
    }
    let dir = shm.join(format!("kipam-test-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    match std::fs::create_dir_all(&dir) {
        Ok(()) => Workdir(dir),
        Err(_) => Workdir::new(name),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn offline_runs_keep_quarantine_and_address_spaces(events in proptest::collection::vec(event(), 1..30)) {
        let w = workdir("quarantine-prop");
        run_events(&events, &w)?;
    }

    #[test]
    fn exclusions_gateways_and_retain_pools_end_no_quarantine_early(events in proptest::collection::vec(edit(), 1..30)) {
        let w = workdir("quarantine-edits");
        run_events(&events, &w)?;
    }
}

/// The refusal the property above allows, shown to happen and to pass its check: six
/// clusters fill dc-1's default space; c0 goes, `lb` grows to 5 addresses a cluster, c0 comes
/// back within the hour. Its own 3 quarantined addresses are not enough and nothing else is
/// free: it is refused, and the check finds no room it could have had.
#[test]
fn a_former_holder_asking_more_than_a_full_pool_has_is_refused() {
    let mut events: Vec<Event> = (0..CLUSTERS).map(|c| Event::Add { c, dc: 0 }).collect();
    events.extend([
        Event::Remove { c: 0 },
        Event::Resize { big: true },
        Event::Tick { minutes: 10 },
        Event::Add { c: 0, dc: 0 },
    ]);
    match run_events(&events, &workdir("quarantine-full")) {
        Ok(refusals) => assert!(refusals > 0, "c0 was not refused: the pool had room"),
        Err(e) => panic!("{e}"),
    }
}

/// Two releases by one cluster from one pool in the same second (a shrink, then the
/// cluster's deletion) are one quarantine entry: the second must not overwrite the first.
/// Proptest's case `cf65dbee…` in `proptest-regressions/quarantine.txt`, named.
#[test]
fn two_releases_of_one_cluster_in_one_second_are_both_quarantined() {
    let events = [
        Event::Add { c: 2, dc: 0 },
        Event::Resize { big: true },
        Event::Resize { big: false },
        Event::Remove { c: 2 },
        Event::Add { c: 2, dc: 0 },
        Event::Remove { c: 2 },
        Event::Add { c: 0, dc: 0 },
    ];
    if let Err(e) = run_events(&events, &workdir("quarantine-same-second")) {
        panic!("{e}");
    }
}
