//! pvp-t140: a gateway from T.140 real-time text over RTP (RFC 4103, RFC 2198 redundancy) to the
//! Pair Vibecoding Protocol.
//!
//! The protocol core is sans-IO: [`gateway::Gateway`] and the modules it drives ([`rtp`],
//! [`red`], [`stream`], [`index`], [`timers`], [`t140`], [`chunker`], [`pvp`]) take datagrams
//! and time as values and return envelopes. The IO shell ([`udp`], [`sink`], [`capture`],
//! [`replay`], [`clock`]) feeds it and carries its envelopes away.
//!
//! No `unsafe`: every byte of a datagram is parsed by bounds-checked code.

#![forbid(unsafe_code)]

// Sans-IO core.
pub mod admission;
pub mod budget;
pub mod chunker;
pub mod clamped;
pub mod gateway;
pub mod index;
pub mod mapping;
pub mod presence;
pub mod pvp;
pub mod red;
pub mod refused;
pub mod register;
pub mod rtcp;
pub mod rtp;
pub mod said;
pub mod send;
pub mod slab;
pub mod speaker;
pub mod stream;
pub mod t140;
pub mod time;
pub mod timers;
pub mod typed;

// IO shell.
pub mod capture;
pub mod clock;
pub mod config_file;
pub mod fdlimit;
pub mod handoff;
pub mod metrics;
pub mod recv;
pub mod replay;
pub mod sink;
pub mod udp;

pub use gateway::{Compat, Config, DropReason, Gateway, MixerMode, Stats};
pub use time::Time;
