//! Placeholder until the hot-path benches land.
use criterion::{Criterion, criterion_group, criterion_main};

fn rtp_parse(c: &mut Criterion) {
    let mut d = Vec::new();
    pvp_t140::rtp::write_packet(&mut d, false, 98, 1, 1, 1, b"abc");
    c.bench_function("rtp_parse", |b| {
        b.iter(|| pvp_t140::rtp::RtpPacket::parse(std::hint::black_box(&d)).is_ok())
    });
}

criterion_group!(benches, rtp_parse);
criterion_main!(benches);
