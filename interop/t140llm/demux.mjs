#!/usr/bin/env node
// Drives t140llm's own receiver, T140StreamDemultiplexer.processPacket(), over
// the UDP datagrams of a pcap, to compare its output and throughput with
// pvp-t140's.  t140llm has no other receive path for RTP.
//
//   node demux.mjs CAPTURE.pcap [--port 5004] [--csrc] [--repeat N] [--quiet]
//
// --csrc     processPacket(buf, true): stream id from the first CSRC
// --repeat N feed the datagrams N times (throughput); text is printed once
// Reads classic pcap (not pcapng) with Ethernet, Linux SLL/SLL2, raw-IP or
// BSD-loopback framing, IPv4/IPv6, UDP only; no IP reassembly.

import fs from 'node:fs';
import t140llm from 't140llm';

function usage(msg) {
  if (msg) console.error(`demux.mjs: ${msg}`);
  console.error('usage: node demux.mjs CAPTURE.pcap [--port N] [--csrc] [--repeat N] [--quiet]');
  process.exit(2);
}

const args = process.argv.slice(2);
let file = null;
let port = 5004;
let useCsrc = false;
let repeat = 1;
let quiet = false;
for (let i = 0; i < args.length; i += 1) {
  const a = args[i];
  if (a === '--port') port = Number(args[++i]);
  else if (a === '--csrc') useCsrc = true;
  else if (a === '--repeat') repeat = Number(args[++i]);
  else if (a === '--quiet') quiet = true;
  else if (a.startsWith('-')) usage(`unknown argument ${a}`);
  else file = a;
}
if (!file) usage('no capture given');
if (!Number.isInteger(repeat) || repeat < 1) usage('--repeat needs a positive integer');

// ---- minimal pcap reader -----------------------------------------------------
function udpPayloads(buf) {
  const magic = buf.readUInt32LE(0);
  let le;
  if (magic === 0xa1b2c3d4 || magic === 0xa1b23c4d) le = true;
  else if (magic === 0xd4c3b2a1 || magic === 0x4d3cb2a1) le = false;
  else throw new Error('not a classic pcap file (pcapng is not supported here)');
  const u32 = (o) => (le ? buf.readUInt32LE(o) : buf.readUInt32BE(o));
  const linktype = u32(20) & 0x0fffffff;
  const out = [];
  let pos = 24;
  while (pos + 16 <= buf.length) {
    const incl = u32(pos + 8);
    const frame = buf.subarray(pos + 16, pos + 16 + incl);
    pos += 16 + incl;
    let ip;
    if (linktype === 1) { // Ethernet
      let off = 12;
      let et = frame.readUInt16BE(off);
      while (et === 0x8100 || et === 0x88a8) { off += 4; et = frame.readUInt16BE(off); }
      ip = frame.subarray(off + 2);
    } else if (linktype === 113) ip = frame.subarray(16); // SLL
    else if (linktype === 276) ip = frame.subarray(20); // SLL2
    else if (linktype === 101 || linktype === 12 || linktype === 14) ip = frame; // raw IP
    else if (linktype === 0) ip = frame.subarray(4); // BSD loopback
    else throw new Error(`unsupported link type ${linktype}`);
    let udp;
    if (ip[0] >> 4 === 4) {
      if (ip[9] !== 17) continue;
      udp = ip.subarray((ip[0] & 0x0f) * 4);
    } else if (ip[0] >> 4 === 6) {
      if (ip[6] !== 17) continue; // no extension-header walk
      udp = ip.subarray(40);
    } else continue;
    if (udp.readUInt16BE(2) !== port) continue;
    const len = udp.readUInt16BE(4);
    out.push(Buffer.from(udp.subarray(8, len)));
  }
  return out;
}

const datagrams = udpPayloads(fs.readFileSync(file));

// ---- t140llm's receiver ------------------------------------------------------
const texts = new Map();
const metadata = [];
let errors = 0;
let record = true;
const demux = new t140llm.T140StreamDemultiplexer();
demux.on('data', (ev) => {
  if (!record) return;
  if (ev.text !== undefined) texts.set(ev.streamId, (texts.get(ev.streamId) ?? '') + ev.text);
  if (ev.metadata !== undefined) metadata.push(ev);
});
// Without an 'error' listener an EventEmitter 'error' would throw.
demux.on('error', (e) => { errors += 1; if (record && !quiet) console.error('t140llm demux error:', e.message); });

const t0 = process.hrtime.bigint();
for (let r = 0; r < repeat; r += 1) {
  for (const d of datagrams) demux.processPacket(d, useCsrc);
  record = false;
}
const ns = Number(process.hrtime.bigint() - t0);

if (!quiet) {
  for (const [id, text] of texts) console.log(`${JSON.stringify(id)}: ${JSON.stringify(text)}`);
  for (const m of metadata) console.log(`metadata ${JSON.stringify(m)}`);
}
const n = datagrams.length * repeat;
console.error(`${n} datagrams (${datagrams.length} x ${repeat}) in ${(ns / 1e6).toFixed(1)} ms` +
  ` = ${n ? Math.round(n / (ns / 1e9)) : 0} datagrams/s; ${errors} errors`);
