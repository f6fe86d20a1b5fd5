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
    let map = address_map(&layout, layout.first, layout.last).unwrap();
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
    let map = address_map(&layout, layout.first, layout.last).unwrap();
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
    let s = pool_summary(&p, &[a.clone(), f.clone()]);
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
    let page = html::offline(&serde_json::json!({"x": "</script>"})).unwrap();
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
