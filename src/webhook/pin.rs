//! The webhook's commit of a hand-made `IPAddress` to the pool record, before it admits it.
//!
//! Checked against the webhook's caches alone, a hand-made `IPAddress` could be admitted while
//! a commit that planned without it hands the same address to a cluster or a claim: two
//! objects would show one address (a double holding, judged by history). So an admitted one
//! is also *committed*: the webhook writes an entry `ipaddress/<namespace>/<name>@<time>`
//! ([`crate::resources::capi::hand_made_holder`]) into the shard of its pool's record that
//! covers the address, by the same rules as the planning loop's commits — every shard it
//! writes is read from the API server first (no cache), each write carries the version read
//! as its precondition, the fences of every other pool of the address space covering the
//! address are raised before the entry is written, and each write carries the `poolsSeen`
//! stamp of the webhook's pool cache. The webhook is then one more writer of the record, and
//! the argument of `docs/design.md` ("the fence across pools") holds between it and any
//! commit: whichever lands second planned on a copy holding the first, or is refused (409).
//! A planning loop commit refused that way reads the shard again and plans with the entry.
//!
//! Refused when the address is held in what it reads (naming the holder), when a pool of the
//! datacenter is invalid (its fences cannot be raised by a division it does not know), when a
//! shard was written by a replica that saw newer pools, or when the writes keep meeting other
//! writers (`503`, try again). A dry run writes nothing. The entry is kept by the planning
//! loop while the object exists; since admission comes before the object is stored, one whose
//! object never appears (another admission step refused it) is dropped once a minute has
//! passed and a read confirms the object absent.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::address::{AddrRange, Cidr};
use crate::allocator::Allocation;
use crate::reservations::shards::{self, Layout};
use crate::reservations::{allocation_of, reservation_of};
use crate::resources::capi::{claim_holder, hand_made_holder, hand_made_of_holder};
use crate::resources::{
    AllocationType, IPAMPool, IPAMPoolRecord, IPAMPoolRecordSpec, RECORD_FORMAT,
};

use super::review::Verdict;

/// Tries before the webhook gives up on a commit that keeps meeting other writers.
const ATTEMPTS: u32 = 5;

/// The hand-made `IPAddress` to commit.
pub struct HandMade<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    /// The claim it names (`spec.claimRef.name`): an entry of that claim holding exactly this
    /// address already makes it held (kipam committed it for the claim).
    pub claim: &'a str,
    pub pool: &'a IPAMPool,
    /// What it shows, by datacenter ([`super::ipaddress::check`]).
    pub placed: &'a [(String, AddrRange)],
}

/// One shard to write, as read from the server (`None`: it does not exist).
#[derive(Clone)]
struct Shard {
    pool: IPAMPool,
    datacenter: String,
    name: String,
    block: Cidr,
    read: Option<IPAMPoolRecord>,
}

/// The shards of one pool datacenter covering the address, with its layout record as read
/// (or as the webhook created it).
struct Group {
    pool: IPAMPool,
    layout: IPAMPoolRecord,
    shards: Vec<Shard>,
}

/// Why an attempt stopped.
enum Stop {
    /// The answer, final.
    Verdict(Verdict),
    /// Somebody wrote first: read again and try again.
    Again,
}

/// Commits `made` to the records of its pool, or says why not. `pools` are the pools of the
/// webhook's cache; `pools_seen` the highest `resourceVersion` among them; `now` seconds since
/// the Unix epoch.
pub async fn commit(
    client: &kube::Client,
    pools: &[IPAMPool],
    pools_seen: i64,
    made: &HandMade<'_>,
    now: i64,
) -> Result<(), Verdict> {
    let mut wait = Duration::from_millis(20);
    for attempt in 1..=ATTEMPTS {
        match attempt_commit(client, pools, pools_seen, made, now).await {
            Ok(()) => return Ok(()),
            Err(Stop::Verdict(v)) => return Err(v),
            Err(Stop::Again) if attempt < ATTEMPTS => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_millis(400));
            }
            Err(Stop::Again) => {}
        }
    }
    Err(Verdict::unavailable(format!(
        "IPAddress {}/{}: the pool record of IPAMPool {} kept changing while kipam committed its \
         address ({ATTEMPTS} tries); try again",
        made.namespace,
        made.name,
        made.pool.name_any()
    )))
}

async fn attempt_commit(
    client: &kube::Client,
    pools: &[IPAMPool],
    pools_seen: i64,
    made: &HandMade<'_>,
    now: i64,
) -> Result<(), Stop> {
    let api: Api<IPAMPoolRecord> = Api::all(client.clone());
    let label = format!("IPAddress {}/{}", made.namespace, made.name);
    let pool_name = made.pool.name_any();
    let space = made.pool.spec.address_space.clone().unwrap_or_default();
    // Everything read before anything is written.
    let mut plans = Vec::new();
    for (dc, shown) in made.placed {
        let mut fences: Vec<Group> = Vec::new();
        for other in pools {
            let name = other.name_any();
            if name == pool_name
                || other.metadata.deletion_timestamp.is_some()
                || !other.spec.datacenters.contains_key(dc)
            {
                continue;
            }
            let input = match crate::validation::pool_input(other) {
                Ok(i) => i,
                Err(errors) => {
                    let why: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
                    return Err(Stop::Verdict(Verdict::unavailable(format!(
                        "{label}: IPAMPool {name}, which also serves datacenter {dc}, is invalid \
                         ({}); kipam cannot fence a hand-made address there until it is fixed",
                        why.join("; ")
                    ))));
                }
            };
            let same_space = other.spec.address_space.clone().unwrap_or_default() == space;
            let overlaps = input
                .datacenters
                .get(dc)
                .is_some_and(|d| d.config.cidrs().any(|c| c.range().overlaps(shown)));
            // A pool narrowed away from the address is fenced there all the same while its
            // layout record remembers it reached it (a replica that has not seen the
            // narrowing may still commit there).
            let shares =
                same_space && (overlaps || reached(&api, other, dc, shown, &label).await?);
            if shares && let Some(group) = shards_of(&api, other, dc, shown, &label).await? {
                fences.push(group);
            }
        }
        let Some(own) = shards_of(&api, made.pool, dc, shown, &label).await? else {
            continue;
        };
        plans.push((dc, shown, own, fences));
    }
    let mine = |entry: &str| {
        hand_made_of_holder(entry).is_some_and(|(ns, n, _)| ns == made.namespace && n == made.name)
    };
    let claim = claim_holder(made.namespace, made.claim);
    let mut writes = Vec::new();
    for (dc, shown, own, fences) in plans {
        let held = held_here(made.pool, dc, shown);
        let wanted = reservation_of(&held);
        let mut done = false;
        // Every record read, the layout records too: of a format this kipam knows, and
        // written by nobody who had seen newer pools.
        let every = || std::iter::once(&own).chain(fences.iter());
        for group in every() {
            kept(&api, &group.layout, &group.pool, dc, &label).await?;
            let shards = group.shards.iter().filter_map(|s| s.read.as_ref());
            for record in std::iter::once(&group.layout).chain(shards) {
                usable(&label, record, pools_seen)?;
            }
        }
        for shard in every().flat_map(|g| g.shards.iter()) {
            let Some(read) = &shard.read else { continue };
            for (entry, r) in &read.spec.reservations {
                let Ok(recorded) = allocation_of(r) else {
                    continue;
                };
                if !recorded.ranges().any(|p| p.overlaps(shown)) {
                    continue;
                }
                let own_pool = shard.pool.name_any() == pool_name;
                if own_pool && mine(entry) && *r == wanted {
                    done = true;
                    continue;
                }
                if own_pool && (mine(entry) || (*entry == claim && *r == wanted)) {
                    // Its own older entry (replaced below), or its claim's: kipam committed
                    // this very address for the claim already.
                    done |= *entry == claim;
                    continue;
                }
                return Err(Stop::Verdict(Verdict::invalid(format!(
                    "{label}: spec.address: {shown} is held by {entry} in IPAMPool {}/{dc} \
                     (IPAMPoolRecord {})",
                    shard.pool.name_any(),
                    shard.name
                ))));
            }
        }
        if !done {
            writes.push((own, fences, wanted));
        }
    }
    let key = hand_made_holder(made.namespace, made.name, now);
    for (own, fences, wanted) in writes {
        for group in &fences {
            // A shard created here is created with its fence raised, then confirmed.
            let created = create_missing(&api, group, pools_seen, Some(1)).await?;
            for shard in group.shards.iter().filter(|s| s.read.is_some()) {
                let fence = shard.read.as_ref().and_then(|r| r.spec.fence).unwrap_or(0);
                let spec = json!({"fence": fence.saturating_add(1)});
                patch(&api, shard, spec, pools_seen).await?;
            }
            if created.is_some() {
                raise_layout(&api, &group.layout, pools_seen).await?;
            }
        }
        // The pool's own new shards are created empty and confirmed by a raise of its layout
        // record before the entry goes in (as the planning loop's commits do): a webhook that
        // read a layout record since deleted — the datacenter removed and added back, the pool
        // made again — divides by it, and that raise is what refuses it.
        let created = create_missing(&api, &own, pools_seen, None).await?;
        if created.is_some() {
            raise_layout(&api, &own.layout, pools_seen).await?;
        }
        let created = created.unwrap_or_default();
        for shard in &own.shards {
            // Its older entries (an earlier try of the same name) go in the same write.
            let mut entries: BTreeMap<String, Value> = shard
                .read
                .iter()
                .flat_map(|r| r.spec.reservations.keys())
                .filter(|e| mine(e) && **e != key)
                .map(|e| (e.clone(), Value::Null))
                .collect();
            let value = serde_json::to_value(&wanted).unwrap_or(Value::Null);
            entries.insert(key.clone(), value);
            let spec = json!({"reservations": entries});
            match (&shard.read, created.get(&shard.name)) {
                (Some(_), _) => patch(&api, shard, spec, pools_seen).await?,
                (None, Some(made)) => {
                    let written = Shard {
                        read: Some(made.clone()),
                        ..shard.clone()
                    };
                    patch(&api, &written, spec, pools_seen).await?;
                }
                (None, None) => return Err(Stop::Again),
            }
        }
    }
    Ok(())
}

/// Creates the shards of `group` that did not exist when read, with the fence `fence`.
/// Returns them by name as created (`None`: none was missing).
async fn create_missing(
    api: &Api<IPAMPoolRecord>,
    group: &Group,
    pools_seen: i64,
    fence: Option<i64>,
) -> Result<Option<BTreeMap<String, IPAMPoolRecord>>, Stop> {
    let mut created = BTreeMap::new();
    for shard in group.shards.iter().filter(|s| s.read.is_none()) {
        let pool = &shard.pool;
        let record = IPAMPoolRecord {
            metadata: ObjectMeta {
                name: Some(shard.name.clone()),
                owner_references: Some(vec![crate::resources::record_owner(pool)]),
                ..Default::default()
            },
            spec: IPAMPoolRecordSpec {
                pool: pool.name_any(),
                datacenter: shard.datacenter.clone(),
                block: Some(shard.block.to_string()),
                pools_seen: (pools_seen > 0).then_some(pools_seen),
                format: Some(RECORD_FORMAT),
                fence,
                ..Default::default()
            },
        };
        let made = api
            .create(&PostParams::default(), &record)
            .await
            .map_err(|e| written(&shard.name, e))?;
        created.insert(shard.name.clone(), made);
    }
    Ok((!created.is_empty()).then_some(created))
}

/// Raises the fence of the layout record `layout` on the version read: refused when the
/// layout record was deleted or written since (see [`crate::planning::records`]).
async fn raise_layout(
    api: &Api<IPAMPoolRecord>,
    layout: &IPAMPoolRecord,
    pools_seen: i64,
) -> Result<(), Stop> {
    let name = layout.name_any();
    let version = layout.metadata.resource_version.clone().unwrap_or_default();
    let mut spec = json!({
        "fence": layout.spec.fence.unwrap_or(0).saturating_add(1),
        "format": RECORD_FORMAT,
    });
    if layout.spec.pools_seen.unwrap_or(0) < pools_seen {
        spec["poolsSeen"] = json!(pools_seen);
    }
    let body = json!({"metadata": {"resourceVersion": version}, "spec": spec});
    let pp = PatchParams {
        field_manager: Some("kipam".into()),
        ..Default::default()
    };
    api.patch(&name, &pp, &Patch::Merge(&body))
        .await
        .map(|_| ())
        .map_err(|e| written(&name, e))
}

/// `Err` when `record` is of a newer format than this kipam knows, or was written by a
/// replica that had seen newer pools than `pools_seen`.
fn usable(label: &str, record: &IPAMPoolRecord, pools_seen: i64) -> Result<(), Stop> {
    let name = record.name_any();
    if let Some(format) = record.spec.newer_format() {
        return Err(Stop::Verdict(newer_format(label, &name, format)));
    }
    let stamp = record.spec.pools_seen.unwrap_or(0);
    if stamp > pools_seen {
        return Err(Stop::Verdict(Verdict::unavailable(format!(
            "{label}: pool record {name} was written by a replica that had seen the pools at \
             revision {stamp}; this replica has seen them up to {pools_seen}; try again in a \
             moment"
        ))));
    }
    Ok(())
}

/// What the object holds in `dc` as a record entry reads it: the subnet in a `prefix`
/// datacenter, else the address.
fn held_here(pool: &IPAMPool, dc: &str, shown: &AddrRange) -> Allocation {
    let prefix = pool
        .spec
        .datacenters
        .get(dc)
        .is_some_and(|s| s.type_ == AllocationType::Prefix);
    // `check` gives a prefix datacenter's subnet as its range: the CIDR of that range.
    let host = 128 - (shown.last() - shown.first()).leading_zeros();
    let cidr = u32::from(shown.family().bits())
        .checked_sub(host)
        .and_then(|len| u8::try_from(len).ok())
        .and_then(|len| Cidr::new(shown.family(), shown.first(), len))
        .filter(|c| c.range() == *shown);
    match cidr {
        Some(cidr) if prefix => Allocation::Prefix(cidr),
        _ => Allocation::Range(vec![*shown]),
    }
}

/// Whether the layout record of `pool` in `dc` remembers a network over `shown`.
async fn reached(
    api: &Api<IPAMPoolRecord>,
    pool: &IPAMPool,
    dc: &str,
    shown: &AddrRange,
    label: &str,
) -> Result<bool, Stop> {
    let name = shards::layout_name(&pool.name_any(), dc);
    let layout = api.get_opt(&name).await.map_err(unavailable(label))?;
    Ok(layout.is_some_and(|l| {
        l.spec
            .networks
            .iter()
            .filter_map(|n| n.parse::<Cidr>().ok())
            .any(|n| n.range().overlaps(shown))
    }))
}

/// `Err` unless the layout record `layout` of `pool` in `dc` is up to the pool as this
/// webhook reads it — every network of it remembered, written for its generation — as the
/// planning loop keeps it (`crate::planning::records::keep_layout`). Behind: brought up
/// (a compare-and-swap) and the commit tried again. Ahead (written for a newer generation):
/// this webhook's pools lag, try again later.
async fn kept(
    api: &Api<IPAMPoolRecord>,
    layout: &IPAMPoolRecord,
    pool: &IPAMPool,
    dc: &str,
    label: &str,
) -> Result<(), Stop> {
    let Some(settings) = pool.spec.datacenters.get(dc) else {
        return Ok(());
    };
    let Ok(base) = Layout::of(settings) else {
        return Ok(());
    };
    let name = layout.name_any();
    let generation = pool.metadata.generation.unwrap_or(0);
    let current: Vec<Cidr> = base.cidrs().copied().collect();
    let networks = match shards::layout_state(
        &layout.spec.networks,
        layout.spec.pool_generation,
        &current,
        generation,
    ) {
        shards::LayoutState::Current => return Ok(()),
        shards::LayoutState::Ahead => {
            return Err(Stop::Verdict(Verdict::unavailable(format!(
                "{label}: layout record {name} was written for a newer version of IPAMPool {} \
                 than this replica has seen; try again in a moment",
                pool.name_any()
            ))));
        }
        shards::LayoutState::Behind(networks) => networks,
    };
    let texts: Vec<String> = networks.iter().map(ToString::to_string).collect();
    let version = layout.metadata.resource_version.clone().unwrap_or_default();
    let body = json!({
        "metadata": {"resourceVersion": version},
        "spec": {"networks": texts, "poolGeneration": generation, "format": RECORD_FORMAT},
    });
    let pp = PatchParams {
        field_manager: Some("kipam".into()),
        ..Default::default()
    };
    api.patch(&name, &pp, &Patch::Merge(&body))
        .await
        .map_err(|e| written(&name, e))?;
    Err(Stop::Again)
}

/// The shards of `pool`'s record in `dc` covering `shown`, read from the server, divided by
/// its layout record (created first when it has none, as the planning loop does).
async fn shards_of(
    api: &Api<IPAMPoolRecord>,
    pool: &IPAMPool,
    dc: &str,
    shown: &AddrRange,
    label: &str,
) -> Result<Option<Group>, Stop> {
    let pool_name = pool.name_any();
    let Some(settings) = pool.spec.datacenters.get(dc) else {
        return Ok(None);
    };
    let base = Layout::of(settings).map_err(|why| {
        Stop::Verdict(Verdict::invalid(format!(
            "{label}: IPAMPool {pool_name}/{dc}: {why}"
        )))
    })?;
    let layout_name = shards::layout_name(&pool_name, dc);
    let (layout, record) = match api
        .get_opt(&layout_name)
        .await
        .map_err(unavailable(label))?
    {
        Some(r) if r.spec.newer_format().is_some() => {
            let format = r.spec.newer_format().unwrap_or_default();
            return Err(Stop::Verdict(newer_format(label, &layout_name, format)));
        }
        Some(r) => match r.spec.block_length.and_then(|l| u8::try_from(l).ok()) {
            Some(len) => {
                let remembered = r.spec.networks.iter().filter_map(|n| n.parse().ok());
                (base.with_block_len(len).with_networks(remembered), r)
            }
            None => {
                return Err(Stop::Verdict(Verdict::unavailable(format!(
                    "{label}: layout record {layout_name} gives no block length"
                ))));
            }
        },
        None => {
            // A record written before layout records existed: kipam moves it first.
            if api
                .get_opt(&crate::resources::record_name(&pool_name, dc))
                .await
                .map_err(unavailable(label))?
                .is_some()
            {
                return Err(Stop::Verdict(Verdict::unavailable(format!(
                    "{label}: the record of IPAMPool {pool_name}/{dc} predates its layout \
                     record; kipam rewrites it at its next commit there; try again then"
                ))));
            }
            let record = IPAMPoolRecord {
                metadata: ObjectMeta {
                    name: Some(layout_name.clone()),
                    owner_references: Some(vec![crate::resources::record_owner(pool)]),
                    ..Default::default()
                },
                spec: IPAMPoolRecordSpec {
                    pool: pool_name.clone(),
                    datacenter: dc.to_string(),
                    block_length: Some(i32::from(base.block_len())),
                    networks: shards::union_networks(
                        &[],
                        &base.cidrs().copied().collect::<Vec<_>>(),
                    )
                    .iter()
                    .map(ToString::to_string)
                    .collect(),
                    pool_generation: pool.metadata.generation,
                    format: Some(RECORD_FORMAT),
                    ..Default::default()
                },
            };
            match api.create(&PostParams::default(), &record).await {
                Ok(made) => (base, made),
                Err(e) if stale(&e) => return Err(Stop::Again),
                Err(e) => return Err(unavailable(label)(e)),
            }
        }
    };
    let blocks = layout.blocks_covering([*shown]).map_err(|why| {
        Stop::Verdict(Verdict::invalid(format!(
            "{label}: IPAMPool {pool_name}/{dc}: {why}"
        )))
    })?;
    let mut shards = Vec::new();
    for block in blocks {
        let name = shards::shard_name(&pool_name, dc, &block);
        let read = api.get_opt(&name).await.map_err(unavailable(label))?;
        shards.push(Shard {
            pool: pool.clone(),
            datacenter: dc.to_string(),
            name,
            block,
            read,
        });
    }
    Ok(Some(Group {
        pool: pool.clone(),
        layout: record,
        shards,
    }))
}

/// A merge patch of `spec` on the version of `shard` read, stamping `pools_seen`.
async fn patch(
    api: &Api<IPAMPoolRecord>,
    shard: &Shard,
    mut spec: Value,
    pools_seen: i64,
) -> Result<(), Stop> {
    let Some(read) = &shard.read else {
        return Err(Stop::Again);
    };
    let version = read.metadata.resource_version.clone().unwrap_or_default();
    if read.spec.pools_seen.unwrap_or(0) < pools_seen {
        spec["poolsSeen"] = json!(pools_seen);
    }
    if read.spec.format != Some(RECORD_FORMAT) {
        spec["format"] = json!(RECORD_FORMAT);
    }
    let body = json!({"metadata": {"resourceVersion": version}, "spec": spec});
    let pp = PatchParams {
        field_manager: Some("kipam".into()),
        ..Default::default()
    };
    api.patch(&shard.name, &pp, &Patch::Merge(&body))
        .await
        .map(|_| ())
        .map_err(|e| written(&shard.name, e))
}

/// What a failed write of record `name` stops with.
fn written(name: &str, e: kube::Error) -> Stop {
    if stale(&e) {
        return Stop::Again;
    }
    Stop::Verdict(Verdict::unavailable(format!(
        "pool record {name}: {}",
        crate::seed::preconditions::short(&e)
    )))
}

/// A conflict, an object that exists already, or one gone since it was read.
/// The answer while a record this write would touch is of a newer format than this kipam
/// knows (a newer release is rolling out).
fn newer_format(label: &str, record: &str, format: i32) -> Verdict {
    Verdict::unavailable(format!(
        "{label}: pool record {record} was written in record format {format} by a newer kipam; \
         this replica knows format {RECORD_FORMAT} and writes nothing into it: try again once \
         the upgrade is finished"
    ))
}

fn stale(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 || s.code == 404)
}

fn unavailable(label: &str) -> impl Fn(kube::Error) -> Stop + '_ {
    move |e| {
        Stop::Verdict(Verdict::unavailable(format!(
            "{label}: kipam cannot read its pool record to commit the address: {}",
            crate::seed::preconditions::short(&e)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pool(kind: &str) -> IPAMPool {
        serde_json::from_value(json!({
            "apiVersion": "ipam.kipam.dev/v1alpha1", "kind": "IPAMPool",
            "metadata": {"name": "lan"},
            "spec": {"datacenters": {"dc-1": {"type": kind, "poolCidr": "10.0.0.0/16",
                "allocationPrefix": 24, "allocationRange": 4}}},
        }))
        .unwrap()
    }

    #[test]
    fn what_a_hand_made_address_holds_reads_as_its_datacenter_hands_out() {
        let one = AddrRange::parse_lenient("10.0.3.7").unwrap();
        assert_eq!(
            held_here(&pool("range"), "dc-1", &one),
            Allocation::Range(vec![one])
        );
        let subnet = AddrRange::parse_lenient("10.0.3.0-10.0.3.255").unwrap();
        assert_eq!(
            held_here(&pool("prefix"), "dc-1", &subnet),
            Allocation::Prefix("10.0.3.0/24".parse().unwrap())
        );
    }
}
