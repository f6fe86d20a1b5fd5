//! The admission webhook in process: every rule through `decide`, and the HTTP front over TLS
//! (malformed reviews, content types, deadline, certificate reload).

mod config;
mod rules;
mod serving;
mod support;
