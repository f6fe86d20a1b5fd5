//! `kipam offline --report FILE.html`: the pool page as one self-contained file.

use serde_json::Value;

use super::{Workdir, examples, kipam, text};

/// The JSON inlined in the report, read back as the page's script reads it.
fn data_of(html: &str) -> Value {
    kipam::page::report::read(&packed_of(html)).expect("the report reads back")
}

/// The JSON inlined in the report, as it is there.
fn packed_of(html: &str) -> Value {
    let start = html
        .find("<script type=\"application/json\" id=\"kipam-data\">")
        .expect("a data block")
        + "<script type=\"application/json\" id=\"kipam-data\">".len();
    let end = start
        + html[start..]
            .find("</script>")
            .expect("the data block ends");
    serde_json::from_str(&html[start..end]).expect("the data block is JSON")
}

#[test]
fn the_embedded_default_writes_the_pool_page_without_a_cluster() {
    let w = Workdir::new("report");
    let state = w.path("state.yaml").display().to_string();
    let report = w.path("pools.html").display().to_string();
    let examples = examples();
    let out = kipam(&[
        "offline", "-f", &examples, "--state", &state, "--report", &report,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("report"),
        "{}",
        text(&out.stderr)
    );
    let html = w.read("pools.html");
    // One file, nothing fetched: no external script, style or address.
    for outside in ["src=", "href=", "http://", "https://", "@import", "url("] {
        assert!(!html.contains(outside), "the report refers to {outside}");
    }
    assert!(html.contains("Content-Security-Policy") && html.contains("default-src 'none'"));
    let data = data_of(&html);
    let summary = &data["summary"];
    assert_eq!(summary["totals"]["pools"], 3, "{summary}");
    assert_eq!(summary["totals"]["datacenters"], 6);
    // Every allocation of the state is on the page, with the figures of the table.
    let stored = w.read("state.yaml").matches("kind: IPAMAllocation").count();
    assert_eq!(summary["totals"]["allocations"], stored);
    let metallb = &summary["pools"][0];
    assert_eq!(metallb["name"], "metallb");
    let dc = metallb["datacenters"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["name"] == "azure-westeurope")
        .unwrap();
    assert_eq!(dc["usage"]["allocated"], "28", "{dc}");
    assert_eq!(dc["usage"]["excluded"], "4");
    assert_eq!(dc["usage"]["quarantined"], "0");
    let detail = &data["datacenters"]["metallb/azure-westeurope"];
    // The map as the Rust side drew it (the page only draws it): what is held and excluded.
    let map = &detail["detail"]["map"];
    assert_eq!(map["first"], "192.168.1.0");
    assert_eq!(map["last"], "192.168.1.63");
    assert_eq!(map["cells"].as_array().map(Vec::len), Some(64));
    assert_eq!(map["cells"][0]["state"], "allocated");
    assert_eq!(map["cells"][0]["holder"], "alpha");
    assert_eq!(map["cells"][1]["state"], "excluded");
    // The data is packed: each key once in the whole file, not once per object.
    let packed = packed_of(&html).to_string();
    assert_eq!(packed.matches("\"largestFreeBlock\"").count(), 1);
    // The lookup, precomputed piece by piece: the page puts the address in front.
    let pieces = detail["pieces"].as_array().unwrap();
    assert_eq!(
        (
            &pieces[0]["first"],
            &pieces[0]["state"],
            &pieces[0]["message"]
        ),
        (
            &serde_json::json!("192.168.1.0"),
            &serde_json::json!("allocated"),
            &serde_json::json!(" is held by alpha (pool metallb in azure-westeurope)")
        )
    );
    assert_eq!(pieces[1]["state"], "excluded");

    // Running again changes nothing in the state and writes the same page.
    let again = kipam(&[
        "offline", "-f", &examples, "--state", &state, "--report", &report,
    ]);
    assert!(again.status.success());
    assert_eq!(data_of(&w.read("pools.html"))["summary"], data["summary"]);
}

/// A report whose directory does not exist is a usage error found before anything is written
/// (issue 37: every output is checked before the first is written).
#[test]
fn a_report_that_cannot_be_written_is_refused_before_the_state_is_written() {
    let w = Workdir::new("report-bad");
    let state = w.path("state.yaml").display().to_string();
    let report = w.path("missing-dir/pools.html").display().to_string();
    let out = kipam(&[
        "offline",
        "-f",
        &examples(),
        "--state",
        &state,
        "--report",
        &report,
    ]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("missing-dir"),
        "names the path: {}",
        text(&out.stderr)
    );
    assert!(!w.path("state.yaml").exists(), "nothing written");
}

const GROWN: &str = "apiVersion: ipam.kipam.dev/v1alpha1\nkind: IPAMPool\nmetadata: {name: lb}\nspec:\n  datacenters:\n    dc-1: {type: range, poolCidr: 10.5.0.0/30, additionalCidrs: [10.7.0.0/29], allocationRange: 4, reuseAfter: 1h}\n";

fn clusters(names: &[&str]) -> String {
    names
        .iter()
        .map(|c| {
            format!(
                "---\napiVersion: ipam.kipam.dev/v1alpha1\nkind: Cluster\nmetadata: {{name: {c}}}\nspec: {{datacenter: dc-1}}\n"
            )
        })
        .collect()
}

#[test]
fn the_report_shows_every_cidr_and_the_quarantine_with_its_former_holder() {
    let w = Workdir::new("report-grown");
    let state = w.path("state.yaml").display().to_string();
    let report = w.path("pools.html").display().to_string();
    // a fills poolCidr, b gets the first four addresses of the additional CIDR.
    let first = w.write("in.yaml", &format!("{GROWN}{}", clusters(&["a", "b"])));
    let out = kipam(&[
        "offline",
        "-f",
        &first.display().to_string(),
        "--state",
        &state,
        "--now",
        "2026-11-25T10:00:00Z",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // b goes: its addresses are quarantined for an hour.
    let second = w.write("in.yaml", &format!("{GROWN}{}", clusters(&["a"])));
    let out = kipam(&[
        "offline",
        "-f",
        &second.display().to_string(),
        "--state",
        &state,
        "--now",
        "2026-11-25T10:30:00Z",
        "--allow-release",
        "--report",
        &report,
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let data = data_of(&w.read("pools.html"));
    let dc = &data["summary"]["pools"][0]["datacenters"][0];
    assert_eq!(dc["cidr"], "10.5.0.0/30 +1");
    assert_eq!(
        dc["cidrs"],
        serde_json::json!(["10.5.0.0/30", "10.7.0.0/29"])
    );
    let u = &dc["usage"];
    assert_eq!(
        (
            u["total"].as_str(),
            u["allocated"].as_str(),
            u["quarantined"].as_str(),
            u["free"].as_str()
        ),
        (Some("12"), Some("4"), Some("4"), Some("4")),
        "{u}"
    );
    let detail = &data["datacenters"]["lb/dc-1"];
    assert_eq!(detail["detail"]["cidrs"][1]["cidr"], "10.7.0.0/29");
    assert_eq!(detail["detail"]["cidrs"][1]["usage"]["quarantined"], "4");
    // The additional CIDR's map, drawn by the Rust side, and its lookup.
    let cells = detail["maps"]["10.7.0.0-10.7.0.7"]["cells"]
        .as_array()
        .unwrap();
    let states: Vec<&str> = cells.iter().filter_map(|c| c["state"].as_str()).collect();
    assert_eq!(
        states,
        [
            "quarantined",
            "quarantined",
            "quarantined",
            "quarantined",
            "free",
            "free",
            "free",
            "free"
        ]
    );
    let pieces = detail["pieces"].as_array().unwrap();
    let at = pieces
        .iter()
        .position(|p| p["first"] == "10.7.0.0")
        .expect("a piece for the quarantine");
    let piece = &pieces[at];
    assert_eq!(
        pieces[at + 1]["first"],
        "10.7.0.4",
        "it ends where b's range ends"
    );
    assert_eq!(
        piece["message"],
        " is quarantined for b until 2026-11-25T11:30:00Z (pool lb in dc-1)"
    );
    let row = detail["detail"]["holders"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["cluster"] == "b")
        .expect("the quarantine is in the holders");
    assert_eq!(row["phase"], "Quarantined");
    assert_eq!(
        row["message"],
        "quarantined for b until 2026-11-25T11:30:00Z"
    );
}
