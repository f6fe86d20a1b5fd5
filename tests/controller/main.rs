//! End-to-end tests of the real `kipam controller` binary against the in-process API stand-in
//! (`tests/standin`): ordering, exhaustion and recovery, lifecycle, crashes and two replicas,
//! and the README's walkthrough.

mod support;

mod addons;
mod addons_off;
mod adopt;
mod api;
mod capi;
mod chaos;
mod crashes;
mod discover;
mod get_ipa;
mod growth;
mod history;
mod lifecycle;
mod metallb;
mod metrics;
mod network;
mod preconditions;
mod promise;
mod quiet;
mod rbac;
mod records;
mod releases;
mod selfsigned;
mod serving;
mod spaces;
mod ui;
mod upgrade;
mod walkthrough;
mod webdriver;
mod webhook;
