//! The pool web page in a real browser: headless Chromium (through chromedriver) against the
//! page a real `kipam controller` serves over the stand-in.
//!
//! Without Chromium the test is skipped with the reason printed, unless
//! `KIPAM_REQUIRE_CHROMIUM=1` is set (CI sets it), which makes a missing browser a failure.
//! Screenshots are written under `target/tmp/ui/`.

use std::path::PathBuf;
use std::time::Duration;

use kube_standin::{AccessRequest, UserInfo};

use super::support::Seed;
use super::webdriver::{self, Browser};

const WAIT: Duration = Duration::from_secs(30);

const POOLS: &str = r#"
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: metallb}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.0.0.0/24, allocationRange: 8, excludeRanges: ["10.0.0.0-10.0.0.3"]}
    dc-2: {type: range, poolCidr: 10.1.0.0/24, allocationRange: 16, additionalCidrs: [10.1.9.0/28]}
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: nodes-v6}
spec:
  datacenters:
    dc-1: {type: prefix, poolCidr: "2001:db8::/48", allocationPrefix: 64, excludePrefixes: ["2001:db8::/64"]}
---
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: tiny}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.9.0.0/30, allocationRange: 2}
"#;

fn screenshots() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("ui")
}

/// `reader-token` may read kipam's resources; `nobody-token` is a valid token of a user RBAC
/// gives nothing; any other token is not valid. The controller's own token may do anything.
fn script_auth(seed: &Seed) {
    let own = seed.api.token();
    seed.api.set_token_review(move |token| match token {
        t if t == own => Some(UserInfo::new("system:serviceaccount:kipam-system:kipam")),
        "reader-token" => Some(UserInfo::new("viewer@example.com")),
        "nobody-token" => Some(UserInfo::new("nobody@example.com")),
        _ => None,
    });
    seed.api
        .set_access_review(|req: &AccessRequest| match req.user.username.as_str() {
            "system:serviceaccount:kipam-system:kipam" => true,
            "viewer@example.com" => req
                .resource
                .as_ref()
                .is_some_and(|r| matches!(r.verb.as_str(), "get" | "list" | "watch")),
            _ => false,
        });
    seed.api.set_require_auth(true);
}

fn shot(browser: &Browser, name: &str) {
    let path = screenshots().join(format!("{name}.png"));
    browser
        .screenshot(&path)
        .unwrap_or_else(|e| panic!("screenshot {name}: {e}"));
    eprintln!("screenshot: {}", path.display());
}

fn ok<T>(what: &str, r: Result<T, String>) -> T {
    r.unwrap_or_else(|e| panic!("{what}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_signs_in_sees_the_pools_finds_an_address_and_watches_a_new_cluster() {
    if let Err(why) = webdriver::available() {
        if std::env::var("KIPAM_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1") {
            panic!("KIPAM_REQUIRE_CHROMIUM=1 but {why}");
        }
        eprintln!("skipped: {why}");
        return;
    }
    let seed = Seed::start("ui").await;
    script_auth(&seed);
    seed.apply(POOLS);
    for (name, dc) in [
        ("alpha", "dc-1"),
        ("bravo", "dc-1"),
        ("charlie", "dc-1"),
        ("delta", "dc-2"),
    ] {
        seed.cluster(name, dc);
    }
    let ctl = seed.controller("ctl");
    seed.wait_for("every cluster planned", WAIT, "ctl", |s| {
        s.held("charlie", "metallb") == "10.0.0.20-10.0.0.27"
            && s.phase("charlie", "tiny") == "Failed"
            && !s.held("delta", "metallb").is_empty()
    })
    .await;
    let base = format!("http://127.0.0.1:{}/ui/", ctl.api_port);
    let browser = ok(
        "browser",
        tokio::task::block_in_place(|| Browser::start(1440, 1400)),
    );

    // Not signed in: the sign-in form, and nothing else.
    ok("open", browser.goto(&base));
    browser
        .wait_for("the sign-in form", |b| {
            b.text("#login h1").contains("Sign in")
        })
        .await;

    // A token the API server does not accept: a clear message, still signed out.
    ok("type", browser.type_into("#token", "not-a-token"));
    ok("submit", browser.click("#login-form button"));
    browser
        .wait_for("the refusal", |b| {
            b.text("#login-error")
                .contains("The token was not accepted")
        })
        .await;
    shot(&browser, "refused");
    // A valid token whose user RBAC does not allow: told why.
    ok("type", browser.type_into("#token", "nobody-token"));
    ok("submit", browser.click("#login-form button"));
    browser
        .wait_for("the 403 message", |b| {
            let t = b.text("#login-error");
            t.contains("not allowed") && t.contains("nobody@example.com")
        })
        .await;
    let stored = ok(
        "eval",
        browser.eval("return sessionStorage.getItem('kipam.token');"),
    );
    assert!(stored.is_null(), "a refused token is not kept: {stored}");

    // The reader signs in: the pools of the seed, with their usage.
    ok("type", browser.type_into("#token", "reader-token"));
    ok("submit", browser.click("#login-form button"));
    browser
        .wait_for("the pools", |b| {
            let t = b.text("#pools");
            t.contains("metallb") && t.contains("nodes-v6") && t.contains("tiny")
        })
        .await;
    let url = ok("eval", browser.eval("return location.href;"));
    assert_eq!(
        url.as_str(),
        Some(base.as_str()),
        "the token is never in the URL"
    );
    assert!(browser.text("#pools").contains("10.0.0.0/24"));
    assert!(browser.text("#pools").contains("2001:db8::/48"));
    browser
        .wait_for("the failed allocation first", |b| {
            let t = b.text("#attention");
            t.contains("Failed") && t.contains("charlie")
        })
        .await;

    // A pool datacenter: figures, the address map, the holders.
    ok(
        "open metallb dc-1",
        browser.click("#pools tr[data-pool='metallb'][data-dc='dc-1']"),
    );
    browser
        .wait_for("the map and the holders", |b| {
            b.eval("return document.querySelectorAll('#map .cell').length;")
                .ok()
                .and_then(|v| v.as_u64())
                == Some(256)
                && b.text("#detail").contains("bravo")
        })
        .await;
    let held = ok(
        "eval",
        browser.eval("return document.querySelectorAll('#map .cell.allocated').length;"),
    );
    assert_eq!(held.as_u64(), Some(24), "three clusters of 8 addresses");
    let excluded = ok(
        "eval",
        browser.eval("return document.querySelectorAll('#map .cell.excluded').length;"),
    );
    assert_eq!(excluded.as_u64(), Some(4));
    // Marks the page: a reload would lose it.
    ok(
        "mark",
        browser.eval("window.kipamNoReload = true; window.scrollTo(0, 0); return null;"),
    );
    shot(&browser, "pools");

    // Who holds 10.0.0.13?
    ok("search", browser.type_into("#q", "10.0.0.13"));
    ok("find", browser.click("#search button"));
    browser
        .wait_for("the answer", |b| {
            b.text("#lookup")
                .contains("10.0.0.13 is held by bravo (pool metallb in dc-1)")
        })
        .await;
    shot(&browser, "lookup");
    ok("search", browser.type_into("#q", "10.0.0.2"));
    ok("find", browser.click("#search button"));
    browser
        .wait_for("excluded", |b| {
            b.text("#lookup").contains("10.0.0.2 is excluded")
        })
        .await;

    // A new cluster appears without a reload: in the pool's holders and in the map.
    seed.cluster("echo", "dc-1");
    seed.wait_for("echo allocated", WAIT, "ctl", |s| {
        s.held("echo", "metallb") == "10.0.0.28-10.0.0.35"
    })
    .await;
    browser
        .wait_for("echo on the page", |b| {
            b.text("#detail").contains("echo")
                && b.eval("return document.querySelectorAll('#map .cell.allocated').length;")
                    .ok()
                    .and_then(|v| v.as_u64())
                    == Some(32)
        })
        .await;
    let marked = ok(
        "eval",
        browser.eval("return window.kipamNoReload === true;"),
    );
    assert_eq!(marked.as_bool(), Some(true), "the page was not reloaded");

    // The IPv6 /48: 256 cells of 2^72 addresses; a click zooms into the first.
    ok(
        "open nodes-v6",
        browser.click("#pools tr[data-pool='nodes-v6'][data-dc='dc-1']"),
    );
    browser
        .wait_for("the v6 map", |b| {
            b.text("#detail").contains("nodes-v6") && b.text("#detail").contains("per cell")
        })
        .await;
    ok("zoom", browser.click("#map .cell"));
    browser
        .wait_for("zoomed to /56", |b| {
            b.text("#detail .crumbs").contains("2001:db8::")
                && b.text("#detail").contains("a /64 per cell")
        })
        .await;
    shot(&browser, "zoom-v6");
    let held = ok(
        "eval",
        browser.eval("return document.querySelectorAll('#map .cell.allocated').length;"),
    );
    assert_eq!(
        held.as_u64(),
        Some(4),
        "four clusters hold a /64 each: {}",
        browser.text("#detail")
    );

    // A pool datacenter of two CIDRs: listed as `+1`, mapped one CIDR at a time.
    assert!(
        browser.text("#pools").contains("10.1.0.0/24 +1"),
        "{}",
        browser.text("#pools")
    );
    ok(
        "open metallb dc-2",
        browser.click("#pools tr[data-pool='metallb'][data-dc='dc-2']"),
    );
    browser
        .wait_for("the CIDR picker", |b| {
            b.eval("return document.querySelectorAll('#cidrs .cidr').length;")
                .ok()
                .and_then(|v| v.as_u64())
                == Some(2)
        })
        .await;
    ok("second CIDR", browser.click("#cidrs .cidr:nth-child(2)"));
    browser
        .wait_for("the map of 10.1.9.0/28", |b| {
            b.eval("return document.querySelectorAll('#map .cell').length;")
                .ok()
                .and_then(|v| v.as_u64())
                == Some(16)
                && b.text("#cidrs .cidr.on").contains("10.1.9.0/28")
        })
        .await;
    shot(&browser, "cidrs");

    // Signing out forgets the token.
    ok("sign out", browser.click("#signout"));
    browser
        .wait_for("signed out", |b| b.text("#login h1").contains("Sign in"))
        .await;
    let stored = ok(
        "eval",
        browser.eval("return sessionStorage.getItem('kipam.token');"),
    );
    assert!(stored.is_null());
    drop(browser);
    drop(ctl);
}

/// The offline report in the same browser, opened from a file: the pools, a lookup and a
/// zoom work from the inlined data alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_report_works_from_the_file_alone() {
    if let Err(why) = webdriver::available() {
        if std::env::var("KIPAM_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1") {
            panic!("KIPAM_REQUIRE_CHROMIUM=1 but {why}");
        }
        eprintln!("skipped: {why}");
        return;
    }
    let dir = std::env::temp_dir().join(format!("kipam-report-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    let report = dir.join("pools.html");
    let examples = concat!(env!("CARGO_MANIFEST_DIR"), "/examples");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kipam"))
        .args(["offline", "-f", examples, "--state"])
        .arg(dir.join("state.yaml"))
        .arg("--report")
        .arg(&report)
        .output()
        .expect("kipam offline runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let browser = ok(
        "browser",
        tokio::task::block_in_place(|| Browser::start(1440, 1400)),
    );
    ok(
        "open",
        browser.goto(&format!("file://{}", report.display())),
    );
    browser
        .wait_for("the pools", |b| {
            let t = b.text("#pools");
            t.contains("metallb-ipv6") && t.contains("192.168.1.0/26")
        })
        .await;
    assert!(browser.text("#live").contains("Report of"));
    ok("search", browser.type_into("#q", "192.168.1.13"));
    ok("find", browser.click("#search button"));
    browser
        .wait_for("the answer", |b| {
            b.text("#lookup")
                .contains("192.168.1.13 is held by bravo (pool metallb in azure-westeurope)")
        })
        .await;
    ok("search", browser.type_into("#q", "192.168.1.1"));
    ok("find", browser.click("#search button"));
    browser
        .wait_for("excluded", |b| {
            b.text("#lookup").contains("192.168.1.1 is excluded")
        })
        .await;
    ok(
        "open the v6 range pool",
        browser.click("#pools tr[data-pool='metallb-ipv6'][data-dc='azure-westeurope']"),
    );
    browser
        .wait_for("its map", |b| b.text("#detail").contains("a /72 per cell"))
        .await;
    ok("zoom", browser.click("#map .cell"));
    browser
        .wait_for("zoomed", |b| b.text("#detail").contains("a /80 per cell"))
        .await;
    shot(&browser, "offline-zoom");
    let held = ok(
        "eval",
        browser.eval(
            "return document.querySelectorAll('#map .cell.partial, #map .cell.allocated').length;",
        ),
    );
    assert_eq!(
        held.as_u64(),
        Some(1),
        "both clusters' addresses are in the first /80: {}",
        browser.text("#detail")
    );
    drop(browser);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Two replicas. A cluster is deleted from a pool with `reuseAfter`: its addresses are
/// quarantined in the pool record. The replica that does not lead — which never held the
/// quarantine in memory — shows them on its page as quarantined, address by address: in the
/// map, among the holders ("quarantined for web until …"), and in the lookup.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_does_not_lead_shows_the_quarantine() {
    if let Err(why) = webdriver::available() {
        if std::env::var("KIPAM_REQUIRE_CHROMIUM").is_ok_and(|v| v == "1") {
            panic!("KIPAM_REQUIRE_CHROMIUM=1 but {why}");
        }
        eprintln!("skipped: {why}");
        return;
    }
    let seed = Seed::start("ui-quarantine").await;
    script_auth(&seed);
    seed.apply(
        "
apiVersion: ipam.kipam.dev/v1alpha1
kind: IPAMPool
metadata: {name: edge}
spec:
  datacenters:
    dc-1: {type: range, poolCidr: 10.0.0.0/28, allocationRange: 4, reuseAfter: 1h}
",
    );
    let ctls = [seed.controller("r0"), seed.controller("r1")];
    seed.cluster("web", "dc-1");
    seed.cluster("api", "dc-1");
    seed.wait_for("both allocated", WAIT, "r0", |s| {
        s.phase("web", "edge") == "Allocated" && s.phase("api", "edge") == "Allocated"
    })
    .await;
    // api plans first (by name): web holds the second four addresses.
    assert_eq!(seed.held("web", "edge"), "10.0.0.4-10.0.0.7");
    seed.delete("clusters", None, "web");
    seed.wait_for("web's addresses quarantined", WAIT, "r0", |s| {
        s.get("clusters", None, "web").is_none()
            && s.api.list("ipampoolrecords", None).iter().any(|r| {
                r["spec"]["reservations"]
                    .as_object()
                    .is_some_and(|e| e.keys().any(|k| k.starts_with("quarantined/web@")))
            })
    })
    .await;
    let leader = seed.lease_holder();
    let follower = ctls
        .iter()
        .find(|c| c.identity != leader)
        .expect("a replica that does not lead");
    eprintln!("leader {leader}, asking {}", follower.identity);
    let base = format!("http://127.0.0.1:{}/ui/", follower.api_port);
    let browser = ok(
        "browser",
        tokio::task::block_in_place(|| Browser::start(1440, 1100)),
    );
    ok("open", browser.goto(&base));
    browser
        .wait_for("the sign-in form", |b| {
            b.text("#login h1").contains("Sign in")
        })
        .await;
    ok("type", browser.type_into("#token", "reader-token"));
    ok("submit", browser.click("#login-form button"));
    // (The list is drawn again when the first poll comes back: click until it takes.)
    browser
        .wait_for("edge dc-1 opened", |b| {
            b.click("#pools tr[data-pool='edge'][data-dc='dc-1']")
                .is_ok()
                && b.text("#detail").contains("edge · dc-1")
        })
        .await;
    browser
        .wait_for("the quarantine in the map and among the holders", |b| {
            b.eval("return document.querySelectorAll('#map .cell.quarantined').length;")
                .ok()
                .and_then(|v| v.as_u64())
                == Some(4)
                && b.text("#detail").contains("quarantined for web until")
        })
        .await;
    let held = ok(
        "eval",
        browser.eval("return document.querySelectorAll('#map .cell.allocated').length;"),
    );
    assert_eq!(held.as_u64(), Some(4), "api's four addresses");
    ok("search", browser.type_into("#q", "10.0.0.6"));
    ok("find", browser.click("#search button"));
    browser
        .wait_for("the lookup names the former holder", |b| {
            b.text("#lookup")
                .contains("10.0.0.6 is quarantined for web until")
        })
        .await;
    ok("top", browser.eval("window.scrollTo(0, 0); return null;"));
    shot(&browser, "quarantine-follower");
    drop(browser);
    drop(ctls);
}
