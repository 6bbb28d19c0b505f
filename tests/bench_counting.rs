//! The tests of `benches/support/counting.rs`, the counting allocator of `benches/scale.rs`:
//! a `harness = false` bench runs only its `main`, so its allocator's tests run here. The
//! allocator is not installed in this binary; the tests call it directly.

#[path = "../benches/support/counting.rs"]
mod counting;
