//! Shared helpers for the integration tests.
#![allow(dead_code)]

pub mod frozen;
pub mod gateway_proc;
pub mod netem;
pub mod pvp_server;
pub mod sh_proc;
pub mod talk;
