use super::lookup::{Query, answer};
use super::map::{CellState, address_map};
use super::view::{detail, lookup_view, pool_summary};
use super::*;
use crate::resources::IPAMPool;

fn pool(yaml: &str) -> IPAMPool {
    serde_saphyr::from_str(yaml).expect("pool")
}

fn v4_pool() -> IPAMPool {
    pool(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: lb}\nspec:\n  datacenters:\n    dc1: {type: range, poolCidr: 10.0.0.0/24, allocationRange: 8, excludeRanges: [10.0.0.8-10.0.0.15]}\n",
    )
}

fn v6_pool() -> IPAMPool {
    pool(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: nodes}\nspec:\n  datacenters:\n    dc1: {type: prefix, poolCidr: \"2001:db8::/48\", allocationPrefix: 64}\n",
    )
}

fn holding(cluster: &str, pool: &str, ranges: &[&str]) -> Holding {
    let ranges: Vec<AddrRange> = ranges
        .iter()
        .map(|r| AddrRange::parse_lenient(r).unwrap())
        .collect();
    Holding {
        cluster: cluster.into(),
        namespace: format!("cluster-{cluster}"),
        pool: pool.into(),
        datacenter: "dc1".into(),
        addresses: ranges
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        ranges,
        phase: AllocationPhase::Allocated,
        message: String::new(),
        unreadable: None,
    }
}

#[test]
fn usage_is_exact_and_adds_up() {
    let p = v4_pool();
    let dc = &pool_dcs(&p)[0];
    let a = holding("a", "lb", &["10.0.0.0-10.0.0.7"]);
    let b = holding("b", "lb", &["10.0.0.16-10.0.0.23", "10.0.0.40-10.0.0.47"]);
    let hs = [&a, &b];
    let layout = Layout::build(dc, &hs).unwrap();
    let u = layout.usage(&hs);
    assert_eq!(u.total.to_string(), "256");
    assert_eq!(u.allocated.to_string(), "24");
    assert_eq!(u.excluded.to_string(), "8");
    assert_eq!(u.free.to_string(), "224");
    assert_eq!(u.quarantined.to_string(), "0");
    // Free runs: .24-.39 (16) and .48-.255 (208).
    assert_eq!(u.largest_free_block.to_string(), "208");
    assert_eq!(u.fragmentation_percent, 7); // floor(100 * 16 / 224)
    assert_eq!(u.holders, 2);
}

#[test]
fn overlapping_holders_are_both_marked_and_never_counted_twice() {
    let p = v4_pool();
    let dc = &pool_dcs(&p)[0];
    let a = holding("a", "lb", &["10.0.0.0-10.0.0.7"]);
    let b = holding("b", "lb", &["10.0.0.4-10.0.0.5"]);
    let c = holding("c", "lb", &["10.0.0.30"]);
    let hs = [&a, &b, &c];
    let layout = Layout::build(dc, &hs).unwrap();
    assert_eq!(layout.overlapping, BTreeSet::from([0, 1]));
    assert_eq!(layout.usage(&hs).allocated.to_string(), "9");
    // An allocation over an exclusion counts as allocated, not twice.
    let d = holding("d", "lb", &["10.0.0.8-10.0.0.9"]);
    let hs = [&d];
    let u = Layout::build(dc, &hs).unwrap().usage(&hs);
    assert_eq!(
        (u.allocated.to_string(), u.excluded.to_string()),
        ("2".into(), "6".into())
    );
}

#[test]
fn a_v4_24_maps_one_address_per_cell() {
    let p = v4_pool();
    let dc = &pool_dcs(&p)[0];
    let a = holding("a", "lb", &["10.0.0.0-10.0.0.7"]);
    let hs = [&a];
    let layout = Layout::build(dc, &hs).unwrap();
    let map = address_map(&layout, layout.cidrs[0].0, layout.cidrs[0].1).unwrap();
    assert_eq!(map.cells.len(), 256);
    assert_eq!(map.step, 1);
    assert_eq!(map.cells[0].state, CellState::Allocated);
    assert_eq!(map.cells[0].holder, Some(0));
    assert_eq!(map.cells[8].state, CellState::Excluded);
    assert_eq!(map.cells[16].state, CellState::Free);
}

#[test]
fn a_v6_48_maps_into_256_cells_and_zooms() {
    let p = v6_pool();
    let dc = &pool_dcs(&p)[0];
    let a = holding("a", "nodes", &["2001:db8::/64"]);
    let b = holding("b", "nodes", &["2001:db8:0:1::/64"]);
    let far = holding("far", "nodes", &["2001:db8:0:ff00::/56"]);
    let hs = [&a, &b, &far];
    let layout = Layout::build(dc, &hs).unwrap();
    let map = address_map(&layout, layout.cidrs[0].0, layout.cidrs[0].1).unwrap();
    assert_eq!(map.cells.len(), 256);
    assert_eq!(map.step, 1u128 << 72);
    assert_eq!(map.cells[0].state, CellState::Partial);
    assert_eq!(map.cells[0].holders, 2);
    assert_eq!(map.cells[1].state, CellState::Free);
    // 2001:db8:0:ff00::/56 is exactly cell 255.
    assert_eq!(map.cells[255].state, CellState::Allocated);
    assert_eq!(map.cells[255].holder, Some(2));
    // Zoom into cell 0: 256 /64s, the first two held.
    let z = address_map(&layout, map.cells[0].first, map.cells[0].last).unwrap();
    assert_eq!(z.step, 1u128 << 64);
    assert_eq!(z.cells[0].holder, Some(0));
    assert_eq!(z.cells[1].holder, Some(1));
    assert_eq!(z.cells[0].state, CellState::Allocated);
    assert_eq!(z.cells[2].state, CellState::Free);
    // A slice outside the pool is refused with the pool named.
    let e = address_map(&layout, 0, 5).unwrap_err();
    assert!(
        e.to_string()
            .contains("2001:db8::-2001:db8:0:ffff:ffff:ffff:ffff:ffff"),
        "{e}"
    );
}

#[test]
fn the_whole_v6_space_maps_without_overflow() {
    let p = pool(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: all}\nspec:\n  datacenters:\n    dc1: {type: prefix, poolCidr: \"::/0\", allocationPrefix: 64}\n",
    );
    let dc = &pool_dcs(&p)[0];
    let a = holding("a", "all", &["ffff:ffff:ffff:ffff::/64"]);
    let hs = [&a];
    let layout = Layout::build(dc, &hs).unwrap();
    let u = layout.usage(&hs);
    assert_eq!(u.total, AddressCount::pow2(128));
    let map = address_map(&layout, 0, u128::MAX).unwrap();
    assert_eq!(map.cells.len(), 256);
    assert_eq!(map.cells[255].last, u128::MAX);
    assert_eq!(map.cells[255].state, CellState::Partial);
}

#[test]
fn lookup_names_the_holder_or_says_excluded_or_free() {
    let p = v4_pool();
    let dc = &pool_dcs(&p)[0];
    let a = holding("a", "lb", &["10.0.0.0-10.0.0.7"]);
    let hs = [&a];
    let ask = |q: &str| {
        let q = Query::parse(q).unwrap();
        let m = answer(&q, dc, &hs).into_iter().collect::<Vec<_>>();
        lookup_view(&q, &m)
    };
    let held = ask("10.0.0.3");
    assert_eq!(held.matches[0].state, "allocated");
    assert_eq!(held.matches[0].holders[0].cluster, "a");
    assert_eq!(held.message, "10.0.0.3 is held by a (pool lb in dc1)");
    assert_eq!(ask("10.0.0.9").matches[0].state, "excluded");
    assert_eq!(ask("10.0.0.200").matches[0].state, "free");
    let cidr = ask("10.0.0.0/28");
    assert_eq!(cidr.matches[0].state, "partial");
    assert_eq!(cidr.matches[0].allocated, "8");
    assert_eq!(cidr.matches[0].excluded, "8");
    let wide = ask("10.0.0.0/16");
    assert_eq!(wide.matches[0].range, "10.0.0.0-10.0.0.255");
    assert_eq!(wide.matches[0].state, "partial");
    assert!(ask("192.168.1.1").matches.is_empty());
    assert_eq!(ask("192.168.1.1").message, "no pool covers 192.168.1.1");
    for bad in ["", "10.0.0.300", "10.0.0.1/24", "cluster-a"] {
        let e = Query::parse(bad).unwrap_err();
        assert!(e.starts_with("address:"), "{bad}: {e}");
    }
}

#[test]
fn failed_and_overlapping_holders_come_first() {
    let p = v4_pool();
    let dc = &pool_dcs(&p)[0];
    let a = holding("a", "lb", &["10.0.0.0-10.0.0.7"]);
    let mut f = holding("f", "lb", &[]);
    f.phase = AllocationPhase::Failed;
    f.message = "pool lb is exhausted".into();
    let hs = [&a, &f];
    let (d, _) = detail(dc, &hs, None, Vec::new()).unwrap();
    assert_eq!(d.holders[0].cluster, "f");
    assert_eq!(d.holders[0].attention.as_deref(), Some("Failed"));
    assert_eq!(d.holders[1].cluster, "a");
    let s = pool_summary(&p, &pool_dcs(&p), &[a.clone(), f.clone()]);
    assert_eq!(s.datacenters[0].attention, 1);
}

#[test]
fn holding_reads_what_the_allocation_stores() {
    let spec = crate::resources::IPAMAllocationSpec {
        type_: AllocationType::Range,
        dc: "dc1".into(),
        cidr: None,
        addresses: vec!["10.0.0.0-10.0.0.7".into(), "nonsense".into()],
    };
    let h = Holding::of("cluster-a", "lb", &spec, None);
    assert_eq!(h.cluster, "a");
    assert_eq!(h.ranges.len(), 1);
    assert_eq!(h.attention(), Some("Unreadable"));
}

#[test]
fn json_in_html_cannot_close_the_script_element() {
    let text = html::json_for_html(&serde_json::json!({"name": "</script><b>&"})).unwrap();
    assert!(
        !text.contains('<') && !text.contains('>') && !text.contains('&'),
        "{text}"
    );
    let back: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(back["name"], "</script><b>&");
    let page = html::offline(&serde_json::json!({"x": "</script>"}).to_string());
    assert_eq!(
        page.matches("</script>").count(),
        2,
        "the data block and the app only"
    );
    assert!(
        !html::served().contains("<script>"),
        "no inline script when served"
    );
    assert!(
        !html::served().contains("<style"),
        "no inline style when served"
    );
}

fn multi_pool() -> IPAMPool {
    pool(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: lb}\nspec:\n  datacenters:\n    dc1: {type: range, poolCidr: 10.0.0.0/24, allocationRange: 8, additionalCidrs: [10.9.0.0/28, 10.5.0.0/24], excludeRanges: [10.9.0.14-10.9.0.15]}\n",
    )
}

#[test]
fn figures_add_up_over_every_cidr_and_each_cidr_has_its_own() {
    let p = multi_pool();
    let dc = &pool_dcs(&p)[0];
    assert_eq!(dc.cidrs_short(), "10.0.0.0/24 +2");
    let a = holding("a", "lb", &["10.0.0.0-10.0.0.7"]);
    let b = holding("b", "lb", &["10.9.0.0-10.9.0.7"]);
    let hs = [&a, &b];
    let layout = Layout::build(dc, &hs).unwrap();
    let u = layout.usage(&hs);
    assert_eq!(u.total.to_string(), "528"); // 256 + 16 + 256
    assert_eq!(u.allocated.to_string(), "16");
    assert_eq!(u.excluded.to_string(), "2");
    assert_eq!(u.free.to_string(), "510");
    // The largest free run never crosses from one CIDR to the next.
    assert_eq!(u.largest_free_block.to_string(), "256");
    let s = pool_summary(&p, &pool_dcs(&p), &[a.clone(), b.clone()]);
    assert_eq!(s.datacenters[0].cidr, "10.0.0.0/24 +2");
    assert_eq!(
        s.datacenters[0].cidrs,
        ["10.0.0.0/24", "10.9.0.0/28", "10.5.0.0/24"]
    );
    assert_eq!(s.datacenters[0].usage.as_ref().unwrap().allocated, "16");
    // The detail lists the CIDRs in fill order with their figures; the map shows the first,
    // and a slice of any other CIDR maps too.
    let (d, _) = detail(dc, &hs, None, Vec::new()).unwrap();
    let cidrs: Vec<_> = d.cidrs.iter().map(|c| c.cidr.as_str()).collect();
    assert_eq!(cidrs, ["10.0.0.0/24", "10.9.0.0/28", "10.5.0.0/24"]);
    assert_eq!(d.cidrs[1].usage.allocated, "8");
    assert_eq!(d.cidrs[1].usage.excluded, "2");
    assert_eq!(d.cidrs[1].usage.free, "6");
    assert_eq!(d.cidrs[1].usage.holders, 1);
    assert_eq!(d.map.first, "10.0.0.0");
    let second = (layout.cidrs[1].0, layout.cidrs[1].1);
    let (d2, _) = detail(dc, &hs, Some(second), Vec::new()).unwrap();
    assert_eq!(d2.map.cells.len(), 16);
    assert_eq!(d2.map.cells[0].holder.as_deref(), Some("b"));
    assert_eq!(d2.map.cells[15].state, "excluded");
    // A slice across two CIDRs (or between them) is refused, naming the CIDRs.
    let e = address_map(&layout, layout.cidrs[0].0, layout.cidrs[1].1).unwrap_err();
    assert!(e.to_string().contains("10.9.0.0-10.9.0.15"), "{e}");
}

#[test]
fn lookup_finds_an_address_in_an_additional_cidr() {
    let p = multi_pool();
    let dc = &pool_dcs(&p)[0];
    let b = holding("b", "lb", &["10.9.0.0-10.9.0.7"]);
    let hs = [&b];
    let ask = |q: &str| {
        let q = Query::parse(q).unwrap();
        let m = answer(&q, dc, &hs).into_iter().collect::<Vec<_>>();
        lookup_view(&q, &m)
    };
    let held = ask("10.9.0.3");
    assert_eq!(held.message, "10.9.0.3 is held by b (pool lb in dc1)");
    assert_eq!(held.matches[0].cidrs, ["10.9.0.0/28"]);
    assert_eq!(ask("10.9.0.15").matches[0].state, "excluded");
    assert_eq!(
        ask("10.5.0.77").message,
        "10.5.0.77 is free (pool lb in dc1)"
    );
    // Between the CIDRs: no pool covers it.
    assert!(ask("10.9.0.16").matches.is_empty());
    // A CIDR over two of them counts only what lies inside the pool.
    let wide = ask("10.0.0.0/12");
    assert_eq!(wide.matches[0].cidrs.len(), 3);
    assert_eq!(wide.matches[0].allocated, "8");
    assert_eq!(wide.matches[0].free, "518");
}

fn quarantine(holder: &str, ranges: &[&str]) -> Quarantine {
    Quarantine {
        pool: "lb".into(),
        datacenter: "dc1".into(),
        holder: holder.into(),
        until: "2026-11-26T10:00:00Z".into(),
        ranges: ranges
            .iter()
            .map(|r| AddrRange::parse_lenient(r).unwrap())
            .collect(),
    }
}

#[test]
fn known_quarantine_is_neither_free_nor_held_and_names_its_former_holder() {
    let p = multi_pool();
    let mut dc = pool_dcs(&p)[0].clone();
    dc.quarantine = vec![quarantine("gone", &["10.9.0.8-10.9.0.11"])];
    let a = holding("a", "lb", &["10.0.0.0-10.0.0.7"]);
    let hs = [&a];
    let layout = Layout::build(&dc, &hs).unwrap();
    let u = layout.usage(&hs);
    assert_eq!(u.quarantined.to_string(), "4");
    assert_eq!(u.free.to_string(), "514"); // 528 - 8 held - 2 excluded - 4 quarantined
    assert_eq!(
        u.allocated
            .saturating_add(u.excluded)
            .saturating_add(u.quarantined)
            .saturating_add(u.free),
        u.total
    );
    let (d, _) = detail(&dc, &hs, Some(layout.cidrs[1]), Vec::new()).unwrap();
    assert_eq!(d.map.cells[8].state, "quarantined");
    assert_eq!(d.map.cells[8].holder, None);
    let row = d.holders.iter().find(|h| h.cluster == "gone").unwrap();
    assert_eq!(row.phase, "Quarantined");
    assert_eq!(
        row.message,
        "quarantined for gone until 2026-11-26T10:00:00Z"
    );
    let q = Query::parse("10.9.0.9").unwrap();
    let m: Vec<_> = answer(&q, &dc, &hs).into_iter().collect();
    let v = lookup_view(&q, &m);
    assert_eq!(v.matches[0].state, "quarantined");
    assert_eq!(
        v.message,
        "10.9.0.9 is quarantined for gone until 2026-11-26T10:00:00Z (pool lb in dc1)"
    );
    // A holding over quarantined addresses owns them (counted once, as held).
    let c = holding("gone", "lb", &["10.9.0.8-10.9.0.9"]);
    let hs = [&a, &c];
    let u = Layout::build(&dc, &hs).unwrap().usage(&hs);
    assert_eq!(
        (u.allocated.to_string(), u.quarantined.to_string()),
        ("10".into(), "2".into())
    );
}

#[test]
fn a_quarantine_known_only_as_a_count_is_never_called_free() {
    let mut p = multi_pool();
    p.spec.datacenters.get_mut("dc1").unwrap().reuse_after = Some("1h".into());
    p.status = Some(crate::resources::IPAMPoolStatus {
        datacenters: [(
            "dc1".to_string(),
            crate::resources::DatacenterUsage {
                quarantined: Some("4".into()),
                ..Default::default()
            },
        )]
        .into(),
        ..Default::default()
    });
    let dc = &pool_dcs(&p)[0];
    assert!(dc.quarantine_unknown());
    let hs: [&Holding; 0] = [];
    let layout = Layout::build(dc, &hs).unwrap();
    let u = layout.usage(&hs);
    assert_eq!(u.quarantined.to_string(), "4");
    assert_eq!(u.free.to_string(), "522"); // 528 - 2 excluded - 4
    let (d, _) = detail(dc, &hs, None, Vec::new()).unwrap();
    assert!(d.quarantine_note.is_some());
    let q = Query::parse("10.5.0.1").unwrap();
    let m: Vec<_> = answer(&q, dc, &hs).into_iter().collect();
    let v = lookup_view(&q, &m);
    assert_eq!(v.matches[0].state, "unheld");
    assert!(
        v.message
            .starts_with("10.5.0.1 is not held by any allocation (pool lb in dc1)"),
        "{}",
        v.message
    );
    assert!(!v.message.contains("free"), "{}", v.message);
}

fn record(pool: &str, name: &str, entries: serde_json::Value) -> crate::resources::IPAMPoolRecord {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPoolRecord",
        "metadata": {"name": name},
        "spec": {"pool": pool, "datacenter": "dc1", "reservations": entries},
    }))
    .expect("record")
}

/// The quarantine as every replica reads it from the pool records: an entry's parts in two
/// shards joined, with its former holder and its end (release + `reuseAfter`); a cluster's
/// own entry, another pool's entry and an entry past its end are not quarantine.
#[test]
fn quarantine_is_read_from_the_records_with_holder_and_end() {
    let p = pool(
        "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: lb}\nspec:\n  datacenters:\n    dc1: {type: range, poolCidr: 10.0.0.0/24, allocationRange: 8, reuseAfter: 1h}\n",
    );
    let released = 1_764_093_600; // 2025-11-25T18:00:00Z
    let records = [
        record(
            "lb",
            "lb.dc1.a",
            serde_json::json!({
                "quarantined/web@2025-11-25T18:00:00Z": {"addresses": ["10.0.0.16-10.0.0.19"]},
                "quarantined/old@2025-11-25T10:00:00Z": {"addresses": ["10.0.0.40"]},
                "api": {"addresses": ["10.0.0.0-10.0.0.7"]},
            }),
        ),
        record(
            "lb",
            "lb.dc1.b",
            serde_json::json!({
                "quarantined/web@2025-11-25T18:00:00Z": {"addresses": ["10.0.0.200-10.0.0.203"]},
            }),
        ),
        record(
            "other",
            "other.dc1",
            serde_json::json!({
                "quarantined/web@2025-11-25T18:00:00Z": {"addresses": ["10.0.0.32"]},
            }),
        ),
    ];
    let q = quarantine::of_records(&p, &records, released + 60);
    assert_eq!(q.len(), 1, "{q:?}");
    assert_eq!(q[0].holder, "web");
    assert_eq!(q[0].until, "2025-11-25T19:00:00Z");
    assert_eq!(
        q[0].ranges
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>(),
        ["10.0.0.16-10.0.0.19", "10.0.0.200-10.0.0.203"]
    );
    // On the page: quarantined in the map's figures and in the lookup, with its holder.
    let dcs = view::pool_dcs_with(&p, &q);
    let api = holding("api", "lb", &["10.0.0.0-10.0.0.7"]);
    let (d, _) = detail(&dcs[0], &[&api], None, Vec::new()).unwrap();
    assert_eq!(d.usage.quarantined, "8");
    assert!(d.quarantine_note.is_none());
    let query = Query::parse("10.0.0.17").unwrap();
    let m = answer(&query, &dcs[0], &[&api]).unwrap();
    let v = lookup_view(&query, &[m]);
    assert_eq!(
        v.message,
        "10.0.0.17 is quarantined for web until 2025-11-25T19:00:00Z (pool lb in dc1)"
    );
    // Past its end nothing is quarantined any more.
    assert!(quarantine::of_records(&p, &records, released + 3_600).is_empty());
}

fn adopting(name: &str, dc: &str, adoption: serde_json::Value) -> crate::resources::Cluster {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Cluster",
        "metadata": {"name": name}, "spec": {"datacenter": dc},
        "status": {"adoption": adoption},
    }))
    .expect("cluster")
}

fn adoption_fleet() -> Vec<crate::resources::Cluster> {
    use serde_json::json;
    vec![
        adopting(
            "zeta",
            "dc1",
            json!({"mode": "Adopt", "state": "Adopted", "servedTotal": 2, "served": [
                {"address": "10.0.0.1", "verdict": "Held", "pool": "lb"},
                {"address": "192.168.0.1", "verdict": "Outside"}]}),
        ),
        adopting(
            "alpha",
            "dc1",
            json!({"mode": "DryRun", "state": "NeedsLook", "servedTotal": 1,
                "reasons": ["user cluster bravo serves them too: 10.0.0.20"],
                "served": [{"address": "10.0.0.20", "verdict": "Contested", "pool": "lb", "with": ["bravo"]}],
                "conflicts": [{"with": "bravo", "kind": "BothServe", "addresses": ["10.0.0.20"]}],
                "handMadePools": [{"namespace": "metallb-system", "name": "a", "addresses": ["10.0.0.16/28"], "pools": ["lb"]}]}),
        ),
        adopting(
            "mid",
            "dc2",
            json!({"mode": "Adopt", "state": "Waiting", "servedTotal": 0,
                "reasons": ["the user cluster has not been read yet"]}),
        ),
        // Not adopting: no status.adoption.
        serde_json::from_value(
            json!({"apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "Cluster",
            "metadata": {"name": "plain"}, "spec": {"datacenter": "dc1"}}),
        )
        .expect("cluster"),
    ]
}

#[test]
fn the_adoption_fleet_counts_states_and_verdicts_and_filters_by_datacenter() {
    let clusters = adoption_fleet();
    let f = adoption::fleet(clusters.iter(), None);
    let names: Vec<&str> = f.clusters.iter().map(|c| c.cluster.as_str()).collect();
    assert_eq!(names, ["alpha", "mid", "zeta"]);
    assert_eq!(f.summary.clusters, 3);
    assert_eq!(f.summary.served, 3);
    assert_eq!(
        f.summary.states,
        [
            ("Adopted".to_string(), 1),
            ("NeedsLook".into(), 1),
            ("Waiting".into(), 1)
        ]
        .into()
    );
    assert_eq!(
        f.summary.verdicts,
        [
            ("Contested".to_string(), 1),
            ("Held".into(), 1),
            ("Outside".into(), 1)
        ]
        .into()
    );
    assert_eq!(f.summary.conflicts, 1);
    assert_eq!(f.summary.needs_look, ["alpha"]);
    let dc2 = adoption::fleet(clusters.iter(), Some("dc2"));
    assert_eq!(dc2.clusters.len(), 1);
    assert_eq!(dc2.summary.needs_look, Vec::<String>::new());
    assert!(
        adoption::fleet(clusters.iter(), Some("nowhere"))
            .clusters
            .is_empty()
    );
}

#[test]
fn the_page_section_shows_clusters_needing_a_look_first_and_only_when_some_adopt() {
    let clusters = adoption_fleet();
    let page = adoption::page(clusters.iter()).expect("some adopt");
    let order: Vec<&str> = page.rows.iter().map(|r| r.cluster.as_str()).collect();
    assert_eq!(order, ["alpha", "mid", "zeta"]);
    let alpha = &page.rows[0];
    assert_eq!(alpha.conflicts[0].with, "bravo");
    assert_eq!(alpha.conflicts[0].addresses, ["10.0.0.20"]);
    assert_eq!(alpha.hand_made, ["metallb-system/a"]);
    assert_eq!(alpha.verdicts, [("Contested".to_string(), 1)].into());
    // No cluster adopting: no section at all.
    assert!(adoption::page(clusters.iter().filter(|c| c.status.is_none())).is_none());
    // The section survives the report's packing, as the page's script reads it back.
    let p = v4_pool();
    let mut r = report::report("seed", "2026-11-27T00:00:00Z", &[p], &[], &[]);
    r.summary.adoption = Some(page);
    let packed: serde_json::Value =
        serde_json::from_str(&r.packed().expect("packs")).expect("json");
    let read = report::read(&packed).expect("reads");
    assert_eq!(
        read["summary"]["adoption"]["rows"][0]["conflicts"][0]["with"],
        "bravo"
    );
    assert_eq!(
        read["summary"]["adoption"]["summary"]["needsLook"][0],
        "alpha"
    );
}
