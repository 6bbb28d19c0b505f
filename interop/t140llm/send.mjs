#!/usr/bin/env node
// Interop sender: drives the real public API of the npm package `t140llm`
// (pinned in package.json) to send T.140 text over RTP/UDP to a pvp-t140
// gateway.  No packet is built here: every datagram on the wire is produced by
// t140llm itself.  See ../../docs/t140llm.md for what those packets look like.
//
//   node send.mjs --host 127.0.0.1 --port 5004 --mode plain|red|multiplex|direct \
//                 --text "..." [options]
//
// Exit code 0 once t140llm has closed its transport; 2 on bad usage; 3 if
// sending did not complete in time.  By default the fed stream stays open
// until t140llm's pacer has sent all the text, because t140llm 0.0.19 loses
// the packet it sends at close (see --end-immediately).

import { PassThrough } from 'node:stream';
import dgram from 'node:dgram';
import { createRequire } from 'node:module';
import t140llm from 't140llm';

const require = createRequire(import.meta.url);
const T140LLM_VERSION = require('t140llm/package.json').version;

const USAGE = `usage: node send.mjs --host HOST --port PORT --mode plain|red|multiplex|direct --text TEXT [options]

modes (all use t140llm's own public API):
  plain      processAIStreamToRtp(...)                       PT 96, raw T.140
  red        processAIStreamToRtp(..., {redEnabled: true})  PT 98 RED (first packet PT 96)
  multiplex  createT140RtpMultiplexer(...).addStream(id, ...) streamId<0x1E>text, or CSRC with --csrc
  direct     processAIStreamToDirectSocket(..., {customTransport: <UDP>, sendMetadataAsPackets: true})
             (unpaced; the only path that emits "MD:" metadata packets, see --metadata)

options:
  --red-generations N   RED redundancyLevel (default 2; t140llm's default is also 2)
  --stream-id NAME[,NAME...]  multiplex stream id(s) (default "llm"); each stream sends --text
  --csrc                multiplex: useCsrcForStreamId (CSRC 1,2,... instead of the text prefix)
  --with-red            multiplex: also enable RED (exposes t140llm's RED+multiplex behaviour)
  --metadata JSON       emit one metadata chunk {text:"", metadata: JSON} before the text
                        (sent on the wire as an "MD:" packet only in --mode direct)
  --fec                 enable t140llm's FEC packets (plain/red/multiplex)
  --fec-group N         fecGroupSize (t140llm default 5)
  --cps N               charRateLimit (t140llm default 30; 0 = default)
  --chunk N             feed the text to t140llm N graphemes at a time (default 3; 0 = all at once)
  --chunk-interval-ms N delay between fed chunks (default 100), simulating an LLM token stream
  --ssrc N --initial-seq N --initial-ts N --timestamp-increment N --payload-type N --red-pt N
                        override t140llm's RTP config (defaults: random, 0, 0, 160, 96, 98)
  --process-backspaces  set processBackspaces (note: 0.0.19 re-sends the whole text at end)
  --end-immediately     end the fed stream right after the last chunk (like an LLM stream that
                        finishes faster than 30 cps).  t140llm then flushes its whole remaining
                        queue in one unpaced packet and closes its socket in the same tick; with
                        t140llm's own UDP socket (Node >= 20) that last packet is silently DROPPED.
                        Default: keep the stream open until t140llm's pacer has drained the text.
  --custom-transport    plain/red/multiplex: give t140llm a RtpConfig.customTransport (a dgram
                        wrapper that closes only after in-flight sends complete) instead of
                        letting it open its own UDP socket; same bytes, nothing dropped at close
  --timeout-ms N        give up (exit 3) if not complete after N ms (default: computed)
  -v, --verbose         log progress to stderr
t140llm version: ${T140LLM_VERSION}`;

function parseArgs(argv) {
  const o = {
    host: '127.0.0.1', port: 5004, mode: 'plain', text: null,
    redGenerations: 2, streamIds: ['llm'], csrc: false, withRed: false,
    metadata: null, fec: false, fecGroup: undefined, cps: 0, chunk: 3,
    chunkIntervalMs: 100, ssrc: undefined, initialSeq: undefined,
    initialTs: undefined, tsIncrement: undefined, payloadType: undefined,
    redPt: undefined, processBackspaces: false, timeoutMs: 0, verbose: false,
    endImmediately: false, customTransport: false,
  };
  const num = (name, v) => {
    const n = Number(v);
    if (v === undefined || !Number.isInteger(n) || n < 0) usage(`${name} needs a non-negative integer`);
    return n;
  };
  for (let i = 0; i < argv.length; i += 1) {
    const a = argv[i];
    const next = () => {
      if (i + 1 >= argv.length) usage(`${a} needs a value`);
      i += 1;
      return argv[i];
    };
    switch (a) {
      case '--host': o.host = next(); break;
      case '--port': o.port = num(a, next()); break;
      case '--mode': o.mode = next(); break;
      case '--text': o.text = next(); break;
      case '--red-generations': o.redGenerations = num(a, next()); break;
      case '--stream-id': o.streamIds = next().split(',').filter((s) => s.length > 0); break;
      case '--csrc': o.csrc = true; break;
      case '--with-red': o.withRed = true; break;
      case '--metadata':
        try { o.metadata = JSON.parse(next()); } catch (e) { usage(`--metadata: ${e.message}`); }
        break;
      case '--fec': o.fec = true; break;
      case '--fec-group': o.fecGroup = num(a, next()); break;
      case '--cps': o.cps = num(a, next()); break;
      case '--chunk': o.chunk = num(a, next()); break;
      case '--chunk-interval-ms': o.chunkIntervalMs = num(a, next()); break;
      case '--ssrc': o.ssrc = num(a, next()); break;
      case '--initial-seq': o.initialSeq = num(a, next()); break;
      case '--initial-ts': o.initialTs = num(a, next()); break;
      case '--timestamp-increment': o.tsIncrement = num(a, next()); break;
      case '--payload-type': o.payloadType = num(a, next()); break;
      case '--red-pt': o.redPt = num(a, next()); break;
      case '--process-backspaces': o.processBackspaces = true; break;
      case '--timeout-ms': o.timeoutMs = num(a, next()); break;
      case '--end-immediately': o.endImmediately = true; break;
      case '--custom-transport': o.customTransport = true; break;
      case '-v': case '--verbose': o.verbose = true; break;
      case '-h': case '--help': console.log(USAGE); process.exit(0); break;
      default: usage(`unknown argument ${a}`);
    }
  }
  if (o.text === null) usage('--text is required');
  if (!['plain', 'red', 'multiplex', 'direct'].includes(o.mode)) usage(`bad --mode ${o.mode}`);
  if (o.streamIds.length === 0) usage('--stream-id needs at least one name');
  if (o.port < 1 || o.port > 65535) usage('--port out of range');
  if (o.redGenerations < 1) usage('--red-generations must be at least 1');
  return o;
}

function usage(msg) {
  if (msg) console.error(`send.mjs: ${msg}`);
  console.error(USAGE);
  process.exit(2);
}

const opts = parseArgs(process.argv.slice(2));
const log = (...a) => { if (opts.verbose) console.error('[send.mjs]', ...a); };

// ---- the text source: an object-mode stream, like an LLM SDK's token stream --
const segmenter = new Intl.Segmenter('en', { granularity: 'grapheme' });
const GRAPHEMES = Array.from(segmenter.segment(opts.text), (s) => s.segment);
const CPS = opts.cps || 30; // t140llm's DEFAULT_CHAR_RATE_LIMIT
const STARTED = Date.now();

// When the pacer has certainly let out `total` UTF-16 code units.  t140llm's
// token bucket starts full at CPS, refills CPS/s, ticks every 100 ms (one
// packet per tick and stream), sizes packets in graphemes but charges the
// bucket text.length (UTF-16 units), so non-BMP text drains slower.
function drainedAt(total, streams) {
  const paced = Math.max(0, total - CPS);
  // rounding (floor per stream per tick) costs at most `streams` chars a tick
  const perTick = Math.max(1, CPS / 10 - (streams - 1));
  return STARTED + Math.ceil(paced / perTick) * 100 + 400;
}

function makeFeed(totalForDrain, streams) {
  const feed = new PassThrough({ objectMode: true });
  const chunks = [];
  if (opts.chunk === 0) {
    if (GRAPHEMES.length) chunks.push(GRAPHEMES.join(''));
  } else {
    for (let i = 0; i < GRAPHEMES.length; i += opts.chunk) {
      chunks.push(GRAPHEMES.slice(i, i + opts.chunk).join(''));
    }
  }
  const items = [];
  // `text: ''` keeps t140llm's extractTextFromChunk from turning the object
  // into the string "[object Object]" (its toString() fallback).
  if (opts.metadata !== null) items.push({ text: '', metadata: opts.metadata });
  for (const c of chunks) items.push(c);
  let i = 0;
  const finish = () => {
    // at least 2.5 pacer ticks after the last write, and late enough for the
    // token bucket to have let everything out
    const wait = opts.endImmediately || opts.mode === 'direct'
      ? 0 : Math.max(250, drainedAt(totalForDrain, streams) - Date.now());
    if (wait > 0) {
      log(`feed complete; keeping the stream open ${wait} ms so t140llm's pacer drains it`);
      setTimeout(() => feed.end(), wait);
    } else {
      feed.end();
    }
  };
  const step = () => {
    if (i >= items.length) { finish(); return; }
    feed.write(items[i]);
    i += 1;
    if (i >= items.length) setImmediate(step);
    else if (opts.chunkIntervalMs > 0) setTimeout(step, opts.chunkIntervalMs);
    else setImmediate(step);
  };
  setImmediate(step);
  return { feed, chunkCount: items.length };
}

function rtpConfig() {
  const c = {};
  if (opts.ssrc !== undefined) c.ssrc = opts.ssrc;
  if (opts.initialSeq !== undefined) c.initialSequenceNumber = opts.initialSeq;
  if (opts.initialTs !== undefined) c.initialTimestamp = opts.initialTs;
  if (opts.tsIncrement !== undefined) c.timestampIncrement = opts.tsIncrement;
  if (opts.payloadType !== undefined) c.payloadType = opts.payloadType;
  if (opts.redPt !== undefined) c.redPayloadType = opts.redPt;
  if (opts.cps) c.charRateLimit = opts.cps;
  if (opts.fec) {
    c.fecEnabled = true;
    if (opts.fecGroup !== undefined) c.fecGroupSize = opts.fecGroup;
  }
  if (opts.processBackspaces) c.processBackspaces = true;
  return c;
}

// ---- completion ------------------------------------------------------------
let finished = false;
let packets = 0;
function onTransportClosed(what) {
  finished = true;
  log(`${what}: transport closed, sending complete` +
    (opts.customTransport || opts.mode === 'direct' ? ` (${packets} datagrams)` : ''));
}

function watchdog(chunkCount, total, streams) {
  const ms = opts.timeoutMs ||
    (5000 + chunkCount * opts.chunkIntervalMs + Math.max(0, drainedAt(total, streams) - STARTED) * 2);
  setTimeout(() => {
    console.error(`send.mjs: sending not complete after ${ms} ms`);
    process.exit(3);
  }, ms).unref();
}

process.on('exit', (code) => {
  if (code === 0 && !finished) {
    console.error('send.mjs: event loop drained but t140llm never closed its transport');
    process.exitCode = 3;
  }
});

// A TransportStream ({send(buf, cb), close()}, t140llm's public custom
// transport interface) over UDP whose close() waits for in-flight sends.
function udpCustomTransport(what) {
  const sock = dgram.createSocket('udp4');
  let inFlight = 0;
  let closing = false;
  const maybeClose = () => {
    if (closing && inFlight === 0 && !finished) {
      sock.close(() => onTransportClosed(what));
    }
  };
  return {
    send(packet, cb) {
      inFlight += 1;
      packets += 1;
      sock.send(packet, opts.port, opts.host, (err) => {
        inFlight -= 1;
        if (err) console.error('udp send error:', err.message);
        if (cb) cb(err ?? undefined);
        maybeClose();
      });
    },
    close() { closing = true; maybeClose(); },
  };
}

// Learn when t140llm closes the UDP socket it opened itself.  `udpSocket` is
// not in t140llm's typings; it is read here only to observe the close.
function watchOwnSocket(transport, what) {
  if (opts.customTransport) return;
  const sock = transport.udpSocket;
  if (sock) sock.once('close', () => onTransportClosed(what));
  else finished = true;
}

function runRtp(red) {
  const what = red ? 'red' : 'plain';
  const { feed, chunkCount } = makeFeed(opts.text.length, 1);
  const cfg = rtpConfig();
  if (red) {
    cfg.redEnabled = true;
    cfg.redundancyLevel = opts.redGenerations;
  }
  log(`processAIStreamToRtp(${opts.host}:${opts.port})`, JSON.stringify(cfg));
  if (opts.customTransport) cfg.customTransport = udpCustomTransport(what);
  // processAIStreamToRtp closes the transport itself when the feed ends.
  const transport = t140llm.processAIStreamToRtp(feed, opts.host, opts.port, cfg);
  transport.on('error', (e) => console.error('t140llm error:', e.message ?? e));
  watchOwnSocket(transport, what);
  watchdog(chunkCount, opts.text.length, 1);
}

function runMultiplex() {
  const cfg = { ...rtpConfig(), multiplexEnabled: true };
  if (opts.csrc) cfg.useCsrcForStreamId = true;
  if (opts.withRed) {
    cfg.redEnabled = true;
    cfg.redundancyLevel = opts.redGenerations;
  }
  log(`createT140RtpMultiplexer(${opts.host}:${opts.port})`, JSON.stringify(cfg));
  if (opts.customTransport) cfg.customTransport = udpCustomTransport('multiplex');
  const mux = t140llm.createT140RtpMultiplexer(opts.host, opts.port, cfg);
  mux.on('error', (e) => console.error('t140llm error:', e.message ?? e));
  mux.on('streamError', ({ streamId, error }) => console.error(`t140llm stream ${streamId} error:`, error));
  const n = opts.streamIds.length;
  const total = opts.text.length * n;
  const pending = new Set(opts.streamIds);
  let chunks = 0;
  // The multiplexer never closes itself: close it once every stream has ended
  // (removeStream() has then already flushed that stream's queue).
  mux.on('streamRemoved', (id) => {
    log(`stream ${id} removed`);
    pending.delete(id);
    if (pending.size === 0) {
      watchOwnSocket(mux.getTransport(), 'multiplex');
      mux.close();
    }
  });
  for (const id of opts.streamIds) {
    const { feed, chunkCount } = makeFeed(total, n);
    chunks = Math.max(chunks, chunkCount);
    if (!t140llm.addAIStreamToMultiplexer(mux, id, feed)) usage(`duplicate --stream-id ${id}`);
  }
  watchdog(chunks, total, n);
}

function runDirect() {
  // processAIStreamToDirectSocket normally writes to a unix socket; its public
  // `customTransport` option lets it go to UDP.  This path is unpaced: one
  // packet per fed chunk.
  const { feed, chunkCount } = makeFeed(opts.text.length, 1);
  const cfg = { ...rtpConfig(), sendMetadataAsPackets: true };
  log('processAIStreamToDirectSocket(customTransport=udp)', JSON.stringify(cfg));
  cfg.customTransport = udpCustomTransport('direct');
  t140llm.processAIStreamToDirectSocket(feed, undefined, cfg);
  watchdog(chunkCount, 0, 1);
}

log(`t140llm ${T140LLM_VERSION}, mode ${opts.mode}`);
if (opts.mode === 'plain') runRtp(false);
else if (opts.mode === 'red') runRtp(true);
else if (opts.mode === 'multiplex') runMultiplex();
else runDirect();
