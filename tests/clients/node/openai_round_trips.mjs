// Round trips with openai-node: every output kind, from every source, fed back as received and
// as a JSON.stringify round trip, over HTTP (JSON), SSE and the WebSocket (`ResponsesWS`, with
// the `ws` package): the continuation must complete. Run by tests/e2e/clients.rs against Envoy
// + the processor (WebSocket transport, a reasoning key) + the demo with its test triggers
// (tests/common/upstream.rs: `refuse` → a refusal, `think` → reasoning). The Python twin,
// tests/clients/python/openai_round_trips.py, says more. Every body and event is read for
// duplicate keys (_common.mjs).
import OpenAI from 'openai';
import { zodResponsesFunction } from 'openai/helpers/zod';
import { ResponsesWS } from 'openai/resources/responses/ws';
import { z } from 'zod';

import { MODEL, WEATHER_TOOL, main } from './_common.mjs';

const TERMINAL = new Set(['response.completed', 'response.failed', 'response.incomplete']);
const CUSTOM_TOOL = { type: 'custom', name: 'apply_patch_text', description: 'Applies a patch.' };

const KINDS = {
  message: { input: 'Say hi.', want: 'message' },
  refusal: { input: 'Please refuse this.', want: 'refusal' },
  function_call: { input: 'Weather in Paris?', tools: [WEATHER_TOOL], want: 'function_call' },
  custom_tool_call: { input: 'Patch it.', tools: [CUSTOM_TOOL], want: 'custom_tool_call' },
  reasoning: { input: 'Please think, then answer.', want: 'reasoning' },
  sealed_reasoning: { input: 'Please think, then answer.', include: ['reasoning.encrypted_content'], want: 'reasoning' },
  shell_call: { input: 'List the files.', tools: [{ type: 'shell' }], want: 'shell_call' },
  local_shell_call: { input: 'List the files.', tools: [{ type: 'local_shell' }], want: 'local_shell_call' },
  apply_patch_call: { input: 'Fix the typo.', tools: [{ type: 'apply_patch' }], want: 'apply_patch_call' },
  compaction_trigger: {
    input: [{ role: 'user', content: 'My name is Ada.' }, { type: 'compaction_trigger' }],
    want: 'compaction',
  },
};
const SOURCES = ['json', 'completed_event', 'item_done_events', 'stream_helper', 'parse'];
const DUMPS = {
  'as received': (o) => o,
  'JSON.stringify round trip': (o) => JSON.parse(JSON.stringify(o)),
};
const TRANSPORTS = ['http', 'sse', 'websocket'];

const weatherTool = zodResponsesFunction({
  name: 'get_weather',
  description: 'The current weather at a location.',
  parameters: z.object({ location: z.string() }),
});

function requestArgs(kind, source) {
  const spec = KINDS[kind];
  const args = { model: MODEL, input: spec.input, store: false };
  if (spec.tools) {
    // The SDK's helpers parse the arguments of zod tools (`parsed_arguments`).
    args.tools = kind === 'function_call' && ['stream_helper', 'parse'].includes(source) ? [weatherTool] : spec.tools;
  }
  if (spec.include) args.include = spec.include;
  return args;
}

async function outputOf(client, kind, source) {
  const args = requestArgs(kind, source);
  if (source === 'json') return (await client.responses.create(args)).output;
  if (source === 'completed_event' || source === 'item_done_events') {
    const items = [];
    let terminal = null;
    for await (const event of await client.responses.create({ ...args, stream: true })) {
      if (event.type === 'response.output_item.done') items.push(event.item);
      if (TERMINAL.has(event.type)) terminal = event.response;
    }
    if (!terminal) throw new Error('no terminal event');
    return source === 'completed_event' ? terminal.output : items;
  }
  if (source === 'stream_helper') {
    const stream = client.responses.stream(args);
    return (await stream.finalResponse()).output;
  }
  return (await client.responses.parse(args)).output;
}

function hasKind(items, want) {
  return items.some((i) =>
    want === 'refusal' ? i.type === 'message' && i.content.some((c) => c.type === 'refusal') : i.type === want,
  );
}

function answers(items) {
  const out = [];
  for (const item of items) {
    if (item.type === 'function_call') out.push({ type: 'function_call_output', call_id: item.call_id, output: 'sunny, 21 C' });
    if (item.type === 'custom_tool_call') out.push({ type: 'custom_tool_call_output', call_id: item.call_id, output: 'Done!' });
    if (item.type === 'shell_call') {
      out.push({
        type: 'shell_call_output',
        call_id: item.call_id,
        output: [{ stdout: 'a.txt\n', stderr: '', outcome: { type: 'exit', exit_code: 0 } }],
      });
    }
    if (item.type === 'local_shell_call') out.push({ type: 'local_shell_call_output', id: item.call_id, output: 'a.txt\n' });
    if (item.type === 'apply_patch_call') {
      out.push({ type: 'apply_patch_call_output', call_id: item.call_id, status: 'completed', output: 'Done!' });
    }
  }
  return out;
}

function continuationInput(kind, items, dump) {
  if (kind === 'compact') return [...items.map(dump), { role: 'user', content: 'Which number?' }];
  const first = KINDS[kind].input;
  const head = kind === 'compaction_trigger' ? [] : typeof first === 'string' ? [{ role: 'user', content: first }] : first;
  return [...head, ...items.map(dump), ...answers(items), { role: 'user', content: 'Continue.' }];
}

// The WebSocket: one connection for the whole run, its events read one response at a time.
class Socket {
  constructor(client) {
    this.rws = new ResponsesWS(client);
    this.events = this.rws.stream();
  }

  async create(args) {
    this.rws.send({ type: 'response.create', ...args });
    for (;;) {
      const { value, done } = await this.events.next();
      if (done) throw new Error('the WebSocket closed');
      if (value.type === 'error') throw new Error(`socket error: ${value.error?.message ?? value.error}`);
      if (value.type !== 'message') continue;
      const event = value.message;
      if (event.type === 'error') throw new Error(`error event: ${JSON.stringify(event.error ?? event)}`);
      if (TERMINAL.has(event.type)) {
        if (event.type !== 'response.completed') throw new Error(`terminal event ${event.type}`);
        return;
      }
    }
  }
}

async function continueOver(client, socket, transport, kind, input) {
  const spec = KINDS[kind] ?? {};
  const args = { model: MODEL, input, store: false };
  if (spec.tools) args.tools = spec.tools;
  if (spec.include) args.include = spec.include;
  if (transport === 'http') {
    const resp = await client.responses.create(args);
    if (resp.status !== 'completed') throw new Error(`status ${resp.status}`);
    return;
  }
  if (transport === 'sse') {
    let last = null;
    for await (const event of await client.responses.create({ ...args, stream: true })) last = event;
    if (last?.type !== 'response.completed') throw new Error(`terminal event ${last?.type}`);
    return;
  }
  await socket.create(args);
}

async function run() {
  const client = new OpenAI({ maxRetries: 0, timeout: 30_000 });
  const started = Date.now();
  const origins = [];
  for (const kind of Object.keys(KINDS)) {
    for (const source of SOURCES) {
      try {
        const items = await outputOf(client, kind, source);
        // The demo's messages never come before a call: each is the final answer.
        const phases = items.filter((i) => i.type === 'message').map((i) => i.phase);
        if (!hasKind(items, KINDS[kind].want)) {
          origins.push({ kind, source, why: `no ${KINDS[kind].want} item in ${JSON.stringify(items.map((i) => i.type))}` });
        } else if (phases.some((p) => p !== 'final_answer')) {
          origins.push({ kind, source, why: `message phase ${JSON.stringify(phases)}, not final_answer` });
        } else {
          origins.push({ kind, source, items });
        }
      } catch (e) {
        origins.push({ kind, source, why: String(e?.message ?? e).slice(0, 300) });
      }
    }
  }
  try {
    const compacted = await client.responses.compact({
      model: MODEL,
      input: [
        { role: 'user', content: 'My name is Ada.' },
        { role: 'user', content: 'Remember 42.' },
      ],
    });
    const ok = compacted.output.some((i) => i.type === 'compaction');
    origins.push(ok ? { kind: 'compact', source: 'compact()', items: compacted.output } : { kind: 'compact', source: 'compact()', why: 'no compaction item' });
  } catch (e) {
    origins.push({ kind: 'compact', source: 'compact()', why: String(e?.message ?? e).slice(0, 300) });
  }

  const socket = new Socket(client);
  const results = [];
  for (const { kind, source, items, why } of origins) {
    for (const [dumpName, dump] of Object.entries(DUMPS)) {
      for (const transport of TRANSPORTS) {
        const name = `${kind} | ${source} | ${dumpName} | ${transport}`;
        if (!items) {
          results.push({ name, ok: false, why: `source: ${why}` });
          continue;
        }
        try {
          await continueOver(client, socket, transport, kind, continuationInput(kind, items, dump));
          results.push({ name, ok: true });
        } catch (e) {
          results.push({ name, ok: false, why: String(e?.message ?? e).slice(0, 300) });
        }
      }
    }
  }
  socket.rws.close({ code: 1000, reason: 'done' });

  const failed = results.filter((r) => !r.ok);
  const groups = new Map();
  for (const r of failed) {
    const [kind, source, dumpName, transport] = r.name.split(' | ');
    const key = `${kind} | ${source}: ${r.why.slice(0, 160)}`;
    if (!groups.has(key)) groups.set(key, []);
    groups.get(key).push(`${dumpName}/${transport}`);
  }
  for (const [key, where] of groups) {
    const [origin, ...why] = key.split(': ');
    console.log(`FAILED ${origin}: ${where.length} round trips (${where.slice(0, 4).join(', ')}${where.length > 4 ? ', ...' : ''}): ${why.join(': ')}`);
  }
  console.log(
    `round trips: ${results.length} run, ${results.length - failed.length} passed, ${failed.length} failed ` +
      `(${((Date.now() - started) / 1000).toFixed(1)} s)`,
  );
  if (failed.length) throw new Error(`${failed.length} of ${results.length} round trips failed`);
}

await main(run);
