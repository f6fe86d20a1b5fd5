//! The size limits and shapes of every field of the CRDs, in one place.
//!
//! A real API server estimates the cost of the CRDs' CEL rules from these limits and refuses a
//! CRD whose rules could cost too much on an unbounded input; it also refuses objects that break
//! them. The schema attributes in this module's siblings read these constants, and
//! `validation` checks objects against the generated schemas, so a file that `kipam validate`
//! accepts is one a real server accepts too. `docs/resources.md` lists every bound and why.

/// A DNS-1123 label: pool names, datacenter names, namespaces, addon names (Kubernetes' own
/// limit for a label, a namespace and a label value).
pub const MAX_LABEL: u32 = 63;
/// A DNS-1123 subdomain: Secret names (Kubernetes' limit for most object names).
pub const MAX_SUBDOMAIN: u32 = 253;
/// A cluster name: its namespace `cluster-<name>` must still be a 63-character label.
pub const MAX_CLUSTER_NAME: u32 = MAX_LABEL - CLUSTER_NAMESPACE_PREFIX.len() as u32;
/// What kipam puts in front of a cluster name to name its namespace.
pub const CLUSTER_NAMESPACE_PREFIX: &str = "cluster-";
/// A Secret key (Kubernetes: at most 253 characters of `[-._a-zA-Z0-9]`).
pub const MAX_SECRET_KEY: u32 = 253;

/// A CIDR: the longest IPv6 address written in full (39 characters) and `/128`.
pub const MAX_CIDR: u32 = 43;
/// An address, a CIDR or a range `first-last`: two full IPv6 addresses and a dash.
pub const MAX_ADDRESS_RANGE: u32 = 79;

/// Datacenters in one pool (and usage entries in its status).
pub const MAX_DATACENTERS: u32 = 256;
/// Entries in `excludeRanges` and in `excludePrefixes`, each.
pub const MAX_EXCLUSIONS: u32 = 1024;
/// Entries in a pool datacenter's `additionalCidrs`: with `poolCidr`, at most 16 CIDRs.
pub const MAX_ADDITIONAL_CIDRS: u32 = 15;
/// Networks a layout record remembers for its pool datacenter (`spec.networks`): every CIDR
/// the pool datacenter has had, those inside another listed one left out.
pub const MAX_LAYOUT_NETWORKS: u32 = 64;
/// Per-pool overrides in one `Cluster.spec.ipam`.
pub const MAX_OVERRIDES: u32 = 256;
/// Pieces in a pinned `addresses` override.
pub const MAX_OVERRIDE_PIECES: u32 = 256;
/// Pieces in one `IPAMAllocation.spec.addresses`: a `range` allocation grows by appending
/// pieces, so this is far above what a fragmented pool produces.
pub const MAX_ALLOCATION_PIECES: u32 = 4096;
/// `allocationRange` (addresses per cluster): the largest integer a JSON number holds exactly
/// (2^53), as clients in other languages read it.
pub const MAX_ALLOCATION_RANGE: i64 = 1 << 53;
/// Clusters one `IPAMPoolRecord` lists: a cluster name and an IPv4 range take about 60 bytes,
/// so a record of ordinary names stays well inside etcd's 1.5 MiB; kipam also refuses to write
/// a record over 1,000,000 bytes.
pub const MAX_RECORD_ENTRIES: u32 = 15_000;
/// Prefix lengths: 0 to 128 (IPv6); the pool's family narrows it further in validation.
pub const MAX_PREFIX_LENGTH: i32 = 128;

/// Conditions in one status.
pub const MAX_CONDITIONS: u32 = 32;
/// Lines (reasons, hand-made pools, conflicts) in a Cluster's `status.adoption`.
pub const MAX_ADOPTION_LINES: u32 = 64;
/// One such line, or a `namespace/name`.
pub const MAX_ADOPTION_LINE: u32 = 1024;
/// Addresses listed in `status.adoption.served`.
pub const MAX_ADOPTION_ADDRESSES: u32 = 512;
/// A condition `type` (Kubernetes `metav1.Condition`: 316, a qualified name).
pub const MAX_CONDITION_TYPE: u32 = 316;
/// A condition `reason` (Kubernetes `metav1.Condition`: 1024).
pub const MAX_CONDITION_REASON: u32 = 1024;
/// A human-readable message (Kubernetes `metav1.Condition`: 32768).
pub const MAX_MESSAGE: u32 = 32768;
/// An RFC 3339 timestamp (`2026-01-02T03:04:05.123456789+01:00` is 35).
pub const MAX_TIMESTAMP: u32 = 64;
/// A duration such as `reuseAfter` (`10m`, `1h30m`, `90d`).
pub const MAX_DURATION: u32 = 32;
/// The longest `reuseAfter`: 90 days.
pub const MAX_REUSE_AFTER_SECONDS: u64 = 90 * 24 * 3600;
/// `reuseAfter`, read by [`crate::duration::parse`]: from 0 to 90 days.
pub const REUSE_AFTER: crate::duration::Bounds = crate::duration::Bounds {
    min: 0,
    max: MAX_REUSE_AFTER_SECONDS,
};
/// `growth.shrinkAfter`, read by [`crate::duration::parse`]: from 1 minute to 30 days.
pub const SHRINK_AFTER: crate::duration::Bounds = crate::duration::Bounds {
    min: 60,
    max: 30 * 24 * 3600,
};
/// An exact address count as a decimal string: 2^128 has 39 digits.
pub const MAX_COUNT_DIGITS: u32 = 39;

/// Keys in an Addon's free-form `variables`.
pub const MAX_VARIABLES: u32 = 256;
/// Objects one addon applies to a user cluster.
pub const MAX_APPLIED_OBJECTS: u32 = 1024;
/// `apiVersion`: a group (253), `/` and a version (63).
pub const MAX_API_VERSION: u32 = MAX_SUBDOMAIN + 1 + MAX_LABEL;
/// A kind name.
pub const MAX_KIND: u32 = 63;
/// The hash of the last applied manifests (a hex digest; 128 fits SHA-512).
pub const MAX_HASH: u32 = 128;

/// A DNS-1123 label, as Kubernetes checks it.
pub const PATTERN_DNS_LABEL: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";
/// A DNS-1123 subdomain, as Kubernetes checks it.
pub const PATTERN_DNS_SUBDOMAIN: &str =
    r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$";
/// A Secret key.
pub const PATTERN_SECRET_KEY: &str = "^[-._a-zA-Z0-9]+$";
/// The shape of a CIDR (`address/length`, spaces around allowed); the exact rules (a real
/// address, no host bits, a length the family allows) are checked by validation.
pub const PATTERN_CIDR: &str = "^ *[0-9A-Fa-f:.]+ */[0-9]{1,3} *$";
/// The shape of an address, a range `first-last` or a CIDR.
pub const PATTERN_ADDRESS_RANGE: &str = "^ *[0-9A-Fa-f:.]+ *(- *[0-9A-Fa-f:.]+ *|/[0-9]{1,3} *)?$";
/// A CamelCase condition reason (empty allowed: kipam's own conditions always set one).
pub const PATTERN_CONDITION_REASON: &str = "^([A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?)?$";
/// An exact address count.
pub const PATTERN_COUNT: &str = "^[0-9]+$";

/// One IP address: the longest text form of an IPv6 address (an IPv4-mapped one written in
/// full, `0000:0000:0000:0000:0000:ffff:255.255.255.255`) has 45 characters.
pub const MAX_ADDRESS: u32 = 45;
/// DNS servers of one pool datacenter's network (resolvers read at most 3; 8 leaves room).
pub const MAX_DNS_SERVERS: u32 = 8;
/// The highest 802.1Q VLAN ID (4095 is reserved).
pub const MAX_VLAN_ID: i32 = 4094;
/// The smallest MTU kipam accepts: the datagram size every IPv4 host must accept (RFC 791).
pub const MIN_MTU: i32 = 576;
/// The largest MTU kipam accepts: common jumbo frames.
pub const MAX_MTU: i32 = 9216;
/// The shape of one address (spaces around allowed); validation parses it.
pub const PATTERN_ADDRESS: &str = "^ *[0-9A-Fa-f:.]+ *$";

// Durations (`reuseAfter`, `growth.shrinkAfter`) have no schema pattern, only a length
// (`MAX_DURATION`): `crate::duration::parse` reads more forms than a pattern can say
// (`1h 30m`, `PT10M`), and the CRD must never refuse what kipam reads.
