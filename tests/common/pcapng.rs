//! A pcapng writer for capture tests: sections in either byte order, interface description,
//! enhanced and simple packet blocks, options, written byte by byte (pcapng, IETF draft).

#![allow(dead_code)]

/// pcapng writer in either byte order.
pub struct Ng {
    le: bool,
    /// The file so far.
    pub out: Vec<u8>,
}

impl Ng {
    pub fn new(le: bool) -> Self {
        let mut ng = Ng {
            le,
            out: Vec::new(),
        };
        let mut body = Vec::new();
        body.extend_from_slice(&ng.u32(0x1a2b_3c4d));
        body.extend_from_slice(&ng.u16(1));
        body.extend_from_slice(&ng.u16(0));
        body.extend_from_slice(&ng.u64(u64::MAX)); // section length unknown
        ng.block(0x0a0d_0d0a, &body);
        ng
    }
    pub fn u16(&self, v: u16) -> [u8; 2] {
        if self.le {
            v.to_le_bytes()
        } else {
            v.to_be_bytes()
        }
    }
    pub fn u32(&self, v: u32) -> [u8; 4] {
        if self.le {
            v.to_le_bytes()
        } else {
            v.to_be_bytes()
        }
    }
    pub fn u64(&self, v: u64) -> [u8; 8] {
        if self.le {
            v.to_le_bytes()
        } else {
            v.to_be_bytes()
        }
    }
    pub fn block(&mut self, kind: u32, body: &[u8]) {
        // Padded to 32 bits, as a block's body is.
        let mut body = body.to_vec();
        while !body.len().is_multiple_of(4) {
            body.push(0);
        }
        let len = (12 + body.len()) as u32;
        let (k, l) = (self.u32(kind), self.u32(len));
        self.out.extend_from_slice(&k);
        self.out.extend_from_slice(&l);
        self.out.extend_from_slice(&body);
        self.out.extend_from_slice(&l);
    }
    /// An option, padded to 32 bits.
    pub fn option(&self, code: u16, value: &[u8]) -> Vec<u8> {
        let mut o = Vec::new();
        o.extend_from_slice(&self.u16(code));
        o.extend_from_slice(&self.u16(value.len() as u16));
        o.extend_from_slice(value);
        while !o.len().is_multiple_of(4) {
            o.push(0);
        }
        o
    }
    /// Interface Description Block with the given options (opt_endofopt added).
    pub fn idb(&mut self, linktype: u16, options: &[Vec<u8>]) {
        let mut body = Vec::new();
        body.extend_from_slice(&self.u16(linktype));
        body.extend_from_slice(&self.u16(0));
        body.extend_from_slice(&self.u32(262_144));
        for o in options {
            body.extend_from_slice(o);
        }
        if !options.is_empty() {
            body.extend_from_slice(&self.option(0, &[]));
        }
        self.block(1, &body);
    }
    /// Enhanced Packet Block: `data` is what was captured, `origlen` the length on the wire.
    pub fn epb(&mut self, if_id: u32, units: u64, data: &[u8], origlen: usize) {
        let mut body = Vec::new();
        body.extend_from_slice(&self.u32(if_id));
        body.extend_from_slice(&self.u32((units >> 32) as u32));
        body.extend_from_slice(&self.u32(units as u32));
        body.extend_from_slice(&self.u32(data.len() as u32));
        body.extend_from_slice(&self.u32(origlen as u32));
        body.extend_from_slice(data);
        while body.len() % 4 != 0 {
            body.push(0);
        }
        self.block(6, &body);
    }
    /// Simple Packet Block: no interface id and no timestamp (interface 0's).
    pub fn spb(&mut self, data: &[u8]) {
        let mut body = Vec::new();
        body.extend_from_slice(&self.u32(data.len() as u32));
        body.extend_from_slice(data);
        self.block(3, &body);
    }
}
