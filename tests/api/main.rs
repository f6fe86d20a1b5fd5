//! In-process tests of the REST API (`src/api/`): the router is driven with
//! `tower::ServiceExt::oneshot`, against a real controller `Context` whose pool cache is a
//! reflector on the API stand-in, which also answers the token and access reviews.

mod harness;

mod adoption;
mod auth;
mod limits;
mod network;
mod openapi;
mod page;
mod routes;
